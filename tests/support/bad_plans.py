"""The bad-plan contract of `memx simulate plan` (table-driven tests in tests/faults): exit 2, one line naming
every given name and the file, nothing written."""

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
