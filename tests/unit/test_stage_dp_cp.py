"""A per-stage dp with tied embeddings and with context parallelism (issue #27; memx.domain.stage_dp,
memx.planner.stage_dp, memx.simulator.stage_dp / step_sync, docs/planner.md §Data parallel per stage): FlagScale's
embedding groups, the closed form and the virtual cluster each against the uniform machinery they generalise (one
dp for every stage) and against each other, the search's layouts under each launcher."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.plan import plan_from_dict, validate_plan
from memx.domain.stage_dp import embedding_groups, place_stage_groups, stage_groups
from memx.planner import stage_dp
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import _predict_stages, estimate_plans
from memx.planner.network import achieved
from memx.planner.predictions import params_per_rank
from memx.planner.schedule import IDENTITY_ASSEMBLY
from memx.planner.stage_dp_search import layouts
from memx.report.flagscale import flagscale_problems
from memx.report.notation import dp_text
from memx.simulator import simulate_plan
from memx.simulator.schedule import _traits_for, one_f1b_order, stage_signatures
from memx.simulator.stage import ADAM_STATIC_BYTES_PER_PARAM
from memx.simulator.stage_dp import simulate_meshes

TIED = {"model": "gpt-neo-2.7b", "cluster": "a100-v100-16", "global_batch": 64, "micro_batch": 1, "seq_len": 2048,
        "dp": 2, "precision": "fp16",
        "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none"},
                   {"gpu": "v100-32g", "tp": 2, "layers": 10, "recompute": "full"},
                   {"gpu": "v100-32g", "tp": 2, "layers": 10, "recompute": "full"}]}


def _with_dps(d: dict, *dps: int, **changes) -> dict:
    return {**d, **changes, "stages": [dict(s, data_parallel=k) for s, k in zip(d["stages"], dps)]}


@pytest.fixture(scope="module")
def env():
    cluster, model = load_cluster("a100-v100-16"), load_model("gpt-neo-2.7b")
    return cluster, model, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


@pytest.mark.parametrize("dps,do,groups", [
    ((2, 2, 2), False, [(0, 0, 1.0), (1, 1, 1.0)]),  # Megatron's: one group per pipeline
    ((2, 2, 1), False, [(0, 0, 1.0), (1, 0, 1.0)]),  # the last rank sits in both first ranks' groups
    ((2, 1, 2), False, [(0, 0, 1.0), (0, 1, 1.0), (1, 0, 1.0), (1, 1, 1.0)]),  # paths through the dp-1 stage
    ((2, 2, 1), True, [(0, 0, 0.5), (1, 0, 0.5)]),  # partial reduce: each its own optimizer shard's rows
    ((1, 2, 2), True, [(0, 0, 0.5), (0, 1, 0.5)]),
])
def test_embedding_groups_follow_flagscales_pipeline_paths(dps, do, groups):
    plan = plan_from_dict(_with_dps(TIED, *dps, dp=dps[0], distributed_optimizer=do))
    got = embedding_groups(plan)
    assert got == groups
    if do and dps[0] != dps[-1]:  # both ends of a group reduce the same rows: 1 / (dp_own · groups_own)
        for f, last, share in got:
            assert share == pytest.approx(1 / (dps[-1] * sum(1 for _, x, _ in got if x == last)))


def _stage_dp_path(plan, cluster, model, pred):
    cluster = achieved(cluster, pred)  # as estimate_plans sees the NICs (memx.planner.network)
    ctxs, layers, p = _predict_stages([plan], model, pred, cluster)
    params = np.array([params_per_rank(c, np.asarray(n), model) for c, n in zip(ctxs, layers)])
    return stage_dp.assemble(plan, cluster, model, p["time_ms"], p["peak_mem_mib"], p["static_mem_mib"], params, 1.0,
                             IDENTITY_ASSEMBLY)


@pytest.mark.parametrize("cp,do", [(1, False), (2, True)])
def test_one_dp_with_tied_embeddings_and_cp_is_the_uniform_assembly(env, cp, do):
    """Given one dp for every stage, the per-stage-dp assembly charges the tied embedding's all-reduce and the cp
    ring exactly as the uniform assembly does (memx.planner.collectives.tied_embedding_ms, context_parallel)."""
    cluster, model, pred = env
    plan = plan_from_dict({**TIED, "dp": 2 // cp, "context_parallel": cp, "distributed_optimizer": do})
    ref, got = estimate_plans([plan], cluster, model, pred)[0], _stage_dp_path(plan, cluster, model, pred)
    assert got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=1e-12)
    assert got.max_mem_mib == ref.max_mem_mib
    where = place_stage_groups(plan, cluster)
    assert stage_dp.embedding_ms(cluster, plan, model, where) > 0.0
    assert stage_dp.embedding_ms(cluster, plan, load_model("llama2-7b"), where) == 0.0  # untied: none


@pytest.mark.parametrize("cp", [1, 2])
def test_virtual_cluster_meshes_match_its_replicas_with_tied_embeddings_and_cp(env, cp):
    cluster, model, _ = env
    plan = plan_from_dict({**TIED, "dp": 2 // cp, "context_parallel": cp})
    ref = simulate_plan(plan, cluster, model, seed=3)
    tr = _traits_for({s.gpu for s in plan.stages}, None, None)
    got = simulate_meshes(plan, cluster, model, stage_signatures(plan, model), tr, ADAM_STATIC_BYTES_PER_PARAM, 3,
                          one_f1b_order)
    assert got.embedding_sync_ms == pytest.approx(ref.embedding_sync_ms, rel=1e-9) and got.embedding_sync_ms > 0
    assert got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=0.02)
    assert sorted(got.demand_mem_mib) == pytest.approx(sorted(ref.demand_mem_mib), rel=1e-12)


def test_chained_embedding_groups_cost_more_than_one_group(env):
    """dp (2, 1, 2): four groups whose blocking order makes a chain of three all-reduces; both models charge more
    than for (2, 2, 2)'s one per rank, the planner's within 10 % of the virtual cluster's whole iteration."""
    cluster, model, pred = env
    chained = plan_from_dict(_with_dps(TIED, 2, 1, 2))
    where = place_stage_groups(chained, cluster)
    one = stage_dp.embedding_ms(cluster, plan_from_dict(TIED), model, where)
    assert stage_dp.embedding_ms(cluster, chained, model, where) >= 3 * one  # 3 in a chain, on a link no faster
    run = simulate_plan(chained, cluster, model, seed=0)
    assert run.embedding_sync_ms > 2.5 * simulate_plan(plan_from_dict(TIED), cluster, model, seed=0).embedding_sync_ms
    est = estimate_plans([chained], cluster, model, pred)[0]
    assert est.iteration_time_ms == pytest.approx(run.iteration_time_ms, rel=0.10)


