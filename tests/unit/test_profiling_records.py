"""The records schema (memx.domain.records), validation of imported stage_runs and the Megatron /
JSON output parsers."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

import memx
import memx.domain.records as records
from memx.domain.errors import NothingUsable
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
    # (the option columns, issue #14, enter only when not default: this key predates them)
    old = [a[c] for c in SIGNATURE_COLUMNS if c not in records.OPTION_DEFAULTS]
    assert signature_key(a) == stable_hash("stage-signature", old) == "18db96402fb2587f"
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
    # the simulator's signature also takes the plan's precision (issue #23), which records do not carry
    assert SIGNATURE_FIELDS == (*SIGNATURE_COLUMNS, "precision")


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


# Real out-of-memory messages, as PyTorch / CUDA / HIP / XLA / TensorFlow / NCCL print them.
OOM_LINES = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)",
    "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 3; 31.75 GiB total capacity)",
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 191.98 GiB",
    "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity)",
    "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 256.00 MiB",
    "RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.20 GB)",
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: HIP error: out of memory",
    "cudaErrorMemoryAllocation: out of memory",
    "hipErrorOutOfMemory (2) at /src/alloc.cpp:42",
    "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.",
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 17.5G of 15.48G hbm.",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[8,4096]",
    "node-1:123:456 [0] include/alloc.h:99 NCCL WARN Cuda failure 2 'out of memory'",
    "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB",
]
# Lines with the words but no out-of-memory error: none of them may make a point an OOM.
NEAR_MISSES = [
    "0 out of memory events",
    "out of memory events: 0",
    "checking for CUDA out of memory errors: none found",
    "CUDA out of memory retries: 0",
    "torch.cuda.OutOfMemoryError handler installed",
    "OOM count: 0 | max allocated: 3000.5",
    "no RESOURCE_EXHAUSTED errors in 40 steps",
    "hipErrorOutOfMemoryCount=0",
    "java.lang.OutOfMemoryError: Java heap space (data loader, host side)",
    "[W] memory budget: 70 of 80 GiB used, not out of memory",
]
GOOD = '{"time_ms": 5.5, "peak_mem_mib": 100}'


@pytest.mark.parametrize("line", OOM_LINES)
def test_real_oom_messages_are_oom(line):
    for out, err in ((line, ""), ("", f"Traceback (most recent call last):\n  ...\n{line}\n")):
        parsed = parse_output(out, err, micro_batches=1)
        assert parsed.status == "oom" and line[:60] in parsed.reason


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_miss_lines_are_not_oom(line):
    parsed = parse_output(f"{GOOD}\n{line}\n", line, micro_batches=1)  # a result, then the log line
    assert (parsed.status, parsed.time_ms) == ("ok", 5.5)


def test_implausible_rows_are_rejected_with_a_reason_each():
    base = dict(gpu="a100-80g", tp=1, layers=1, micro_batch=1, seq_len=4096, recompute="none", first=False,
                last=False, inflight=1, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32, vocab=32000,
                mlp="swiglu", time_ms=10.0, peak_mem_mib=1000.0)
    bad = [{"peak_mem_mib": 6e9}, {"peak_mem_mib": 81 * 1024.0}, {"layers": 1e15}, {"gpu": "../../etc/passwd"},
           {"gpu": "x" * 65}, {"time_ms": float("inf")}, {"time_ms": -1.0}, {"static_mem_mib": -1.0},
           {"tp": 4096}, {"seq_len": 1e308}, {"backend": "evil"}, {"time_ms": 1e12}]
    df, rejects = validate_stage_runs(pd.DataFrame([base] + [{**base, **b} for b in bad]),
                                      gpu_memory_mib={"a100-80g": 80 * 1024.0})
    assert len(df) == 1 and df.iloc[0].peak_mem_mib == 1000.0
    assert {r.row for r in rejects} == set(range(1, len(bad) + 1))  # every bad row, each with its reason
    by_row = {r.row: (r.column, r.reason) for r in rejects}
    assert by_row[1][0] == by_row[2][0] == "peak_mem_mib" and "the GPU's memory" in by_row[2][1]
    assert by_row[4] == ("gpu", by_row[4][1]) and "no '/'" in by_row[4][1]
    assert by_row[3][0] == "layers" and by_row[9][0] == "tp" and by_row[11][0] == "backend"


def test_an_import_with_nothing_left_raises_nothing_usable():
    rejects = [records.RejectedRow(row=i, column="gpu", reason=f"must match x; got 'G{i}'", file="f.csv")
               for i in range(5)]
    with pytest.raises(NothingUsable) as e:
        records.require_rows(records.empty_stage_runs(), rejects, what="records f.csv")
    assert e.value.exit_code == 5 and e.value.counts == {"column 'gpu': must match x": 5}
    assert "all 5 row(s) rejected" in str(e.value) and len(e.value.examples) == 3
