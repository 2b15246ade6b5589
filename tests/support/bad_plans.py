"""The bad-input contracts of `memx simulate plan` (a plan file) and `memx plan` (a search YAML), for the table-driven
tests in tests/faults: exit 2, the file and every given name in the message, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner


def assert_rejected(doc: dict, names, tmp_path: Path) -> None:
    from memx.cli.app import app

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    before = sorted(tmp_path.iterdir())
    res = CliRunner().invoke(app, ["simulate", "plan", str(path)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "plan.json" in lines[0] and sorted(tmp_path.iterdir()) == before


SEARCH_BASE = "name: s\nglobal_batch: 16\ntp_options: [1, 2]\nmicro_batch_options: [1]\nmax_pp: 2\n"


def assert_bad_search(extra: str, names, tmp_path: Path) -> None:
    """The bad-search-YAML contract of `memx plan`: a small search YAML (SEARCH_BASE + extra) exits 2 with the file and
    every given name on stderr, before any search, and --out is not written."""
    from memx.cli.app import app

    path = tmp_path / "s.yaml"
    path.write_text(SEARCH_BASE + extra)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", str(path),
                                   "--out", str(out)])
    assert res.exit_code == 2, res.stderr
    assert str(path) in res.stderr and all(n in res.stderr for n in names), res.stderr
    assert not out.exists()
