"""`memx profile` and `memx ingest megatron` through typer's CliRunner."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from memx.cli.app import app as memx_app

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "profiling"


def _app():
    return memx_app  # the root app: its group turns InputError into exit 2


def test_profile_simulated_writes_runs_and_report(tmp_path):
    res = CliRunner().invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                      "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "runs=" in res.output and "full_grid=" in res.output
    df = pd.read_parquet(tmp_path / "stage_runs.parquet")
    assert len(df) > 20 and "| gpu | parameter |" in (tmp_path / "sensitivity.md").read_text()


def test_profile_is_stored_in_memx_home_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path))
    res = CliRunner().invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                      "--no-progress"])
    assert res.exit_code == 0, res.output
    manifests = sorted((tmp_path / "artifacts" / "profile").glob("*/manifest.json"))
    assert len(manifests) == 2  # one profile version per GPU type of xy-2
    # .lock: one run per home; cache/: the validated catalog entries (memx.domain.spec_cache)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("mlflow.db", ".lock", "cache")) == ["artifacts"]
    again = CliRunner().invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small"])
    assert again.exit_code == 0 and again.output.count("reused") == 2  # --progress does not re-version


def test_profile_out_under_a_file_exits_2_before_work(tmp_path):
    (tmp_path / "f").write_text("x")
    res = CliRunner().invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                      "--out", str(tmp_path / "f" / "sub")])
    assert res.exit_code == 2 and "is not a folder" in res.output
    assert not (tmp_path / "memx-home" / "artifacts").exists()


def test_bad_input_exits_2_with_one_clear_message(tmp_path):
    runner = CliRunner()
    res = runner.invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--backend", "magic",
                                 "--out", str(tmp_path)])
    assert res.exit_code == 2 and "simulated, command, torch, records" in res.output
    res = runner.invoke(_app(), ["profile", "--cluster", "nope", "--model", "llama-6l"])
    assert res.exit_code == 2 and "unknown cluster 'nope'" in res.output
    res = runner.invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--backend", "command",
                                 "--command", f"{sys.executable} x.py {{pp}}", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "unknown placeholder" in res.output
    res = runner.invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--backend", "records",
                                 "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--records" in res.output


def test_profile_command_backend_from_cli(tmp_path):
    cmd = f"{sys.executable} {FIX / 'json_ok.py'} --layers {{layers}}"
    res = CliRunner().invoke(_app(), ["profile", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                      "--backend", "command", "--command", cmd, "--jobs", "4", "--out", str(tmp_path),
                                      "--no-progress"])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(tmp_path / "stage_runs.parquet")
    assert (df.status == "ok").all() and set(df.backend) == {"command"}


def test_profile_records_backend_reports_rejected_rows(tmp_path):
    res = CliRunner().invoke(_app(), ["profile", "--cluster", "three-vendor-20", "--model", "llama-6l", "--backend",
                                      "records", "--records", str(FIX / "records_mixed.csv"), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "4 row(s) rejected" in res.output and "column 'recompute'" in res.output
    df = pd.read_parquet(tmp_path / "stage_runs.parquet")
    assert len(df) == 4 and set(df.gpu) == {"a100-80g"}  # the a100-80g profile holds them, once


def test_ingest_megatron_logdir(tmp_path):
    out = tmp_path / "runs.parquet"
    res = CliRunner().invoke(_app(), ["ingest", "megatron", str(FIX / "megatron_logs"), "--model", "llama2-7b",
                                      "--gpu", "a100-80g", "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out).set_index("source")
    run = df.loc["records:run_tp2_l4.log"]
    assert (run.tp, run.layers, run.micro_batch, run.recompute, run.recompute_layers) == (2, 4, 1, "full", 2)
    assert run["first"] and run["last"]  # pipeline size 1: the stage holds embedding and output layer
    assert run.time_ms == 1610.0 / 8 or run.time_ms == 1600.0 / 8 or abs(run.time_ms - 1605.0 / 8) < 1e-9
    assert run.peak_mem_mib == 15000.25
    emb = df.loc["records:header_point.txt"]
    assert emb.layers == 0 and emb["first"] and emb.peak_mem_mib != emb.peak_mem_mib  # time-only (NaN)
    assert df.loc["records:oom_run.log"].status == "oom"
    assert "notes.txt" in res.output  # rejected, with why


def test_ingest_missing_folder_exits_2(tmp_path):
    res = CliRunner().invoke(_app(), ["ingest", "megatron", str(tmp_path / "nope"), "--model", "llama2-7b",
                                      "--gpu", "a100-80g"])
    assert res.exit_code == 2 and "no such log folder" in res.output
