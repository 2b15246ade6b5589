"""The opt-in per-stage-dp space (issue #27, memx.planner.stage_dp_search) and its outputs: the split programme
against brute force, the layouts, the search's answer, FlagScale's per-mesh dp, Megatron-LM's refusal, notation."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import yaml

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.plan import plan_from_dict, plan_to_dict, validate_plan
from memx.domain.stage_dp import has_stage_dp, stage_dps
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.launcher import _launcher_search, launcher_search
from memx.planner.pick import dominates
from memx.planner.stage_dp_search import best_splits, layouts, search_stage_dp
from memx.report.flagscale import render_flagscale
from memx.report.megatron import megatron_launchable
from memx.report.notation import compact_stages, dp_text
from tests.support.launch_checks import flagscale_problems as fixture_problems, hostfile_problems, world_of
from tests.unit.test_stage_dp import MIXED


def _brute(t: np.ndarray, m: int, total: int) -> float:
    best = np.inf
    for cuts in itertools.combinations(range(1, total), t.shape[0] - 1):
        split = [b - a for a, b in zip((0, *cuts), (*cuts, total))]
        x = np.array([t[s, n] for s, n in enumerate(split)])
        best = min(best, (m - 1) * x.max() + x.sum())
    return best


@pytest.mark.parametrize("seed", range(6))
def test_split_programme_finds_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    pp, total, m = 2 + seed % 3, 9, int(rng.integers(1, 9))
    t = np.cumsum(rng.uniform(1.0, 3.0, size=(pp, total + 1)), axis=1)
    t[:, 0] = np.inf
    t[rng.random(t.shape) < 0.15] = np.inf  # stages that cannot hold some layer counts (memory)
    got = best_splits(t, m, total, keep=2)
    want = _brute(t, m, total)
    if not np.isfinite(want):
        assert got == []
        return
    x = np.array([t[s, n] for s, n in enumerate(got[0])])
    assert sum(got[0]) == total and (m - 1) * x.max() + x.sum() == pytest.approx(want, rel=1e-12)
    assert best_splits(t, m, total, keep=2, bound=want) == []  # nothing strictly below the optimum


def test_layouts_are_the_mixed_dp_meshes_that_fit():
    cluster, model, space = load_cluster("a100-v100-16"), load_model("llama2-7b"), load_search("default")
    probes = layouts(cluster, model, space)
    assert probes and all(has_stage_dp(p) for p in probes)
    for p in probes:
        assert p.gpus_per_type() == {"a100-80g": 4, "v100-32g": 12}  # use_all_gpus
        by_type = {}
        for st, dp in zip(p.stages, stage_dps(p)):
            by_type.setdefault(st.gpu, set()).add((st.tp, dp))
        assert all(len(v) == 1 for v in by_type.values())  # one (tp, dp) per mesh, as FlagScale's
        assert p.global_batch % (p.dp * p.micro_batch) == 0 and 1 <= p.pp <= space.max_pp


def test_search_stage_dp_returns_a_valid_plan_its_estimate_scores():
    cluster, model, space = load_cluster("h100-h20-16"), load_model("llama-6l"), load_search("small")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    m, high = search_stage_dp(cluster, model, space, pred)
    validate_plan(m.plan, cluster, model)
    assert has_stage_dp(m.plan) and high == m.min_margin
    assert estimate_plans([m.plan], cluster, model, pred)[0].iteration_time_ms == m.iteration_time_ms


def test_opt_in_plan_joins_the_candidates_and_the_pick_rule_decides():
    """v100-t4-6 / gpt2-1024: a per-stage-dp plan is the fastest above the floor. With the option off the space and
    pick are today's; on, the plan joins the kept candidates and each rule picks from them all: the fastest-above-
    floor pick is that plan, and a balanced-front pick is never one it dominates (ties on both do not dominate)."""
    cluster, model, space = load_cluster("v100-t4-6"), load_model("gpt2-1024"), load_search("small")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    fast = dataclasses.replace(space, pick_rule="fastest-above-floor")
    off = launcher_search(cluster, model, fast, pred)
    assert off.chosen.plan == _launcher_search(cluster, model, fast, pred).chosen.plan and not has_stage_dp(off.chosen.plan)
    on = launcher_search(cluster, model, dataclasses.replace(fast, stage_data_parallel=True), pred)
    assert has_stage_dp(on.chosen.plan) and on.chosen.iteration_time_ms < off.chosen.iteration_time_ms
    assert on.chosen.min_margin >= space.margin_floor and any(has_stage_dp(c.plan) for c in on.pareto)
    bal = launcher_search(cluster, model, dataclasses.replace(space, pick_rule="balanced-front", stage_data_parallel=True),
                          pred)
    psdp = next(c for c in bal.safe if has_stage_dp(c.plan))
    assert psdp.iteration_time_ms == pytest.approx(on.chosen.iteration_time_ms)
    assert not dominates(psdp, bal.chosen, lambda m: m.min_margin)


def test_flagscale_carries_per_mesh_dp_and_megatron_refuses():
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    plan = plan_from_dict(MIXED)
    text = render_flagscale(plan, model, cluster)
    cfg = yaml.safe_load(text)
    hetero = cfg["train"]["system"]["hetero"]
    assert hetero["hetero_process_meshes"] == [2, 1, 1, 2, 1, 4, 1, 1, 1, 1, 4, 1, 1, 2, 1]
    assert hetero["hetero_device_types"] == ["a100-80g", "v100-32g", "v100-32g"]
    assert cfg["train"]["model"]["micro_batch_size"] == 1  # the first mesh's; FlagScale gives mesh i B / dp_i
    assert fixture_problems(cfg, world=plan.gpus_used) == [] and hostfile_problems(text, cfg) == []
    assert world_of(cfg) == 16 and "dp 2/1/2" in text
    problems = " ".join(megatron_launchable(plan, model, cluster))
    assert "different data-parallel sizes [2, 1, 2]" in problems and "one --data-parallel size" in problems


def test_notation_shows_each_stages_dp():
    d = plan_to_dict(plan_from_dict(MIXED))
    assert dp_text(d) == "2/1/2"
    assert compact_stages(d) == "a100-80g×2·dp2 [12] → v100-32g×4·dp1 [10] full → v100-32g×4·dp2 [10] full"


@pytest.mark.slow
def test_metis_like_searches_per_stage_dp_only_when_the_space_asks():
    from memx.planner.baselines.metis import METIS

    cluster, model, space = load_cluster("h100-h20-16"), load_model("llama-6l"), load_search("small")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    off = METIS.plan(cluster, model, space, pred)
    on = METIS.plan(cluster, model, dataclasses.replace(space, stage_data_parallel=True), pred)
    assert on.predicted_time_ms <= off.predicted_time_ms
    assert has_stage_dp(on.plan) == (on.predicted_time_ms < off.predicted_time_ms)


def test_flagscale_shared_embedding_rule_with_tied_embeddings():
    """Tied embeddings + the distributed optimizer + a different first and last dp: FlagScale asserts
    use_partial_reduce_for_shared_embedding (and one dp dividing the other, which validation checks)."""
    cluster, model = load_cluster("a100-v100-16"), load_model("gpt2-1024")
    doc = {"model": "gpt2-1024", "cluster": "a100-v100-16", "global_batch": 32, "micro_batch": 1, "seq_len": 1024,
           "dp": 2, "precision": "fp16", "distributed_optimizer": True,
           "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 2},
                      {"gpu": "v100-32g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 1}]}
    plan = plan_from_dict(doc)
    validate_plan(plan, cluster, model)
    cfg = yaml.safe_load(render_flagscale(plan, model, cluster))
    assert cfg["train"]["system"]["use_partial_reduce_for_shared_embedding"] is True
    assert fixture_problems(cfg, world=plan.gpus_used) == []
