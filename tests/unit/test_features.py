"""Stage-signature features: numbers only (GPU spec sheet, not names), float32 C-contiguous, and the
physical bases of the calibrated prior are linear in layers / recomputed layers / in-flight micro batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memx.planner.cost import AnalyticStageModel
from memx.domain.catalog import load_gpu
from memx.learn.features import (
    FEATURE_NAMES,
    MOE_FEATURES,
    feature_matrix,
    gpu_arrays,
    memory_bases,
    signature_arrays,
    time_bases,
    without_distributed_optimizer,
)


def _sigs(**over) -> pd.DataFrame:
    row = dict(gpu="a100-80g", tp=2, layers=4, micro_batch=2, seq_len=2048, recompute="none", recompute_layers=None,
               first=False, last=False, inflight=2, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32,
               vocab=32000, mlp="swiglu")
    df = pd.DataFrame([{**row, **over}])
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    return df


@pytest.fixture(scope="module")
def gpus():
    return {g: load_gpu(g) for g in ("a100-80g", "vendor-b-32g")}


def test_feature_matrix_is_float32_c_contiguous_with_gpu_specs_as_numbers(gpus):
    sigs = pd.concat([_sigs(), _sigs(gpu="vendor-b-32g", recompute="full", recompute_layers=2)], ignore_index=True)
    a, g = signature_arrays(sigs), gpu_arrays(sigs["gpu"].to_numpy(), gpus)
    an = AnalyticStageModel(gpus=gpus).predict(sigs)
    X = feature_matrix(a, g, an, an["time_ms"].to_numpy(), an["peak_mem_mib"].to_numpy())
    dense = len(FEATURE_NAMES) - len(MOE_FEATURES)  # a dense predictor's matrix: no MoE features (issue #27)
    assert X.dtype == np.float32 and X.flags["C_CONTIGUOUS"] and X.shape == (2, dense)
    col = dict(zip(FEATURE_NAMES, X.T))
    assert col["peak_tflops_bf16"].tolist() == [312.0, 200.0]
    assert col["memory_gib"].tolist() == [80.0, 32.0]
    assert col["recompute_fraction"].tolist() == [0.0, 0.5]  # block: 2 of 4 layers
    assert col["log_analytic_time_ms"][0] == pytest.approx(np.log(an["time_ms"].iloc[0]), rel=1e-6)


def test_unknown_gpu_names_the_gpu(gpus):
    with pytest.raises(KeyError, match="h100"):
        gpu_arrays(np.array(["h100-80g"]), gpus)


def test_bases_are_additive_in_layers_and_recomputed_layers(gpus):
    def bases(**kw):
        a = signature_arrays(_sigs(**kw))
        return time_bases(a, gpu_arrays(np.array(["a100-80g"]), gpus))[0], memory_bases(a)[0]

    t2, m2 = bases(layers=2)
    t4, m4 = bases(layers=4)
    t6, m6 = bases(layers=6)
    assert np.allclose(t6 - t4, t4 - t2) and np.allclose(m6 - m4, m4 - m2)
    tf, _ = bases(layers=4, recompute="full")
    tb, _ = bases(layers=4, recompute="full", recompute_layers=2)
    assert np.allclose(tb - t4, (tf - t4) / 2)  # block recompute of 2 of 4 layers costs half of full
    _, m_in1 = bases(inflight=1)
    _, m_in3 = bases(inflight=3)
    assert np.allclose(m_in3 - m4, m4 - m_in1)  # memory terms linear in in-flight micro batches


def test_sequence_parallelism_is_a_feature_and_shards_the_sbh_terms(gpus):
    """Korthikanti 2022 §4.2.2: with SP the s·b·h activations are divided by tp; no effect at tp 1."""
    off, on = signature_arrays(_sigs(tp=4)), signature_arrays(_sigs(tp=4, sequence_parallel=True))
    assert off["sp"][0] == 0.0 and on["sp"][0] == 1.0
    assert signature_arrays(_sigs(tp=1, sequence_parallel=True))["sp"][0] == 0.0
    m_off, m_on = memory_bases(off)[0], memory_bases(on)[0]
    assert m_on[2] == pytest.approx(m_off[2] / 4)  # the replicated (LayerNorm/dropout/input) term
    assert m_on[3] == m_off[3] and m_on[1] == m_off[1]  # QKV (already sharded) and static: unchanged
    g = gpu_arrays(np.array(["a100-80g"]), gpus)
    t_off, t_on = time_bases(off, g)[0], time_bases(on, g)[0]
    assert t_on[7] == t_off[7] and t_on[8] == 2 * t_off[8]  # same ring volume, twice the collectives
    an = AnalyticStageModel(gpus=gpus).predict(_sigs(tp=4, sequence_parallel=True))
    X = feature_matrix(on, g, an, an["time_ms"].to_numpy(), an["peak_mem_mib"].to_numpy())
    assert dict(zip(FEATURE_NAMES, X.T))["sequence_parallel"].tolist() == [1.0]


def test_static_basis_follows_the_distributed_optimizer():
    """memx.planner.cost.static_bytes_per_param: 18 B/param, 6 + 12/dp with the distributed optimizer."""
    plain = memory_bases(signature_arrays(_sigs()))[0][1]
    do4 = memory_bases(signature_arrays(_sigs(distributed_optimizer=True, dp=4)))[0][1]
    do1 = memory_bases(signature_arrays(_sigs(distributed_optimizer=True, dp=1)))[0][1]
    assert do4 == pytest.approx(plain * (6 + 12 / 4) / 18) and do1 == pytest.approx(plain)
    assert plain == pytest.approx(memory_bases(without_distributed_optimizer(signature_arrays(
        _sigs(distributed_optimizer=True, dp=4))))[0][1])
