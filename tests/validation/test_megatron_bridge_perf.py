"""The runtime-aware closed form against the Megatron-Bridge performance summary (issue #27: published full-size
interleaved-pipeline numbers): Llama 3 70B pre-training on 64 DGX-H100 GPUs, FP8, tp 4 × pp 8 with 5 virtual stages
per rank, as NVIDIA's NeMo releases 25.11–26.04.01 measured it (data/megatron_bridge_perf.yaml, transcribed from
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at the commit it names; docs/validation.md
§Megatron-Bridge performance summary). Each config is predicted as the recipe's plan on a DGX cluster
(memx.planner.estimate) against the iteration time of the median release.

Measured (session 18; bench/megatron_golden.py prints it): +3.7 % (global batch 256, releases 19.7–20.2 s) and
+3.8 % (global batch 128), the catalog counting every TP collective exposed; the recipe overlaps them (user buffers),
and with none exposed the errors are −3.9 / −3.7 %. The bound, 8 %, is that with a little slack; it fails on a
regression of the interleaved schedule, the FP8 GEMM time or the distributed optimizer's step at this scale.
"""

from __future__ import annotations

import pytest

pytest.importorskip("yaml")

import megatron_cases as mg  # noqa: E402  (same folder: pytest puts it on sys.path)

BOUND = 0.08


@pytest.fixture(scope="module")
def data():
    if not mg.BRIDGE_DATA.is_file():
        pytest.skip(f"{mg.BRIDGE_DATA} not present")
    return mg.load_data(mg.BRIDGE_DATA)


@pytest.fixture(scope="module")
def cases(data):
    return mg.bridge_perf_cases(data)


def test_data_names_its_source(data, cases):
    src = data["source"]
    assert src["repo"] == "NVIDIA-NeMo/Megatron-Bridge" and len(src["commit"]) == 40
    assert len(cases) == 2
    for c in cases:
        lo, hi = c["spread"]
        assert 0 < lo <= c["iteration_time_s"] <= hi, c["case"]


def test_cases_are_the_recipe_plan(cases):
    """The plan each case becomes is the recipe's: interleaved 5 chunks per rank, FP8, dp 2, no recomputation."""
    for c in cases:
        plan, cluster, model, _ = mg.case_inputs(c)
        assert plan.virtual_stages == 5 and plan.precision == "fp8" and plan.dp == 2, c["case"]
        assert [s.layers for s in plan.stages] == [10] * 8 and all(s.recompute.value == "none" for s in plan.stages)
        assert plan.distributed_optimizer and plan.sequence_parallel
        assert model.layers == 80 and model.query_groups == 8 and cluster.total_gpus == 64


def test_iteration_time_within_bound(cases):
    rows = mg.evaluate_time(cases)
    errors = {case: pred / meas - 1 for case, _, _, pred, meas in rows}
    assert all(abs(e) <= BOUND for e in errors.values()), errors


def test_bf16_would_be_far_off(cases):
    """The same plans predicted in bf16 miss by more than a third: the figure above rests on the FP8 GEMM time, not on
    a coincidence of the 16-bit terms."""
    bf16 = [dict(c, args={k: v for k, v in c["args"].items() if k != "fp8-format"}) for c in cases]
    for case, _, _, pred, meas in mg.evaluate_time(bf16):
        assert pred / meas - 1 > 0.33, case
