"""Bad pipeline_assembly input (issues #22, #27): a value other than the allowed assemblies exits 2 naming the
file, the field and the allowed values, before any search, and writes nothing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memx.cli.app import app

runner = CliRunner()
BASE = "name: s\nglobal_batch: 16\ntp_options: [1, 2]\nmicro_batch_options: [1]\nmax_pp: 2\n"
CASES = [
    ("unknown", "pipeline_assembly: dag\n", ("pipeline_assembly", "'paper'", "'cycle-mean'", "dag")),
    ("not-a-string", "pipeline_assembly: [paper]\n", ("pipeline_assembly", "'paper'", "'cycle-mean'")),
    ("underscore", "pipeline_assembly: cycle_mean\n", ("pipeline_assembly", "'cycle-mean'", "cycle_mean")),
]


@pytest.mark.parametrize("case, extra, names", CASES, ids=[c[0] for c in CASES])
def test_bad_pipeline_assembly_exits_2_naming_file_field_and_values(case, extra, names, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + extra)
    out = tmp_path / "out"
    res = runner.invoke(app, ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.stderr
    assert str(path) in res.stderr and all(n in res.stderr for n in names), res.stderr
    assert not out.exists()
