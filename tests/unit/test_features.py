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
    feature_matrix,
    gpu_arrays,
    memory_bases,
    signature_arrays,
    time_bases,
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
    assert X.dtype == np.float32 and X.flags["C_CONTIGUOUS"] and X.shape == (2, len(FEATURE_NAMES))
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
