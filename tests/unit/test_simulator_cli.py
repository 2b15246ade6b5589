"""`memx simulate` commands through typer's CliRunner."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from memx.cli.app import app as memx_app

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
