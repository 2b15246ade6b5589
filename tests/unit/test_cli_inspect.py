"""`memx inspect` and `memx rank` (issue #12, the paper's adoption steps)."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from memx.cli.app import app
from memx.cli.inspect import measured_ranking
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.search import search
from tests.support.plans import GROUPED

runner = CliRunner()


def _pick(tmp_path):
    cl, mo = load_cluster("three-vendor-20"), load_model("llama-6l")
    r = search(cl, mo, load_search("small"), AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}), top_k=3)
    return cl, mo, r


def test_inspect_reports_the_plans_estimate_for_report_object_and_bare_plan(tmp_path):
    res = runner.invoke(app, ["plan", "--model", "llama-6l", "--search", "small", "--format", "json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    (tmp_path / "report.json").write_text(res.stdout)
    (tmp_path / "bare.json").write_text(json.dumps(obj["plan"]))
    q = obj["predicted"]
    for name in ("report.json", "bare.json"):
        out = runner.invoke(app, ["inspect", str(tmp_path / name), "--model", "llama-6l"])
        assert out.exit_code == 0, out.output
        assert f"iteration {q['iteration_time_ms']:,.0f} ms" in out.stdout
        assert f"smallest margin {q['min_margin']:.1%}" in out.stdout
        assert f"max memory {q['max_mem_mib'] / 1024:.1f} GiB" in out.stdout


def test_inspect_bad_input(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    out = runner.invoke(app, ["inspect", str(tmp_path / "x.json"), "--model", "llama-6l"])
    assert out.exit_code == 2 and "not valid JSON" in out.output
    out = runner.invoke(app, ["inspect", str(tmp_path / "x.json"), "--predictor", "oracle"])
    assert out.exit_code == 2 and "allowed: analytic, registered" in out.output


def _measured(tmp_path):
    cl, mo, r = _pick(tmp_path)
    plans = list(dict.fromkeys([c.plan for c in r.top_time[:3]] + [r.best.plan]))  # the pick may be among them
    ms = estimate_plans(plans, cl, mo, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    from memx.domain.plan import plan_to_json

    rows = [{"plan": plan_to_json(m.plan), "iteration_time_ms": m.iteration_time_ms,
             "peak_mem_mib": json.dumps(list(m.peak_mem_mib)), "oom": False} for m in ms]
    rows.append({"plan": plan_to_json(plans[0]), "iteration_time_ms": None, "peak_mem_mib": None, "oom": True})
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path, ms


def test_rank_measured_by_phi(tmp_path):
    path, ms = _measured(tmp_path)
    df = measured_ranking(pd.read_csv(path), "throughput")
    assert len(df) == len({m.plan for m in ms})  # the OOM row is left out
    assert list(df.phi) == sorted(df.phi)
    out = runner.invoke(app, ["rank", "--measured", str(path), "--weights", "throughput"])
    assert out.exit_code == 0, out.output
    assert "Measured plans by Φ" in out.stdout
    assert ("also the fastest" in out.stdout) == (df.time_ms.idxmin() == 0)


def test_rank_bad_input(tmp_path):
    out = runner.invoke(app, ["rank", "--measured", str(tmp_path / "none.csv")])
    assert out.exit_code == 2 and "no such file" in out.output
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    out = runner.invoke(app, ["rank", "--measured", str(tmp_path / "x.csv")])
    assert out.exit_code == 2 and "missing column(s) plan" in out.output
    (tmp_path / "oom.csv").write_text('plan,iteration_time_ms,peak_mem_mib,oom\n"{}",,,True\n')
    out = runner.invoke(app, ["rank", "--measured", str(tmp_path / "oom.csv")])
    assert out.exit_code == 5


def test_inspect_and_rank_read_schema_two_plans(tmp_path):
    from memx.domain.groups import any_plan_from_dict, any_plan_to_json
    from memx.planner.replicas import estimate_any_plans

    path = tmp_path / "grouped.json"
    path.write_text(json.dumps({**GROUPED, "distributed_optimizer": True}))
    cl, mo = load_cluster("three-vendor-20"), load_model("llama2-7b")
    plan = any_plan_from_dict({**GROUPED, "distributed_optimizer": True})
    (m,) = estimate_any_plans([plan], cl, mo, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    out = runner.invoke(app, ["inspect", str(path), "--model", "llama2-7b"])
    assert out.exit_code == 0, out.output
    assert f"iteration {m.iteration_time_ms:,.0f} ms" in out.stdout and m.cross_sync_ms > 0
    assert "group 1: dp 2 × vendor-b-32g×4 [16] sel → vendor-c-32g×4 [16] full" in out.stdout
    assert f"cross-group gradient sync: {m.cross_sync_ms:,.0f} ms" in out.stdout
    assert "4×1" in out.stdout and out.stdout.count("4×2") == 2  # stage rows: tp × their group's dp

    runs = tmp_path / "runs.csv"
    pd.DataFrame([{"plan": any_plan_to_json(plan), "iteration_time_ms": m.iteration_time_ms,
                   "peak_mem_mib": json.dumps(list(m.peak_mem_mib)), "oom": False}]).to_csv(runs, index=False)
    ranked = runner.invoke(app, ["rank", "--measured", str(runs)])
    assert ranked.exit_code == 0, ranked.output
    assert "1+2" in ranked.stdout and "2/1" in ranked.stdout  # the groups' dp and micro batches
