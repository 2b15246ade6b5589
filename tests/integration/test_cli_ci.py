"""The CI example (examples/ci/plan.yml) on the shipped defaults: a plan checked against itself as the
baseline passes (verdict same, identical Φ), with the example's own options."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from memx.cli.app import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ci" / "plan.yml"
CATALOG_OPTIONS = ("--conf", "--cluster", "--model", "--search")


def _example_options() -> list[str]:
    """The example's `memx plan` options, less the ones naming the user's catalog and files."""
    steps = yaml.safe_load(EXAMPLE.read_text())["jobs"]["plan"]["steps"]
    run = next(s["run"] for s in steps if "memx plan" in s.get("run", ""))
    argv = shlex.split(re.sub(r"\\\n", " ", run))[2:]
    pairs = list(zip(argv[::2], argv[1::2]))
    return [x for k, v in pairs if k not in (*CATALOG_OPTIONS, "--out", "--check") for x in (k, v)]


def test_the_example_runs_only_options_memx_plan_knows():
    opts = _example_options()
    assert opts == ["--format", "json", "--min-margin", "0.05"]


@pytest.mark.slow  # two searches of the default space (~1.5 min each on 2 busy cores)
def test_the_example_passes_on_the_shipped_defaults_against_its_own_baseline(tmp_path):
    runner = CliRunner()
    first = runner.invoke(app, ["plan", "--format", "json", "--out", str(tmp_path / "base")])
    assert first.exit_code == 0, first.output
    summary = tmp_path / "summary.md"
    again = runner.invoke(app, ["plan", *_example_options(), "--out", str(tmp_path / "plan-out"),
                                "--check", str(tmp_path / "base" / "plan.json"), "--summary", str(summary)])
    assert again.exit_code == 0, again.output
    text = summary.read_text()
    assert "**same** (exit 0)" in text
    phi_row = next(r for r in text.splitlines() if r.startswith("| Φ |")).split("|")
    assert phi_row[2] == phi_row[3]
    assert json.loads(again.stdout)["plan"] == json.loads(first.stdout)["plan"]
