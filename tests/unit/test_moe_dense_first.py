"""A MoE model's dense-first layers (`moe_first_dense_layers`, DeepSeek's `first_k_dense_replace`) measured as the
dense layers they are (issue #27 session 5): the profile's points, what a learned predictor keeps of them, and the
planner taking those layers from the predictor instead of the closed form's MLP difference (memx.planner.moe)."""

from __future__ import annotations

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.moe_records import model_moe_fields
from memx.domain.plan import Plan, Stage
from memx.learn.experts import DENSE_LAYERS, measures_dense_layers, structures_seen
from memx.planner import moe
from memx.planner.estimate import estimate_plans
from memx.profiling.design import GpuAxes, dense_first_points

DEEPSEEK = load_model("deepseek-v2-lite")  # layer 0 dense (ffn 10944), then 26 MoE layers
EQ = moe.dense_equivalent(DEEPSEEK)


def _axes() -> GpuAxes:
    return GpuAxes(gpu="h100-80g", tps=(1, 2, 4), micro_batches=(1, 2), recompute=("none", "selective", "full"),
                   block=True, max_layers_by_tp={1: 10, 2: 20, 4: 27}, fit={(t, b, "none"): 8 for t in (1, 2, 4)
                                                                          for b in (1, 2)},
                   model_layers=27, max_inflight=4, seq_len=4096, default_tp=2, default_micro_batch=1,
                   default_layers=4, sequence_parallel=True, sp_options=(True,), eps=(1, 2, 4))


def test_dense_first_points_are_dense_layers_of_the_models_ffn_on_the_first_stage():
    pts = dense_first_points(_axes(), DEEPSEEK)
    assert pts and {p["ffn_hidden"] for p in pts} == {DEEPSEEK.ffn_hidden} != {EQ.ffn_hidden}
    assert all(p["first"] and p["layers"] == 1 and p["source"] == "design:dense_first" for p in pts)
    assert not any("expert_parallel" in p or "num_experts" in p for p in pts)  # dense rows: no expert columns
    assert {p["recompute"] for p in pts} == {"none", "selective", "full"} and {p["tp"] for p in pts} == {1, 2, 4}
    assert any(p["last"] for p in pts) and {p["inflight"] for p in pts} == {1, 4}
    assert dense_first_points(_axes(), load_model("mixtral-8x7b")) == []  # every layer MoE: nothing new


def test_a_learned_predictor_knows_the_dense_layers_it_was_trained_on():
    base = dict(gpu="h100-80g", tp=1, layers=1, micro_batch=1, seq_len=4096, recompute="none", first=True,
                last=False, inflight=1, hidden=EQ.hidden, heads=EQ.heads, query_groups=EQ.query_groups, vocab=EQ.vocab,
                mlp=EQ.mlp)
    moe_row = {**base, "ffn_hidden": EQ.ffn_hidden, **model_moe_fields(DEEPSEEK)}
    dense_row = {**base, "ffn_hidden": DEEPSEEK.ffn_hidden, "num_experts": 0}
    eq_row = {**base, "ffn_hidden": EQ.ffn_hidden, "num_experts": 0}  # the dense-equivalent design's rows
    without = structures_seen(pd.DataFrame([moe_row, eq_row]))
    with_dense = structures_seen(pd.DataFrame([moe_row, eq_row, dense_row]))
    assert not measures_dense_layers(without, DEEPSEEK) and DENSE_LAYERS not in next(iter(without.values()))
    assert measures_dense_layers(with_dense, DEEPSEEK)
    assert not measures_dense_layers(with_dense, load_model("mixtral-8x7b"))


class _Stub:
    """A stage predictor whose layers cost 1 (dense equivalent) or 3 (a dense layer of the model's ffn) ms each,
    10× that in MiB of peak and 5× in static MiB; it says whether it measured the dense layers, and records the
    rows it was asked for."""

    name = "stub"

    def __init__(self, measured: bool):
        self.measured, self.asked = measured, []

    def measures_dense_layers(self, model) -> bool:
        return self.measured

    def predict(self, sigs):
        self.asked.append(sigs.reset_index(drop=True))
        per = sigs["layers"] * sigs["ffn_hidden"].map(lambda f: 3.0 if f == DEEPSEEK.ffn_hidden else 1.0)
        return pd.DataFrame({"time_ms": per, "peak_mem_mib": 10.0 * per, "static_mem_mib": 5.0 * per}, index=sigs.index)


def test_the_planner_takes_measured_dense_layers_from_the_predictor_not_the_closed_form():
    cluster = load_cluster("h100-h20-16")
    st = (Stage(gpu="h100-80g", tp=2, layers=13), Stage(gpu="h20-96g", tp=2, layers=14))
    plan = Plan(model=DEEPSEEK.name, cluster=cluster.name, global_batch=16, micro_batch=1, seq_len=4096, dp=2,
                stages=st, sequence_parallel=True, expert_parallel=2)
    measured, closed = _Stub(True), _Stub(False)
    a, b = (estimate_plans([plan], cluster, DEEPSEEK, p)[0] for p in (measured, closed))
    # the closed form's MLP difference of the one dense layer (stage 0 only), which the measured path leaves out:
    # forward 2·b·s·h·3·Δf/tp FLOPs at MFU, ×3 with the backward (memx.planner.moe.time_delta_ms), b 1, tp 2
    peak = cluster.gpu("h100-80g").peak_tflops_bf16 * 1e9 * moe.MFU
    gap_ms = 3.0 * 2.0 * 4096 * DEEPSEEK.hidden * 3.0 * (DEEPSEEK.ffn_hidden - EQ.ffn_hidden) / 2 / peak
    assert a.stage_time_ms[1] == pytest.approx(b.stage_time_ms[1])  # no dense layer there
    assert a.stage_time_ms[0] - b.stage_time_ms[0] == pytest.approx((3.0 - 1.0) - gap_ms, rel=1e-6)
    asked = pd.concat(measured.asked)
    dense = asked[asked["ffn_hidden"] == DEEPSEEK.ffn_hidden]
    assert len(dense) == 1 and dense.iloc[0][["gpu", "layers", "first"]].tolist() == ["h100-80g", 1, True]
    assert not (pd.concat(closed.asked)["ffn_hidden"] == DEEPSEEK.ffn_hidden).any()
