"""`memx simulate` commands through typer's CliRunner."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from memx.cli.app import app as memx_app
from memx.domain.groups import any_plan_from_dict, any_plan_from_json
from tests.support.plans import GROUPED

runner = CliRunner()


def invoke(args, **kw):
    """`memx simulate ARGS` through the root app (its group owns the error handler)."""
    return runner.invoke(memx_app, ["simulate", *args], **kw)
STAGE = {"gpu": "a100-80g", "tp": 2, "layers": 4, "micro_batch": 1, "seq_len": 4096, "recompute": "full",
         "recompute_layers": 2, "first": True, "last": False, "inflight": 4, "hidden": 4096, "ffn_hidden": 11008,
         "heads": 32, "query_groups": 32, "vocab": 32000, "mlp": "swiglu"}
PLAN = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 128, "micro_batch": 1, "seq_len": 4096,
        "dp": 2, "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 10, "recompute": "none"},
                            {"gpu": "vendor-b-32g", "tp": 4, "layers": 11, "recompute": "full"},
                            {"gpu": "vendor-c-32g", "tp": 4, "layers": 11, "recompute": "full"}]}


def test_stage_from_stdin():
    res = invoke(["stage", "--seed", "3"], input=json.dumps(STAGE))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["status"] == "ok" and out["time_ms"] > 0 and out["peak_mem_mib"] > out["static_mem_mib"]


def test_stage_bad_field_exits_2():
    res = invoke(["stage"], input=json.dumps({**STAGE, "tp": 3}))
    assert res.exit_code == 2
    assert "'tp'" in res.stderr and res.stdout == ""


def test_plan_from_file(tmp_path, conf_root):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    args = ["plan", str(path), "--cluster", "three-vendor-20", "--model", "llama2-7b", "--conf", str(conf_root)]
    res = invoke(args + ["--seed", "1"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["oom"] is False and len(out["peak_mem_mib"]) == 20 and out["iteration_time_ms"] > 0
    assert json.loads(invoke(args + ["--seed", "1"]).stdout) == out


def test_plan_invalid_exits_2():
    bad = {**PLAN, "global_batch": 127}
    res = invoke(["plan", "--cluster", "three-vendor-20", "--model", "llama2-7b"], input=json.dumps(bad))
    assert res.exit_code == 2 and "global_batch" in res.stderr
    res = invoke(["plan", "--cluster", "nope", "--model", "llama2-7b"], input=json.dumps(PLAN))
    assert res.exit_code == 2 and "unknown cluster" in res.stderr


def test_sample_writes_parquet(tmp_path):
    out = tmp_path / "runs.parquet"
    res = invoke(["sample", "--cluster", "xy-2", "--model", "llama2-7b", "--search", "small",
                              "--n", "5", "--seed", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out)
    assert len(df) == 5 and {"plan", "iteration_time_ms", "peak_mem_mib", "oom", "source"} <= set(df.columns)


def test_sample_bad_model_writes_nothing(tmp_path):
    out = tmp_path / "runs.parquet"
    res = invoke(["sample", "--cluster", "xy-2", "--model", "nope", "--n", "5", "--seed", "2",
                              "--out", str(out)])
    assert res.exit_code == 2 and "unknown model" in res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_schema_two_plan_reports_groups_and_the_cross_group_sync(tmp_path):
    path = tmp_path / "grouped.json"
    path.write_text(json.dumps({"plan": GROUPED, "predicted": {}}))  # a report object reads like the bare plan
    res = invoke(["plan", str(path), "--seed", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["oom"] is False and len(out["peak_mem_mib"]) == 20
    assert [(g["group"], g["samples"], g["gpus"]) for g in out["groups"]] == [(0, 48, 4), (1, 80, 16)]
    assert out["cross_sync_ms"] > 0
    assert out["iteration_time_ms"] == max(out["group_iteration_ms"]) + out["cross_sync_ms"]
    lines = res.stderr.splitlines()
    assert lines[0].startswith(f"{path}: group 0: dp 1 × a100-80g×4 [32], micro batch 2 × 24 = 48 samples: ")
    assert lines[2].startswith(f"{path}: cross-group gradient sync adds ")


def test_schema_two_runs_file_is_config_runs(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(GROUPED))
    runs = tmp_path / "runs.parquet"
    res = invoke(["plan", str(tmp_path / "g.json"), "--runs", str(runs)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(runs)
    assert len(df) == 1 and any_plan_from_json(df["plan"][0]) == any_plan_from_dict(GROUPED)
    assert df["iteration_time_ms"][0] == json.loads(res.stdout)["iteration_time_ms"]


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def test_bad_schema_two_plans_exit_2_naming_the_field(tmp_path):
    groups = GROUPED["groups"]
    cases = [
        ({**GROUPED, "groups": [groups[0], _without(groups[1], "micro_batches")]}, "groups[1]: missing field(s) micro_batches"),
        ({**GROUPED, "global_batch": 120}, "field 'global_batch' is 120"),
        ({**GROUPED, "schema": 3}, "field 'schema' is 3"),
        ({**GROUPED, "groups": []}, "field 'groups' must be a non-empty list"),
        ({**GROUPED, "groups": [groups[0], {**groups[1], "dp": 3}]}, "groups[1]: plan uses 12 × vendor-b-32g"),
        ({**GROUPED, "groups": [{**groups[0], "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 30}]}, groups[1]]},
         "groups[0]"),
    ]
    for bad, needle in cases:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        runs = tmp_path / "runs.parquet"
        res = invoke(["plan", str(path), "--runs", str(runs)])
        assert res.exit_code == 2 and needle in res.stderr and str(path) in res.stderr, (needle, res.output)
        assert res.stdout == "" and not runs.exists() and "Traceback" not in res.output
