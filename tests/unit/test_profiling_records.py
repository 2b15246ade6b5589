"""The records schema (memx.domain.records), validation of imported stage_runs and the Megatron /
JSON output parsers."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

import memx
import memx.domain.records as records
from memx.domain.hashing import stable_hash
from memx.domain.records import (SIGNATURE_COLUMNS, STAGE_RUN_COLUMNS, format_rejects, signature_key,
                                 stage_runs_frame, validate_stage_runs)
from memx.profiling.backends.imported import read_records
from memx.profiling.megatron_logs import parse_output

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "profiling"


def test_mixed_csv_keeps_valid_rows_and_reports_the_rest():
    df, rejects = read_records(FIX / "records_mixed.csv")
    assert len(df) == 4  # time-only layer, embedding-only, head-only, block recompute
    assert df.peak_mem_mib.isna().sum() == 2  # time-only rows import
    emb = df[(df.layers == 0) & df["first"]]
    assert len(emb) == 1 and emb.source.iloc[0] == "paper-table"  # own source kept
    assert (df[df.source != "paper-table"].source == "records:records_mixed.csv").all()
    assert set(df.backend) == {"records"}
    bad = {(r.row, r.column) for r in rejects}
    assert bad == {(4, "recompute"), (5, "tp"), (6, "layers"), (7, "time_ms")}
    report = format_rejects(rejects)
    assert "row 4, column 'recompute'" in report and "allowed: none, selective, full" in report


def test_missing_column_is_reported(tmp_path):
    p = tmp_path / "x.jsonl"
    pd.DataFrame([{"gpu": "a100-80g", "tp": 1}]).to_json(p, orient="records", lines=True)
    df, rejects = read_records(p)
    assert df.empty and any(r.column == "layers" and "missing" in r.reason for r in rejects)


def test_signature_key_ignores_measurement_columns():
    a = {"gpu": "g", "tp": 1, "layers": 2, "micro_batch": 1, "seq_len": 8, "recompute": "none", "recompute_layers": None,
         "first": False, "last": False, "inflight": 1, "hidden": 8, "ffn_hidden": 8, "heads": 2, "query_groups": 2,
         "vocab": 10, "mlp": "gelu"}
    assert signature_key(a) == signature_key({**a, "time_ms": 3.0, "source": "x", "recompute_layers": float("nan")})
    assert signature_key(a) != signature_key({**a, "layers": 3})
    # the one hash family, and the same key on every machine and run (stored resume keys depend on it)
    assert signature_key(a) == stable_hash("stage-signature", [a[c] for c in SIGNATURE_COLUMNS]) == "18db96402fb2587f"
    assert signature_key({**a, "tp": 1.0, "first": 0}) == signature_key(a)  # normalised values


def test_records_schema_imports_nothing_above_domain():
    tree = ast.parse(Path(records.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert [m for m in names if m.startswith("memx") and not m.startswith("memx.domain")] == []


def test_one_module_named_records():
    root = Path(memx.__file__).parent
    assert [p.relative_to(root).as_posix() for p in root.rglob("records.py")] == ["domain/records.py"]


def test_simulator_and_planner_share_the_schema():
    from memx.planner.signatures import SIGNATURE_COLUMNS as planner_columns
    from memx.simulator import STAGE_RUN_COLUMNS as simulator_columns
    from memx.simulator.stage import SIGNATURE_FIELDS

    assert planner_columns is SIGNATURE_COLUMNS and simulator_columns is STAGE_RUN_COLUMNS
    assert SIGNATURE_FIELDS == SIGNATURE_COLUMNS


def test_stage_runs_frame_dtypes_and_per_row_rejects():
    ok = {"gpu": "g", "tp": 1, "layers": 2, "micro_batch": 1, "seq_len": 8, "recompute": "full", "recompute_layers": 1,
          "first": False, "last": False, "inflight": 1, "hidden": 8, "ffn_hidden": 8, "heads": 2, "query_groups": 2,
          "vocab": 10, "mlp": "gelu", "time_ms": 1.5}
    bad = {**ok, "tp": 0, "mlp": "relu", "recompute": "sometimes"}
    failed_with_time = {**ok, "status": "oom"}
    df, rejects = validate_stage_runs(pd.DataFrame([ok, bad, failed_with_time]), source="t")
    assert list(df.columns) == list(STAGE_RUN_COLUMNS) and len(df) == 1
    assert {(r.row, r.column) for r in rejects} == {(1, "tp"), (1, "mlp"), (1, "recompute"), (2, "time_ms")}
    assert (df.tp.dtype, df.recompute_layers.dtype, df.peak_mem_mib.dtype) == ("int64", "Int64", "float64")
    assert (df.status.iloc[0], df.source.iloc[0], df.backend.iloc[0]) == ("ok", "t", "records")
    assert stage_runs_frame([]).tp.dtype == "int64"


def test_parse_json_line_and_megatron_logs():
    ok = parse_output('noise\n{"time_ms": 5.5, "peak_mem_mib": 100}\n', micro_batches=4)
    assert (ok.status, ok.time_ms, ok.peak_mem_mib) == ("ok", 5.5, 100.0)
    log = ("elapsed time per iteration (ms): 900.0 |\nelapsed time per iteration (ms): 400.0 |\n"
           "elapsed time per iteration (ms): 404.0 |\n"
           "[Rank 0] memory (MB) | allocated: 1000.0 | max allocated: 3000.5 | reserved: 4000.0\n")
    mg = parse_output(log, micro_batches=4)
    assert mg.status == "ok" and mg.time_ms == 402.0 / 4  # warm-up dropped, per micro batch
    assert (mg.peak_mem_mib, mg.static_mem_mib) == (3000.5, 1000.0)


def test_parse_oom_garbage_and_bad_json():
    assert parse_output("", "RuntimeError: CUDA out of memory. Tried", micro_batches=1).status == "oom"
    g = parse_output("hello\n", micro_batches=1)
    assert g.status == "failed" and "unparseable" in g.reason and g.time_ms is None
    b = parse_output('{"time_ms": "fast"}', micro_batches=1)
    assert b.status == "failed" and "time_ms" in b.reason
