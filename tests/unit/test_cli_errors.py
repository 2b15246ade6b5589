"""One error handler for the whole `memx` CLI (docs/architecture.md §CLI).

Every MemxError raised inside any sub-command reaches the root group's `MemxGroup.invoke`, which
prints exactly one `error: …` line on stderr and exits with the error's code; Ctrl-C exits 130.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memx.cli
import memx.cli.profile
from memx.cli.app import app
from memx.cli.experiments import NAMES
from memx.cli.orchestration import matplotlib_env, prefect_env
from memx.domain.home import memx_home
from memx.experiments import EXPERIMENTS

runner = CliRunner()
XY = ["--cluster", "xy-2", "--model", "llama-6l"]
SMALL = ["--model", "llama-6l", "--search", "small"]
CLI_DIR = Path(memx.cli.__file__).parent


def _one_error(res, code: int, needle: str) -> None:
    assert res.exit_code == code, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert needle in errors[0], errors[0]
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args,code,needle", [
    (["simulate", "plan", "{tmp}/missing.json", *XY], 2, "no such plan file"),
    (["simulate", "stage"], 2, "not valid JSON"),
    (["simulate", "sample", "--cluster", "nope", "--model", "llama-6l", "--n", "2", "--seed", "0", "--out", "{tmp}/r.parquet"],
     2, "unknown cluster 'nope'"),
    (["artifacts", "show", "profile", "nope", "--store", "{tmp}/store"], 2, "nope"),
    (["train", "--cluster", "nope", "--model", "llama-6l"], 2, "unknown cluster 'nope'"),
    (["train", *XY, "--search", "small", "--stage-runs", "{tmp}/none.parquet"], 2, "--stage-runs"),
    (["evaluate", *XY, "--measured", "{tmp}/m.parquet", "--format", "xml"], 2, "allowed: table, json"),
    (["profile", "--cluster", "nope", "--model", "llama-6l"], 2, "unknown cluster 'nope'"),
    (["profile", *XY, "--command", "prog 'unbalanced", "--backend", "command", "--out", "{tmp}/p"], 2, "--command"),
    (["ingest", "megatron", "{tmp}/no-logs", "--model", "llama2-7b", "--gpu", "a100-80g"], 2, "no such log folder"),
    (["experiments", "nope", "--out", "{tmp}/x"], 2, "experiment 'nope'"),
    (["cluster", "add-node", "nope", "--gpu", "a100-80g"], 2, "nope"),
    (["plan", "--model", "gpt5"], 2, "gpt5"),
    (["plan", *SMALL, "--backend", "magic"], 2, "allowed: analytic, simulated"),
    (["plan", *SMALL, "--backend", "command"], 2, "--command"),
    (["plan", "--cluster", "v100-t4-6", "--model", "llama2-70b", "--search", "small"], 3, "llama2-70b needs"),
])
def test_every_sub_command_reports_through_the_one_handler(tmp_path, args, code, needle):
    res = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args], input="{not json")
    _one_error(res, code, needle)


def test_failed_check_exits_4_with_one_error_line(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(runner.invoke(app, ["plan", *SMALL, "--format", "json"]).stdout)
    res = runner.invoke(app, ["plan", *SMALL, "--format", "json", "--check", str(base), "--min-margin", "0.99"])
    _one_error(res, 4, "low-margin")
    assert "**low-margin**" in res.stderr and json.loads(res.stdout)["plan"]


def test_ctrl_c_exits_130_and_says_what_is_kept(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("memx.pipeline.local.profile_step", interrupted)  # memx.cli.profile imports it when run
    res = runner.invoke(app, ["profile", *XY, "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 130, res.output
    assert "interrupted: GPU types already profiled stay stored" in res.stderr and "error:" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # --out is an export of what was stored: nothing yet


def test_no_module_in_memx_cli_handles_errors_itself():
    """Only options.py catches MemxError or raises typer.Exit; nothing else in memx/cli does."""
    for path in sorted(CLI_DIR.glob("*.py")):
        if path.name == "options.py":
            continue
        source = path.read_text()
        tree = ast.parse(source)
        caught = [ast.unparse(h.type) for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) and h.type is not None]
        assert not [c for c in caught if "Error" in c and c not in ("json.JSONDecodeError", "UnicodeDecodeError") and "Exception" not in c], (path, caught)
        assert "typer.Exit" not in source and "def register(" not in source, path
        assert len(source.splitlines()) <= 500, path


def test_experiment_names_match_the_library():
    assert NAMES == ("all", *EXPERIMENTS)


def test_local_state_lives_under_memx_home(monkeypatch):
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    matplotlib_env()
    assert os.environ["MPLCONFIGDIR"] == str(memx_home() / "matplotlib")
    for key in ("PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_LEVEL",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):
        monkeypatch.delenv(key, raising=False)  # restored after the test
    prefect_env()
    assert os.environ["PREFECT_HOME"] == str(memx_home() / "prefect") and (memx_home() / "prefect").is_dir()
