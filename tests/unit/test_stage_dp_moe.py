"""A data-parallel degree per stage with a mixture-of-experts model (issue #27; ep 1: session 14, ep > 1: session 15;
memx.planner.stage_dp, memx.simulator.stage_dp): each stage's experts reduce over its own dp_s · cp / ep ranks, its
all-to-all over ep consecutive groups of its own. Each side against the uniform-dp machinery it generalises, the
closed form against the virtual cluster, and what is refused (an ep that does not divide a stage's dp_s · cp)."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError
from memx.domain.plan import plan_from_dict, plan_to_dict, validate_plan
from memx.planner import moe, stage_dp
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import _contexts, _predict_stages, estimate_plans
from memx.planner.network import achieved
from memx.planner.predictions import params_per_rank
from memx.planner.schedule import IDENTITY_ASSEMBLY
from memx.report.flagscale import flagscale_config
from memx.report.notation import dp_text
from memx.simulator import simulate_plan
from memx.simulator.schedule import _traits_for, one_f1b_order, stage_signatures
from memx.simulator.stage import ADAM_STATIC_BYTES_PER_PARAM
from memx.simulator.stage_dp import simulate_meshes

import numpy as np


def _plan(d0: int, d1: int, t0: int, t1: int, **kw):
    return plan_from_dict({"model": "qwen1.5-moe-a2.7b", "cluster": "h100-h20-16", "global_batch": 64,
                           "micro_batch": 2 // d0 if d0 <= 2 else 1, "seq_len": 4096, "dp": d0,
                           "sequence_parallel": True, "distributed_optimizer": True,
                           "stages": [{"gpu": "h100-80g", "tp": t0, "layers": 12, "data_parallel": d0},
                                      {"gpu": "h20-96g", "tp": t1, "layers": 12, "data_parallel": d1}], **kw})


@pytest.fixture(scope="module")
def env():
    cluster, model = load_cluster("h100-h20-16"), load_model("qwen1.5-moe-a2.7b")
    assert model.is_moe
    return cluster, model, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


@pytest.mark.parametrize("ep", [1, 2])
def test_stage_contexts_of_a_uniform_plan_are_the_uniform_ones(env, ep):
    """Each stage's expert dp group is its dp_s · cp / ep ranks and its all-to-all the uniform plan's: on one dp
    that is Megatron's dp · cp / ep on the replicas' links."""
    cluster, model, _ = env
    plan = _plan(2, 2, 4, 4, expert_parallel=ep)
    got = stage_dp.plan_stage_contexts(plan, cluster, model)
    assert got == _contexts(plan, model, cluster)
    assert [c.expert_dp for c in got] == [2 // ep] * 2 and all((c.a2a_gbps > 0.0) == (ep > 1) for c in got)


@pytest.mark.parametrize("ep", [1, 2])
def test_closed_form_reduces_to_the_uniform_assembly(env, ep):
    """The expert collective's latency joins the stage's tail as the uniform plan's tail_collectives_ms adds it."""
    cluster, model, pred = env
    plan = _plan(2, 2, 4, 4, expert_parallel=ep)
    ref = estimate_plans([plan], cluster, model, pred)[0]
    seen = achieved(cluster, pred)
    ctxs, layers, p = _predict_stages([plan], model, pred, seen)
    params = np.array([params_per_rank(c, np.asarray(n), model) for c, n in zip(ctxs, layers)])
    got = stage_dp.assemble(plan, seen, model, p["time_ms"], p["peak_mem_mib"], p["static_mem_mib"], params, 1.0,
                            IDENTITY_ASSEMBLY)
    assert got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=1e-12)
    assert got.max_mem_mib == ref.max_mem_mib


@pytest.mark.parametrize("ep", [1, 2])
def test_virtual_cluster_meshes_match_its_replicas_on_a_uniform_plan(env, ep):
    """The per-stage-dp schedule given one dp runs what the replica schedule runs, experts, router, all-to-all and
    expert-dp rings included (noise draws differ): within 2 %, the same memory to the MiB."""
    cluster, model, _ = env
    plan = _plan(2, 2, 4, 4, expert_parallel=ep)
    ref = simulate_plan(plan, cluster, model, seed=3)
    tr = _traits_for({s.gpu for s in plan.stages}, None, None)
    got = simulate_meshes(plan, cluster, model, stage_signatures(plan, model), tr, ADAM_STATIC_BYTES_PER_PARAM, 3,
                          one_f1b_order)
    assert not ref.oom and got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=0.02)
    assert sorted(got.demand_mem_mib) == pytest.approx(sorted(ref.demand_mem_mib), rel=1e-9)


