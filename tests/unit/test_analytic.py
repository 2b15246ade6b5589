"""Analytic stage model: parameter counts, FLOPs and activation memory against closed forms from
the papers (Narayanan 2021 §5.1, Korthikanti 2022 §4), and monotonicity of the predictions."""

import numpy as np
import pandas as pd
import pytest

from memx.planner.cost import (
    AnalyticStageModel,
    layer_activation_bytes,
    layer_forward_flops,
    layer_params,
    model_static_bytes,
)
from memx.domain.catalog import load_cluster, load_model
from support.signatures import stage_row


def test_llama2_7b_has_6_74b_parameters(conf_root):
    m = load_model("llama2-7b", conf_root)
    assert model_static_bytes(m) / 18 == pytest.approx(6.738e9, rel=1e-3)
    m70 = load_model("llama2-70b", conf_root)  # GQA with 8 groups
    assert model_static_bytes(m70) / 18 == pytest.approx(68.98e9, rel=5e-3)


def test_gpt_layer_flops_match_narayanan():
    # Narayanan 2021 §5.1: forward FLOPs of one GPT layer = 24·b·s·h²·(1 + s/(6h)).
    b, s, h = 4, 2048, 6144
    expected = 24 * b * s * h * h * (1 + s / (6 * h))
    got = layer_forward_flops(b, s, h, 4 * h, 64, 64, "gelu")
    assert got == pytest.approx(expected, rel=1e-12)
    assert layer_params(h, 4 * h, 64, 64, "gelu") == pytest.approx(12 * h * h, rel=1e-3)


def test_activation_bytes_match_korthikanti_eq4():
    # Korthikanti 2022 Eq. 4 (TP + sequence parallel): s·b·h·(34 + 5·a·s/h) / t.
    b, s, h, a, t = 4, 2048, 6144, 64, 8
    got = layer_activation_bytes(b, s, h, 4 * h, a, a, "gelu", t)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t)


def test_recompute_ladder_trades_time_for_memory(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    model = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types})
    rows = [stage_row(), stage_row(recompute="selective"), stage_row(recompute="full", recompute_layers=4), stage_row(recompute="full")]
    df = pd.DataFrame(rows)
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    p = model.predict(df)
    t, m = p["time_ms"].to_numpy(), p["peak_mem_mib"].to_numpy()
    assert t[0] < t[1] < t[3] and t[0] < t[2] < t[3]
    assert m[0] > m[1] and m[0] > m[2] > m[3]
    assert np.all(p["static_mem_mib"].to_numpy() == p["static_mem_mib"].iloc[0])


@pytest.mark.parametrize("runtime", ["none", "catalog"])
def test_more_layers_inflight_and_tp_behave(conf_root, runtime):
    c = load_cluster("three-vendor-20", conf_root)
    model = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types}, runtime=runtime)
    df = pd.DataFrame([stage_row(layers=4), stage_row(layers=8), stage_row(inflight=4), stage_row(tp=4), stage_row(last=True),
                       stage_row(layers=12)])
    p = model.predict(df)
    t, m = p["time_ms"].to_numpy(), p["peak_mem_mib"].to_numpy()
    if runtime == "none":
        assert t[1] == pytest.approx(2 * t[0], rel=1e-9)  # time additive in layers
    # time affine in layers: the runtime model adds a per-micro-batch p2p hop per stage, not per layer
    assert t[5] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
    assert m[1] > m[0] and m[2] > m[1] and m[3] < m[1]
    assert t[4] > t[1] and m[4] > m[1]  # output layer + loss on the last stage


def test_unknown_gpu_in_signature_is_an_error(conf_root):
    c = load_cluster("xy-2", conf_root)
    model = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types})
    with pytest.raises(KeyError, match="a100-80g"):
        model.predict(pd.DataFrame([stage_row()]))
