"""`memx plan --measured RUNS` (session 16): the closed form calibrated on plans timed on the cluster before it
searches (memx.learn.calibration, guarded); the pick's predicted time is the calibrated estimate of that plan, and
`memx inspect --measured` reports the same; bad input exits 2 with nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memx.cli.app import app as memx_app
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.io import atomic_write_parquet
from memx.domain.plan import plan_from_dict
from memx.learn.calibration import calibrated_estimates, fit_from_config_runs
from memx.planner.cost import AnalyticStageModel
from memx.report.evaluate import read_config_runs
from memx.simulator import sample_plans

ARGS = ["--cluster", "xy-2", "--model", "llama-6l", "--search", "small", "--format", "json"]


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory):
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    path = tmp_path_factory.mktemp("measured") / "runs.parquet"
    atomic_write_parquet(sample_plans(cl, mo, sp, n=24, seed=5), path)
    return path


def test_plan_measured_searches_with_the_calibrated_closed_form(runs_file):
    res = CliRunner().invoke(memx_app, ["plan", *ARGS, "--measured", str(runs_file)])
    assert res.exit_code == 0, res.output
    assert "plan calibration: time:" in res.stderr
    obj = json.loads(res.stdout)
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    base = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    cal = fit_from_config_runs(read_config_runs(runs_file), cl, mo, base, pipeline_assembly=sp.pipeline_assembly)
    assert obj["predictor"] == f"analytic, {cal.headline()}"
    assert not cal.is_identity  # 24 simulated plans: the guard keeps a part (else this test would prove nothing)
    plan = plan_from_dict(obj["plan"])
    (want,) = calibrated_estimates([plan], cl, mo, base, cal, reserve_gib=sp.reserve_gib)
    assert obj["predicted"]["iteration_time_ms"] == pytest.approx(want.iteration_time_ms, rel=1e-6)
    plain = CliRunner().invoke(memx_app, ["plan", *ARGS])
    assert plain.exit_code == 0 and json.loads(plain.stdout)["predictor"] == "analytic"


def test_inspect_measured_reports_the_calibrated_estimate(runs_file, tmp_path):
    res = CliRunner().invoke(memx_app, ["plan", *ARGS, "--measured", str(runs_file)])
    path = tmp_path / "plan.json"
    path.write_text(res.stdout)
    obj = json.loads(res.stdout)
    out = CliRunner().invoke(memx_app, ["inspect", str(path), "--measured", str(runs_file)])
    assert out.exit_code == 0, out.output
    assert f"({obj['predictor']})" in out.stdout
    assert f"iteration {obj['predicted']['iteration_time_ms']:,.0f} ms" in out.stdout
    bad = CliRunner().invoke(memx_app, ["inspect", str(path), "--measured", str(runs_file), "--predictor", "registered"])
    assert bad.exit_code == 2 and "memx train --measured" in bad.output


@pytest.mark.parametrize(("extra", "words"), [
    (["--predictor", "registered"], "memx train --measured"),
    (["--measured-missing"], "no such file")])
def test_plan_measured_bad_input_exits_2(runs_file, tmp_path, extra, words):
    args = ["--measured", str(tmp_path / "absent.parquet")] if extra == ["--measured-missing"] else \
        ["--measured", str(runs_file), *extra]
    res = CliRunner().invoke(memx_app, ["plan", *ARGS, *args])
    assert res.exit_code == 2 and words in res.output, res.output