LLAMA_CP = {"model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 64, "micro_batch": 2, "seq_len": 4096,
            "dp": 1, "context_parallel": 2, "precision": "fp16",
            "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 1},
                       {"gpu": "v100-32g", "tp": 2, "layers": 10, "recompute": "full", "data_parallel": 2},
                       {"gpu": "v100-32g", "tp": 2, "layers": 10, "recompute": "full", "data_parallel": 1}]}


def test_cp_with_a_per_stage_dp_validates_and_the_two_models_agree():
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    plan = plan_from_dict(LLAMA_CP)
    validate_plan(plan, cluster, model)
    assert stage_groups(plan) == (2, 4, 2) and plan.gpus_per_type() == {"a100-80g": 4, "v100-32g": 12}
    est, run = estimate_plans([plan], cluster, model, pred)[0], simulate_plan(plan, cluster, model, seed=1)
    assert len(est.peak_mem_mib) == len(run.peak_mem_mib) == 16
    assert est.iteration_time_ms == pytest.approx(run.iteration_time_ms, rel=0.10)
    assert max(est.peak_mem_mib) == pytest.approx(max(run.peak_mem_mib), rel=0.10)
    no_cp = plan_from_dict(_with_dps(LLAMA_CP, 2, 4, 2, dp=2, context_parallel=1))  # same GPUs, s tokens per rank
    assert max(estimate_plans([no_cp], cluster, model, pred)[0].peak_mem_mib) > max(est.peak_mem_mib)
    assert any("context parallelism" in p for p in flagscale_problems(plan, model))  # FlagScale cannot start it
    assert dp_text(LLAMA_CP) == "1/2/1·cp2"
    with pytest.raises(InputError, match=r"'virtual_stages' \(2\) with a per-stage data_parallel"):
        validate_plan(dataclasses.replace(plan, virtual_stages=2), cluster, model)


def test_layouts_take_cp_where_the_launcher_starts_it():
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    space = dataclasses.replace(load_search("default"), stage_data_parallel=True, context_parallel_options=(1, 2))
    cps = {p.context_parallel for p in layouts(cluster, model, space)}
    assert cps == {1, 2}
    for p in layouts(cluster, model, space):
        if p.context_parallel > 1:
            assert p.gpus_per_type() == {"a100-80g": 4, "v100-32g": 12}  # use_all_gpus: tp · dp · cp · stages
            break
    flag = dataclasses.replace(space, launcher="flagscale")
    assert {p.context_parallel for p in layouts(cluster, model, flag)} == {1}  # ParallelContext asserts cp == 1
