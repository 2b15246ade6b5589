"""`launcher: megatron | flagscale` restricts the search to what that launcher starts (memx.planner.launcher,
memx.planner.space), and the pick is then launchable: its megatron.sh starts, or its flagscale.yaml passes the
FlagScale fixture."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.specs import Cluster, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.launcher import launcher_gain, launcher_search, level_sets
from memx.planner.pick import phi_on, plan_key, unique
from memx.planner.search import search
from memx.planner.space import enumerate_layouts
from memx.report.megatron import megatron_launchable, render_megatron
from tests.support.launch_checks import flagscale_problems, megatron_launch_problems, script_args

runner = CliRunner()


def two_vendors() -> Cluster:
    return Cluster(name="two-vendor-8", inter_node_bandwidth_gbps=25.0,
                   nodes=(Node(gpu=load_gpu("a100-80g"), count=4), Node(gpu=load_gpu("v100-32g"), count=2),
                          Node(gpu=load_gpu("vendor-b-32g"), count=2)))


def test_megatron_layouts_have_one_tp_and_one_vendor_and_flagscale_ties_the_ends():
    cl, model = two_vendors(), load_model("llama2-7b")
    space = load_search("small")
    free = enumerate_layouts(cl, model, space)
    meg = enumerate_layouts(cl, model, dataclasses.replace(space, launcher="megatron"))
    assert meg and len(meg) < len(free)
    for lay in meg:
        assert len(set(lay.stage_tp)) == 1 and len({cl.gpu(g).vendor for g in lay.stage_gpus}) == 1
    assert {frozenset(lay.stage_gpus) for lay in meg} == {frozenset({"a100-80g", "v100-32g"}), frozenset({"vendor-b-32g"})}
    tied = load_model("gpt2-1024")
    fs = enumerate_layouts(cl, tied, dataclasses.replace(space, launcher="flagscale"))
    assert fs and all(lay.stage_tp[0] == lay.stage_tp[-1] for lay in fs)
    assert len(fs) < len(enumerate_layouts(cl, tied, space))


def test_level_sets():
    sp = load_search("default")
    assert level_sets(dataclasses.replace(sp, launcher="megatron")) == (("none",), ("selective",), ("full",))
    assert level_sets(dataclasses.replace(sp, launcher="flagscale")) == (("none", "full", "block"), ("selective",))
    assert level_sets(sp) == (sp.recompute_levels,)


def test_megatron_search_picks_a_plan_megatron_starts_and_reports_the_gain():
    cl, model = load_cluster("xy-2"), load_model("llama-6l")
    sp = dataclasses.replace(load_search("small"), launcher="megatron")
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    res = launcher_search(cl, model, sp, pred, top_k=3)
    p = res.chosen.plan
    assert megatron_launchable(p, model, cl) == [] and p.idle_gpus  # one vendor's GPU; the other idle
    assert megatron_launch_problems(script_args(render_megatron(p, model, cl)), p.gpus_used,
                                    [st.layers for st in p.stages]) == []
    gain = launcher_gain(cl, model, sp, pred, res, top_k=3)
    assert gain["time_ms"] == res.chosen.iteration_time_ms and gain["time_ratio"] > 0
    if min(gain["margin"], gain["unconstrained_margin"]) >= sp.margin_floor:  # both clear: the superset is no slower
        assert gain["time_ratio"] >= 1.0 - 1e-6


@pytest.mark.parametrize("launcher", ["megatron", "flagscale"])
def test_the_pick_rule_chooses_across_the_level_sets(launcher):
    """Each recompute level set is searched on its own; the rule then picks from all their kept candidates: under
    fastest-above-floor the fastest plan any level finds above the floor; under balanced-front the least Φ (on the
    first level's medians) of the plans above the floor, within the tolerance of the fastest such plan, that no kept
    plan of any level beats on time and margin at once. On v100-t4-6 that is a slower, wider plan of another level
    than the fastest level pick, which the former floor-then-fastest choice between the levels' picks returned."""
    cl, model = load_cluster("v100-t4-6"), load_model("llama-6l")
    sp = dataclasses.replace(load_search("small"), launcher=launcher, balance_tolerance=0.1,
                             recompute_levels=("none", "selective", "full"))
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    levels = [search(cl, model, dataclasses.replace(sp, recompute_levels=lv), pred, top_k=3) for lv in level_sets(sp)]
    assert len(levels) > 1
    kept = unique([phi_on(c, levels[0], sp) for r in levels for c in (*r.top, *r.top_time, *r.pareto, *r.safe)])
    above = [c for c in kept if c.min_margin >= sp.margin_floor]
    t_star = min(c.iteration_time_ms for c in above)
    fast = launcher_search(cl, model, dataclasses.replace(sp, pick_rule="fastest-above-floor"), pred, top_k=3).chosen
    assert fast.iteration_time_ms == t_star

    def dominated(m):
        return any(c.iteration_time_ms <= m.iteration_time_ms and c.min_margin >= m.min_margin
                   and (c.iteration_time_ms, c.min_margin) != (m.iteration_time_ms, m.min_margin) for c in kept)

    window = [c for c in above if c.iteration_time_ms <= (1 + sp.balance_tolerance) * t_star and not dominated(c)]
    bal = launcher_search(cl, model, dataclasses.replace(sp, pick_rule="balanced-front"), pred, top_k=3).chosen
    assert plan_key(bal) == plan_key(min(window, key=lambda c: c.phi))
    assert bal.iteration_time_ms > t_star  # the rule took balance the fastest level pick does not have


def test_cli_megatron_search_emits_a_command_and_flagscale_a_config(tmp_path):
    s = tmp_path / "meg.yaml"
    s.write_text(
                 "name: meg\nglobal_batch: 16\ntp_options: [1, 2]\nmicro_batch_options: [1, 2]\nmax_pp: 4\n"
                 "recompute_levels: [none, full]\nlauncher: megatron\n")
    res = runner.invoke(app, ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", str(s),
                              "--format", "megatron"])
    assert res.exit_code == 0, res.stderr
    assert "torchrun" in res.stdout and "launcher megatron: its best plan" in res.stderr
    fs = runner.invoke(app, ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                             "--format", "flagscale"])
    assert fs.exit_code == 0, fs.stderr
    cfg = yaml.safe_load(fs.stdout)
    meshes = cfg["train"]["system"]["hetero"]["hetero_process_meshes"]
    world = sum(meshes[i] * meshes[i + 3] * meshes[i + 4] for i in range(0, len(meshes), 5))
    assert flagscale_problems(cfg, world=world) == []


def test_sweep_case_emits_only_launchable_commands():
    """bench/launch_check.py on one small case (the full sweep: the slow test below, docs/benchmarks.md)."""
    from collections import Counter

    from bench.launch_check import check_case

    counts: Counter = Counter()
    row = check_case("xy-2", "gpt2-1024", counts)
    assert row["problems"] == [] and row["megatron_pick_launchable"] and row["flagscale_pick_launchable"]
    assert counts["plans"] == 3 and counts["megatron_passed"] == counts["megatron_emitted"] >= 1
    assert counts["flagscale_passed"] == counts["flagscale_emitted"] >= 2


@pytest.mark.slow
def test_sweep_every_shipped_cluster():
    from collections import Counter

    from bench.launch_check import CLUSTERS, MODELS, check_case

    counts: Counter = Counter()
    for c in CLUSTERS:
        for m in MODELS:
            row = check_case(c, m, counts)
            assert row["problems"] == [], row
            assert row.get("megatron_pick_launchable", True) and row.get("flagscale_pick_launchable", True), row
    assert counts["megatron_passed"] == counts["megatron_emitted"] and counts["flagscale_passed"] == counts["flagscale_emitted"]
