"""`--check` when the baseline became infeasible (issue #22): exit 4 when the new plan is more than
`--max-slowdown` slower than it, exit 0 within; a negative `--max-slowdown` is bad input (exit 2)."""

import dataclasses

from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search
from memx.report.check import check


def test_an_infeasible_baseline_fails_the_check_when_the_new_plan_is_too_slow():
    cl, sp = load_cluster("xy-2"), load_search("small")
    mo = dataclasses.replace(load_model("llama-6l"), hidden=8192, seq_len=4096)  # the pick must recompute
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    r = search(cl, mo, sp, pred)
    p = r.chosen.plan
    assert any(s.recompute != "none" for s in p.stages)
    # The baseline: the same plan without recompute — faster, and out of memory now.
    base = dataclasses.replace(p, stages=tuple(dataclasses.replace(s, recompute="none", recompute_layers=None)
                                               for s in p.stages))
    kw = dict(weights=r.weights, refs=r.refs, epsilon_mib2=r.epsilon_mib2, reserve_gib=sp.reserve_gib, min_margin=0.0)
    slow = check(r.chosen, base, cl, mo, pred, max_slowdown=0.10, **kw)
    assert (slow.verdict, slow.exit_code) == ("baseline-infeasible-slower", 4)
    assert "run out of memory" in slow.markdown and "exceeded, exit 4" in slow.markdown
    ok = check(r.chosen, base, cl, mo, pred, max_slowdown=1.0, **kw)
    assert (ok.verdict, ok.exit_code) == ("baseline-infeasible", 0) and "within" in ok.markdown


def test_a_negative_max_slowdown_exits_2_naming_the_option(tmp_path):
    (tmp_path / "b.json").write_text("{}")
    res = CliRunner().invoke(app, ["plan", "--model", "llama-6l", "--search", "small", "--check", str(tmp_path / "b.json"),
                                   "--max-slowdown", "-0.1"])
    assert res.exit_code == 2 and "--max-slowdown" in res.stderr and "≥ 0" in res.stderr
