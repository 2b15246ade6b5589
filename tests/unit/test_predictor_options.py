"""Stages with an option the profiles never had (issue #16; docs/predictor.md §Options the profiles did not
cover): a predictor trained on sequence-parallel stages only (the default search profiles what it searches,
Megatron-LM's --sequence-parallel) predicts plans without it — Megatron-LM's default, what users' measured
runs often are — from the seen setting × the closed form's ratio, scored against the simulator."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.learn import fit_predictor
from memx.learn.model import from_json
from memx.profiling import profile
from memx.report.evaluate import evaluate
from memx.simulator import sample_plans


@pytest.fixture(scope="module")
def sp_only():
    cl, mo, sp = load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")
    runs = profile(cl, mo, sp, backend="simulated", seed=0).stage_runs
    runs = runs[(runs["tp"] == 1) | runs["sequence_parallel"].astype(bool)]  # what the default search profiles
    pred = fit_predictor(runs, {g.name: g for g in cl.gpu_types}, seed=0)
    off = sample_plans(cl, mo, sp, n=120, seed=5)  # sequence parallelism off (the sampler's default)
    return cl, mo, pred, off


# ~10 s with its fixture (three GPU types profiled, a predictor trained): `make test-all`; the same transfer
# (the seen setting × the closed form's ratio, memx.learn.transfer) stays in the default set via
# tests/unit/test_context_parallel_learned.py's sequence-length transfer.
@pytest.mark.slow
def test_plans_without_sequence_parallelism_from_profiles_with_it(sp_only):
    cl, mo, pred, off = sp_only
    assert pred.sequence_parallel_seen == (True,)
    res = evaluate(cl, mo, off, pred, "default")
    before = evaluate(cl, mo, off, dataclasses.replace(pred, sequence_parallel_seen=()), "default")
    print("transferred", res["time_mape"], res["mem_mape"], "extrapolated", before["time_mape"], before["mem_mape"])
    assert res["n"] >= 30 and res["time_mape"] < 0.05 and res["time_mape"] < 0.5 * before["time_mape"]
    assert res["mem_mape"] < 0.05 and res["mem_mape"] < 0.5 * before["mem_mape"]
    again = from_json(pred.to_json(), pred.booster)
    assert again.sequence_parallel_seen == (True,) and again.version == pred.version
