"""`memx profile --moe-layers` (issue #27 session 5): a value outside points | all | none exits 2 with one line naming
the option and the allowed values, before anything is profiled or written. Table-driven: (case id, value)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memx.cli.app import app

CASES = [("unknown-word", "some"), ("upper-case", "POINTS"), ("empty", "")]


@pytest.mark.parametrize("value", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_moe_layers_exits_2_naming_the_option_and_its_values(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    res = CliRunner().invoke(app, ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                   "--moe-layers", value, "--no-progress"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert "--moe-layers" in lines[0] and "all, points, none" in lines[0], lines[0]
    assert sorted(tmp_path.rglob("*")) == before  # no profile, no home, no scratch


def test_the_flag_reaches_the_profiler_only_when_not_the_default():
    from memx.cli.profile import profile_options

    assert "moe_layers" not in profile_options("simulated", None, None)  # stored profile versions unchanged
    assert profile_options("simulated", None, None, moe_layers="all")["moe_layers"] == "all"
