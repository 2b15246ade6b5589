"""The analytic model against Korthikanti et al. 2022 (A100-80GB, Megatron-LM), read in place from
../shared/realdata/papers. Tolerances are stated per check."""

import pandas as pd
import pytest

from memx.planner.cost import (
    AnalyticStageModel,
    BYTES_PER_PARAM_STATIC,
    layer_activation_bytes,
    layer_activation_bytes_tp_only,
    layer_input_bytes,
    layer_params,
    static_bytes_per_param,
)
from memx.domain.specs import GpuType

A100 = GpuType(name="a100-80g", vendor="nvidia", memory_gib=80, peak_tflops_bf16=312, memory_bandwidth_gbps=2039,
               intra_node_bandwidth_gbps=300)
GIB = 2**30


def _configs(realdata):
    return pd.read_csv(realdata / "papers" / "korthikanti2022_table3_configs.csv").set_index("model")


def test_fig1_activation_memory(realdata):
    """Fig. 1: activations per GPU, TP only vs sequence parallel + selective. Exact formulas: ±2%."""
    fig1 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig1_memory_per_gpu_gib.csv")
    cfg = _configs(realdata)
    for _, row in fig1.iterrows():
        c = cfg.loc[row["model"]]
        s, b, h, a, t, L = c["seq"], c["microbatch"], c["hidden"], c["heads"], c["tp"], c["layers"]
        # The first pipeline stage holds pp micro batches of L/pp layers: L layers' worth; with v
        # interleaved stages, × (1 + (p − 1)/(p·v)) (Korthikanti 2022 §4.2.3).
        p, v = c["pp"], c["interleave_stages"]
        layers_held = L * (1 + (p - 1) / (p * v)) if v > 1 else L
        if row["mode"] == "tp_only_no_recompute":
            per_layer = layer_activation_bytes_tp_only(b, s, h, a, t)
        else:  # seqpar + selective: 34·sbh/t
            per_layer = layer_activation_bytes(b, s, h, 4 * h, a, a, "gelu", t) - 5 * a * s * s * b / t
        got = per_layer * layers_held / GIB
        assert got == pytest.approx(row["activations_GiB"], rel=0.02), row["model"]


def test_fig1_weights_and_optimizer_state(realdata):
    """Fig. 1 params+grads+optimizer per GPU (a middle pipeline stage when pp > 1, so no embedding)
    vs our 18 B/param: within 3% (values read off a chart). The paper's runs keep these replicated (no
    distributed optimizer); with it at dp 16 the same accounting is 6 + 12/16 = 6.75 B/param, 37.5 % of
    the published figure (Megatron-LM dist_optimizer docs table; issue #14)."""
    fig1 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig1_memory_per_gpu_gib.csv").drop_duplicates("model")
    cfg = _configs(realdata)
    for _, row in fig1.iterrows():
        c = cfg.loc[row["model"]]
        params = (layer_params(c["hidden"], 4 * c["hidden"], c["heads"], c["heads"], "gelu") * c["layers"] / c["pp"]
                  + (c["vocab"] * c["hidden"] if c["pp"] == 1 else 0)) / c["tp"]
        assert params * BYTES_PER_PARAM_STATIC / GIB == pytest.approx(row["params_grads_optimizer_GiB"], rel=0.03)
        do16 = params * static_bytes_per_param(True, 16) / GIB
        assert do16 == pytest.approx(row["params_grads_optimizer_GiB"] * 6.75 / 18, rel=0.03)


def test_fig7_relative_activation_memory(realdata):
    """Fig. 7: selective+seqpar keeps 16–20% and full recompute 7.6–9.4% of the baseline
    activations; our formulas within 1.5 percentage points."""
    fig7 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig7_relative_activation_pct.csv").set_index("model")
    cfg = _configs(realdata)
    for model in ("22B", "175B", "530B"):
        c = cfg.loc[model]
        s, b, h, a, t = c["seq"], c["microbatch"], c["hidden"], c["heads"], c["tp"]
        base = layer_activation_bytes_tp_only(b, s, h, a, t)
        seqsel = layer_activation_bytes(b, s, h, 4 * h, a, a, "gelu", t) - 5 * a * s * s * b / t
        full = layer_input_bytes(b, s, h, 1)  # Fig. 7 has no sequence parallelism: input replicated
        assert 100 * seqsel / base == pytest.approx(fig7.loc[model, "seqpar+selective"], abs=1.5)
        assert 100 * full / base == pytest.approx(fig7.loc[model, "full"], abs=1.5)


def test_table4_recompute_time_overheads(realdata):
    """Table 4 (22B layer, A100): full recompute +39%, selective +7% over no recompute. The analytic
    model has full at +33% of FLOPs plus repeated TP all-reduces; we accept ±8 points for full and
    ±5 points for selective, and the absolute layer time within 35% (the model assumes 50% MFU).
    This checks the flat closed form (runtime="none"); the runtime-aware one is checked against the same
    table in test_closed_form_published.py (eager attention, as in the paper)."""
    t4 = pd.read_csv(realdata / "papers" / "korthikanti2022_table4_layer_time_22B.csv")
    c = _configs(realdata).loc["22B"]
    model = AnalyticStageModel(gpus={"a100-80g": A100}, runtime="none")
    rows = []
    for rc in ("none", "full", "selective"):
        rows.append(dict(gpu="a100-80g", tp=int(c["tp"]), layers=1, micro_batch=int(c["microbatch"]), seq_len=int(c["seq"]),
                         recompute=rc, recompute_layers=pd.NA, first=False, last=False, inflight=1,
                         hidden=int(c["hidden"]), ffn_hidden=4 * int(c["hidden"]), heads=int(c["heads"]),
                         query_groups=int(c["heads"]), vocab=int(c["vocab"]), mlp="gelu"))
    df = pd.DataFrame(rows)
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    t = model.predict(df)["time_ms"].to_numpy()
    measured = t4.set_index("experiment")["combined_ms"]
    base = measured["baseline no recompute"]
    assert t[1] / t[0] - 1 == pytest.approx(measured["baseline with full recompute"] / base - 1, abs=0.08)
    assert t[2] / t[0] - 1 == pytest.approx(measured["selective recompute"] / base - 1, abs=0.05)
    assert t[0] == pytest.approx(base, rel=0.35)
