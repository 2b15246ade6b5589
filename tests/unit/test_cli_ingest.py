"""`memx ingest sailor|metis|aceso|galvatron` (memx.cli.profile) through typer's CliRunner on small hand-written files."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from memx.cli.app import app  # the root app: its group turns InputError into exit 2, NothingUsable into 5
from memx.cli.profile import default_import_path
from memx.profiling.importers import FORMATS


def sailor_tree(root):
    """A Sailor profile.json of llama-6l on A100-40 (seconds): embedding, 6 layers, final norm + head."""
    path = root / "src" / "llama-6l" / "A100-40" / "profile.json"
    path.parent.mkdir(parents=True)
    layers = {str(i): [0.003, 0.006, 0.5] for i in range(1, 7)}
    path.write_text(json.dumps({"2": {"1": {"0": [0.001, 0.000002, 0.5], **layers, "7": [0.001, 0.001, 0.5],
                                            "8": [0.002, 0.004, 0.5]}}}))
    return root / "src"


def test_ingest_sailor_writes_memx_home_imports(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    src = sailor_tree(tmp_path)
    res = CliRunner().invoke(app, ["ingest", "sailor", str(src), "--model", "llama-6l"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "home" / "imports" / "sailor-llama-6l.parquet"
    assert str(out) in res.output and "3 rows from 1 file(s)" in res.output
    df = pd.read_parquet(out).set_index(["layers", "first", "last"])
    assert set(df.gpu) == {"a100-40g"} and set(df.phase) == {"forward_backward"} and (df.micro_batch == 2).all()
    assert df.loc[(1, False, False), "time_ms"] == pytest.approx(9.0)  # (3 + 6) ms, seconds → ms
    assert df.loc[(0, True, False), "time_ms"] == pytest.approx(1.002)
    assert df.loc[(0, False, True), "time_ms"] == pytest.approx(8.0)  # final norm (2 ms) + head (6 ms)
    assert [p.name for p in src.rglob("*") if p.is_file()] == ["profile.json"]  # nothing written beside the source


def test_ingest_out_and_gpu_override(tmp_path):
    out = tmp_path / "rows.parquet"
    res = CliRunner().invoke(app, ["ingest", "sailor", str(sailor_tree(tmp_path)), "--model", "llama-6l",
                                   "--gpu", "a100-80g", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert set(pd.read_parquet(out).gpu) == {"a100-80g"}


def test_ingest_unknown_column_exits_2_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    (tmp_path / "GH-96.csv").write_text("mbs,tp,algo,fwd_us,bwd,fwd+bwd\n1,1,0,1,1,2\n")
    res = CliRunner().invoke(app, ["ingest", "aceso", str(tmp_path / "GH-96.csv"), "--model", "llama-6l"])
    assert res.exit_code == 2 and "unknown column 'fwd_us'" in res.output
    assert not (tmp_path / "home" / "imports").exists()


def test_ingest_nothing_usable_exits_5(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    (tmp_path / "GH-96.csv").write_text("mbs,tp,algo,fwd,bwd,fwd+bwd\n1,1,1,0.0019,0.0025,0.0044\n")  # row partition only
    res = CliRunner().invoke(app, ["ingest", "aceso", str(tmp_path / "GH-96.csv"), "--model", "llama-6l"])
    assert res.exit_code == 5 and "nothing usable" in res.output
    assert not (tmp_path / "home" / "imports").exists()


def test_every_format_has_a_command_with_its_about_text():
    res = CliRunner().invoke(app, ["ingest", "--help"], env={"COLUMNS": "400"})  # one line per command
    assert res.exit_code == 0
    for name, fmt in FORMATS.items():
        assert f"{name} " in res.output and fmt.about in res.output  # Rich markup must not eat "[mbs][tp]"


@pytest.mark.parametrize("model, name", [("gpt-neo-2.7b", "sailor-gpt-neo-2.7b.parquet"),
                                         ("my/conf/tiny.yaml", "sailor-tiny.parquet"), ("llama-6l", "sailor-llama-6l.parquet")])
def test_default_import_path_keeps_dots_of_catalog_names(tmp_path, monkeypatch, model, name):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path))
    assert default_import_path("sailor", model) == tmp_path / "imports" / name