@pytest.mark.parametrize("dps", [(2, 1, 4, 8), (4, 1, 2, 8), (1, 2, 8, 4), (4, 2, 2, 4, 2), (8, 2, 1, 4, 2)])
def test_closed_form_tracks_the_virtual_cluster_on_mixed_plans(env, dps):
    cluster, model, pred = env
    plan = _plan(*dps[:4], expert_parallel=dps[4] if len(dps) > 4 else 1)
    validate_plan(plan, cluster, model)
    est, run = estimate_plans([plan], cluster, model, pred)[0], simulate_plan(plan, cluster, model, seed=1)
    assert not run.oom
    assert est.iteration_time_ms == pytest.approx(run.iteration_time_ms, rel=0.10)
    assert max(est.peak_mem_mib) == pytest.approx(max(run.peak_mem_mib), rel=0.10)
    # ep 1: every expert on every rank; ep 2: half of them — either way more memory than the dense equivalent
    dense = estimate_plans([dataclasses.replace(plan, expert_parallel=1)], cluster, moe.dense_equivalent(model), pred)[0]
    assert all(a > b + 1024 for a, b in zip(est.stage_peak_mib, dense.stage_peak_mib))


def test_expert_parallel_halves_each_stages_experts_and_adds_its_all_to_all(env):
    """ep 2 against ep 1 on the same per-stage-dp plan, each side on its own: the closed form's and the virtual
    cluster's stage peaks both fall (half the experts per rank) and both charge an all-to-all."""
    cluster, model, pred = env
    one, two = (_plan(4, 2, 2, 4, expert_parallel=ep) for ep in (1, 2))
    e1, e2 = estimate_plans([one, two], cluster, model, pred)
    r1, r2 = (simulate_plan(p, cluster, model, seed=1) for p in (one, two))
    assert all(b < a for a, b in zip(e1.stage_peak_mib, e2.stage_peak_mib))
    assert max(r2.peak_mem_mib) < max(r1.peak_mem_mib)
    ctxs = stage_dp.plan_stage_contexts(two, cluster, model)
    assert [c.expert_dp for c in ctxs] == [2, 1] and all(c.a2a_gbps > 0 for c in ctxs)


def test_an_expert_parallel_that_does_not_divide_a_stage_is_refused_naming_it(env):
    cluster, model, _ = env
    plan = _plan(2, 1, 4, 8, expert_parallel=2)
    with pytest.raises(InputError, match=r"'expert_parallel' \(2\) does not divide stages\[1\]\.data_parallel"):
        validate_plan(plan, cluster, model)


def test_flagscale_config_carries_the_meshes_and_the_experts(env):
    """FlagScale's hetero meshes are (tp, cp, ep, dp, pp) each (flagscale/train/arguments.py pre_validate_args):
    ep 1 on both, the MoE model's arguments beside them."""
    cluster, model, _ = env
    train = flagscale_config(_plan(2, 1, 4, 8), model, cluster)["train"]
    assert train["system"]["hetero"]["hetero_process_meshes"] == [4, 1, 1, 2, 1, 8, 1, 1, 1, 1]
    assert train["system"]["expert_model_parallel_size"] == 1
    two = flagscale_config(_plan(4, 2, 2, 4, expert_parallel=2), model, cluster)["train"]["system"]
    assert two["hetero"]["hetero_process_meshes"] == [2, 1, 2, 4, 1, 4, 1, 2, 2, 1]
    assert two["expert_model_parallel_size"] == 2
    assert dp_text(plan_to_dict(_plan(4, 2, 2, 4, expert_parallel=2))) == "4/2 (ep 2)"
    assert train["model"]["num_experts"] == model.num_experts and train["model"]["moe_router_topk"] == model.moe_router_topk
