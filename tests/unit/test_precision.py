"""Training precision (issue #23): catalog, resolution, plan JSON, closed form and simulator, each checked
against the published byte accounting (Megatron-LM "Distributed Optimizer" table) and spec-sheet peaks."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.plan import Plan, Stage, plan_from_dict, plan_to_dict, validate_plan
from memx.domain.precision import MEGATRON_FLAGS, resolve_precision
from memx.planner.cost import AnalyticStageModel, dp_step_ms, static_bytes_per_param
from memx.planner.space import enumerate_layouts
from memx.simulator.physics import Device, GRAD_BYTES_OF
from memx.simulator.stage import StageSignature, stage_cost
from memx.simulator.traits import load_traits


def test_catalog_precisions_follow_the_spec_sheets():
    for name in ("v100-16g", "v100-32g", "t4-16g"):
        assert load_gpu(name).precisions == ("fp16",)  # Volta / Turing: fp16 tensor cores, no bf16
    for name in ("h100-80g", "h200-141g", "h800-80g", "mi300x-192g"):
        g = load_gpu(name)
        assert "fp8" in g.precisions and g.peak_tflops("fp8") == pytest.approx(2 * g.peak_tflops("bf16"), rel=0.01)
    assert load_gpu("a100-80g").precisions == ("bf16", "fp16")
    with pytest.raises(KeyError, match="v100-16g has no bf16"):
        load_gpu("v100-16g").peak_tflops("bf16")


def test_auto_is_the_best_precision_every_gpu_has():
    v100, a100, h100 = load_gpu("v100-32g"), load_gpu("a100-80g"), load_gpu("h100-80g")
    assert resolve_precision("auto", [a100, v100]) == "fp16"  # a mixed V100 + A100 plan trains in fp16
    assert resolve_precision("auto", [a100, h100]) == "bf16"
    assert resolve_precision("auto", [h100]) == "bf16"  # fp8 only when asked for
    assert resolve_precision("fp8", [h100]) == "fp8"
    with pytest.raises(InputError, match=r"GPU a100-80g cannot run; it has bf16, fp16"):
        resolve_precision("fp8", [h100, a100])


def test_search_layouts_carry_the_resolved_precision():
    cluster, model, space = load_cluster("a100-v100-16"), load_model("llama2-7b"), load_search("small")
    layouts = enumerate_layouts(cluster, model, space)
    assert layouts and {lay.precision for lay in layouts} == {"fp16"}
    assert {c.precision for c in layouts[0].contexts()} == {"fp16"}
    with pytest.raises(InputError, match="v100-32g cannot run; it has fp16"):
        enumerate_layouts(cluster, model, dataclasses.replace(space, precision="bf16"))
    # with subsets allowed, the A100-only layouts train in bf16
    some = enumerate_layouts(cluster, model, dataclasses.replace(space, use_all_gpus=False))
    assert {lay.precision for lay in some if set(lay.stage_gpus) == {"a100-80g"}} == {"bf16"}


def _plan(precision: str = "bf16") -> Plan:
    return Plan(model="llama2-7b", cluster="a100-v100-16", global_batch=16, micro_batch=1, seq_len=4096, dp=1,
                stages=(Stage(gpu="a100-80g", tp=4, layers=32),), precision=precision)


def test_plan_json_writes_precision_only_when_not_bf16():
    assert "precision" not in plan_to_dict(_plan())  # older files re-serialise unchanged
    d = plan_to_dict(_plan("fp16"))
    assert d["precision"] == "fp16" and plan_from_dict(d) == _plan("fp16")
    assert plan_from_dict({k: v for k, v in d.items() if k != "precision"}).precision == "bf16"
    with pytest.raises(InputError, match=r"p.json: field 'precision' must be one of bf16, fp16, fp8, got 'fp4'"):
        plan_from_dict({**d, "precision": "fp4"}, "p.json")
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    v100 = dataclasses.replace(_plan(), stages=(Stage(gpu="v100-32g", tp=4, layers=32),))
    with pytest.raises(InputError, match="v100-32g .*cannot run; it has fp16"):
        validate_plan(v100, cluster, model)
    validate_plan(dataclasses.replace(v100, precision="fp16"), cluster, model)


def test_closed_form_bytes_per_param_follow_megatrons_table():
    assert static_bytes_per_param(False, 1, "bf16") == 18 and static_bytes_per_param(False, 1, "fp16") == 20
    assert static_bytes_per_param(True, 8, "fp16") == pytest.approx(4 + 16 / 8)
    assert static_bytes_per_param(True, 8, "fp8") == pytest.approx(6 + 12 / 8)
    # fp16 all-reduces its fp16 grads: half the fp32 main grads' ring volume
    assert float(dp_step_ms(1e9, 8, 100.0, False, "fp16")) == pytest.approx(float(dp_step_ms(1e9, 8, 100.0)) / 2)


def _sig(gpu: str, **kw) -> dict:
    return dict(gpu=gpu, tp=1, layers=2, micro_batch=2, seq_len=4096, recompute="none", recompute_layers=None,
                first=False, last=False, inflight=1, hidden=8192, ffn_hidden=28672, heads=64, query_groups=8,
                vocab=32000, mlp="swiglu", **kw)


def test_closed_form_follows_the_precision_column():
    h100 = load_gpu("h100-80g")
    model = AnalyticStageModel(gpus={h100.name: h100})
    rows = pd.DataFrame([_sig("h100-80g", precision=p) for p in ("bf16", "fp16", "fp8")])
    rows["recompute_layers"] = rows["recompute_layers"].astype("Int64")
    out = model.predict(rows)
    t, static = out["time_ms"].to_numpy(), out["static_mem_mib"].to_numpy()
    assert static[1] / static[0] == pytest.approx(20 / 18) and static[2] == pytest.approx(static[0])
    assert t[1] == pytest.approx(t[0]) and t[2] < 0.8 * t[0]  # fp8 linears at twice the peak
    no_column = model.predict(rows.drop(columns="precision").iloc[:1])
    assert no_column["time_ms"].iloc[0] == pytest.approx(t[0])  # older frames mean bf16


def test_simulator_follows_the_precision_independently():
    h100, v100 = load_gpu("h100-80g"), load_gpu("v100-16g")
    base = StageSignature(**_sig("h100-80g"))
    costs = {p: stage_cost(dataclasses.replace(base, precision=p), h100, load_traits("h100-80g"))
             for p in ("bf16", "fp16", "fp8")}
    assert costs["fp16"].static_mem_mib / costs["bf16"].static_mem_mib == pytest.approx(20 / 18)
    assert costs["fp8"].time_ms < 0.85 * costs["bf16"].time_ms
    assert GRAD_BYTES_OF["fp16"] * 2 == GRAD_BYTES_OF["bf16"]
    with pytest.raises(InputError, match="v100-16g cannot run; it has fp16"):
        Device.of(v100, load_traits("v100-16g"), "fp8")
    # a signature without a precision (bf16, as records meant) runs a V100 in its own 16-bit mode
    assert Device.of(v100, load_traits("v100-16g")).linear_peak_flop_per_ms == 125e9


def test_megatron_flags_per_precision():
    assert MEGATRON_FLAGS["bf16"] == ("--bf16",)
    assert MEGATRON_FLAGS["fp16"][0] == "--fp16" and "--initial-loss-scale" in MEGATRON_FLAGS["fp16"]
    fp8 = MEGATRON_FLAGS["fp8"]
    assert fp8 == ("--bf16", "--fp8-format", "hybrid")
