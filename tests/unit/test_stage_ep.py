"""An expert-parallel size per stage in a per-stage-dp plan (issue #27, session 15; FlagScale's per-mesh ep,
memx.domain.stage_dp.stage_eps): each stage's all-to-all, expert dp and expert memory follow its own ep, in the
closed form (memx.planner.stage_dp) and, independently, on the virtual cluster (memx.simulator.stage_dp); the plan
file, validation, the FlagScale meshes, the notation and the per-stage-dp search carry it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.plan import plan_from_dict, plan_from_json, plan_to_dict, plan_to_json, validate_plan
from memx.domain.stage_dp import stage_eps
from memx.planner import stage_dp
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.stage_dp_search import layouts
from memx.report.flagscale import flagscale_config
from memx.report.notation import dp_text
from memx.simulator import simulate_plan


def _plan(eps: tuple[int, int], dps: tuple[int, int] = (4, 2), tps: tuple[int, int] = (2, 4), **kw):
    stages = [{"gpu": "h100-80g", "tp": tps[0], "layers": 12, "data_parallel": dps[0]},
              {"gpu": "h20-96g", "tp": tps[1], "layers": 12, "data_parallel": dps[1], "expert_parallel": eps[1]}]
    return plan_from_dict({"model": "qwen1.5-moe-a2.7b", "cluster": "h100-h20-16", "global_batch": 64,
                           "micro_batch": 1, "seq_len": 4096, "dp": dps[0], "sequence_parallel": True,
                           "distributed_optimizer": True, "expert_parallel": eps[0], "stages": stages, **kw})


@pytest.fixture(scope="module")
def env():
    cluster, model = load_cluster("h100-h20-16"), load_model("qwen1.5-moe-a2.7b")
    return cluster, model, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")


def test_plan_file_carries_a_stage_ep_and_older_files_load_unchanged():
    plan = _plan((4, 2))
    assert stage_eps(plan) == (4, 2) and plan.stages[1].expert_parallel == 2
    assert plan_from_json(plan_to_json(plan)) == plan
    assert "expert_parallel" not in plan_to_dict(plan)["stages"][0]
    same = _plan((2, 2))
    assert stage_eps(same) == (2, 2)


def test_contexts_follow_each_stages_ep(env):
    cluster, model, _ = env
    ctxs = stage_dp.plan_stage_contexts(_plan((4, 2)), cluster, model)
    assert [c.expert_parallel for c in ctxs] == [4, 2] and [c.expert_dp for c in ctxs] == [1, 1]
    assert all(c.a2a_gbps > 0 for c in ctxs)


@pytest.mark.parametrize(("eps", "tps"), [((4, 2), (2, 4)), ((2, 2), (2, 4)), ((4, 2), (1, 4))])
def test_closed_form_tracks_the_virtual_cluster(env, eps, tps):
    """Each side on its own (memx.planner.stage_dp, memx.simulator.stage_dp): within 10 % of the other."""
    cluster, model, pred = env
    plan = _plan(eps, dps=(8 // tps[0], 8 // tps[1]), tps=tps)
    validate_plan(plan, cluster, model)
    est, run = estimate_plans([plan], cluster, model, pred)[0], simulate_plan(plan, cluster, model, seed=1)
    assert not run.oom
    assert est.iteration_time_ms == pytest.approx(run.iteration_time_ms, rel=0.10)
    assert max(est.peak_mem_mib) == pytest.approx(max(run.peak_mem_mib), rel=0.10)


def test_a_larger_stage_ep_holds_fewer_experts_on_both_sides(env):
    cluster, model, pred = env
    two, four = _plan((2, 2)), _plan((4, 2))
    e2, e4 = estimate_plans([two, four], cluster, model, pred)
    r2, r4 = (simulate_plan(p, cluster, model, seed=1) for p in (two, four))
    assert e4.stage_peak_mib[0] < e2.stage_peak_mib[0] and e4.stage_peak_mib[1] == pytest.approx(e2.stage_peak_mib[1])
    h100 = slice(0, 8)  # per GPU, stage-major: stage 0's 2 × 4 GPUs first
    assert max(r4.peak_mem_mib[h100]) < max(r2.peak_mem_mib[h100])


@pytest.mark.parametrize(("raw", "expected"), [
    ({"stages": [{"gpu": "h100-80g", "tp": 4, "layers": 12}, {"gpu": "h20-96g", "tp": 4, "layers": 12,
                                                                 "expert_parallel": 4}], "dp": 2, "expert_parallel": 2},
     "stages[1].expert_parallel differ from field 'expert_parallel' (2) in a plan without a per-stage"),
    ({"stages": [{"gpu": "h100-80g", "tp": 2, "layers": 12, "data_parallel": 4},
                 {"gpu": "h20-96g", "tp": 4, "layers": 12, "data_parallel": 2, "expert_parallel": 1}], "dp": 4,
      "expert_parallel": 4},
     "expert_parallel per stage [4, 1]: every stage's must be 1 or none may be"),
    ({"stages": [{"gpu": "h100-80g", "tp": 2, "layers": 12, "data_parallel": 4, "expert_parallel": 2},
                 {"gpu": "h20-96g", "tp": 4, "layers": 12, "data_parallel": 2}], "dp": 4, "expert_parallel": 4},
     "stages[0].expert_parallel (2) must equal field 'expert_parallel' (4)"),
    ({"stages": [{"gpu": "h100-80g", "tp": 2, "layers": 12, "data_parallel": 4},
                 {"gpu": "h20-96g", "tp": 4, "layers": 12, "data_parallel": 2, "expert_parallel": 4}], "dp": 4,
      "expert_parallel": 4},
     "stages[1].expert_parallel (4) does not divide stages[1].data_parallel × context_parallel (2 × 1)"),
    ({"stages": [{"gpu": "h100-80g", "tp": 2, "layers": 12, "data_parallel": 4},
                 {"gpu": "h20-96g", "tp": 8, "layers": 12, "data_parallel": 1, "expert_parallel": 8}], "dp": 4,
      "expert_parallel": 4},
     "stages[1].expert_parallel (8) does not divide num_experts (60)"),
])
def test_bad_stage_eps_are_refused_naming_the_stage(env, raw, expected):
    cluster, model, _ = env
    base = {"model": "qwen1.5-moe-a2.7b", "cluster": "h100-h20-16", "global_batch": 64, "micro_batch": 1,
            "seq_len": 4096, "sequence_parallel": True, "distributed_optimizer": True}
    with pytest.raises(InputError, match=re.escape(expected)):
        validate_plan(plan_from_dict({**base, **raw}), cluster, model)


def test_flagscale_meshes_and_the_notation_carry_each_ep(env):
    cluster, model, _ = env
    plan = _plan((4, 2))
    system = flagscale_config(plan, model, cluster)["train"]["system"]
    assert system["hetero"]["hetero_process_meshes"] == [2, 1, 4, 4, 1, 4, 1, 2, 2, 1]
    assert system["expert_model_parallel_size"] == 4  # the first mesh's, as FlagScale reads the job's
    assert dp_text(plan_to_dict(plan)) == "4/2 (ep 4/2)"


def test_the_per_stage_dp_search_enumerates_an_ep_per_mesh(env):
    """Every combination of expert_parallel_options values dividing each mesh's dp · cp, all > 1 or all 1."""
    cluster, model, _ = env
    space = dataclasses.replace(load_search("moe"), stage_data_parallel=True)
    combos = {tuple(stage_eps(p)) for p in layouts(cluster, model, space)}
    mixed = {c for c in combos if len(set(c)) > 1}
    assert mixed and all(1 not in c for c in mixed)
    assert any(len(set(c)) == 1 and c[0] > 1 for c in combos) and any(set(c) == {1} for c in combos)
