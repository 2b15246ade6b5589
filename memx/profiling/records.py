"""stage_runs rows: signature keys, row builders and schema validation (DESIGN.md §3).

Every backend returns rows with exactly `STAGE_RUN_COLUMNS`; imported tables go through
`validate_stage_runs`, which keeps the valid rows and reports each rejected one (row, column, why).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from memx.planner.signatures import SIGNATURE_COLUMNS
from memx.simulator import STAGE_RUN_COLUMNS, stage_runs_frame

STATUSES = ("ok", "oom", "failed")
BACKEND_NAMES = ("simulated", "command", "torch", "records")
RECOMPUTE = ("none", "selective", "full")
MLPS = ("swiglu", "gelu")
INT_COLUMNS = ("tp", "layers", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads",
               "query_groups", "vocab")
NUMBER_COLUMNS = ("time_ms", "peak_mem_mib", "static_mem_mib")

__all__ = ["STAGE_RUN_COLUMNS", "SIGNATURE_COLUMNS", "RejectedRow", "signature_key", "failed_row",
           "now_iso", "empty_stage_runs", "to_stage_runs", "validate_stage_runs", "format_rejects"]


def now_iso() -> str:
    """UTC ISO-8601 timestamp (seconds) for `measured_at`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _norm(col: str, value: Any) -> Any:
    if col == "recompute_layers":
        return None if _missing(value) else int(value)
    if col in ("first", "last"):
        return bool(value)
    if col in INT_COLUMNS:
        return int(value)
    return str(value)


def signature_key(point: Mapping[str, Any]) -> str:
    """Stable hash of the signature columns: the resume key (same stage ⇒ same key)."""
    values = [_norm(c, point.get(c)) for c in SIGNATURE_COLUMNS]
    return hashlib.sha1(json.dumps(values).encode()).hexdigest()[:16]


def failed_row(point: Mapping[str, Any], *, status: str, reason: str, backend: str,
               measured_at: str | None = None) -> dict[str, Any]:
    """A row for a point that produced no numbers (status oom or failed) — never a number."""
    row = {c: point.get(c) for c in SIGNATURE_COLUMNS}
    row.update(time_ms=None, peak_mem_mib=None, static_mem_mib=None, status=status, reason=reason,
               backend=backend, measured_at=measured_at or now_iso(), source=point.get("source", ""))
    return row


def ok_row(point: Mapping[str, Any], *, time_ms: float, peak_mem_mib: float | None,
           static_mem_mib: float | None, backend: str, reason: str = "") -> dict[str, Any]:
    row = {c: point.get(c) for c in SIGNATURE_COLUMNS}
    row.update(time_ms=time_ms, peak_mem_mib=peak_mem_mib, static_mem_mib=static_mem_mib, status="ok",
               reason=reason, backend=backend, measured_at=now_iso(), source=point.get("source", ""))
    return row


def empty_stage_runs() -> pd.DataFrame:
    return stage_runs_frame([])


def to_stage_runs(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Rows → a stage_runs DataFrame with exactly STAGE_RUN_COLUMNS and their dtypes."""
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else list(rows)
    df = stage_runs_frame(records)
    for col in INT_COLUMNS:
        df[col] = df[col].astype("int64")
    for col in ("reason", "source"):
        df[col] = df[col].fillna("").astype(str)
    return df


@dataclass(frozen=True, kw_only=True)
class RejectedRow:
    """One imported row that failed validation: its index in the input, the column and why."""

    row: int
    column: str
    reason: str
    file: str = ""


def _check_value(col: str, value: Any) -> str | None:
    if col in INT_COLUMNS:
        minimum = 0 if col == "layers" else 1
        try:
            ok = not _missing(value) and float(value).is_integer() and float(value) >= minimum
        except (TypeError, ValueError):
            ok = False
        return None if ok else f"must be an integer ≥ {minimum}, got {value!r}"
    if col in ("first", "last"):
        return None if isinstance(value, (bool, np.bool_)) else f"must be true or false, got {value!r}"
    if col == "recompute":
        return None if value in RECOMPUTE else f"is {value!r}; allowed: {', '.join(RECOMPUTE)}"
    if col == "mlp":
        return None if value in MLPS else f"is {value!r}; allowed: {', '.join(MLPS)}"
    if col == "gpu":
        return None if isinstance(value, str) and value else f"must be a non-empty GPU name, got {value!r}"
    return None


def _row_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = [(c, p) for c in SIGNATURE_COLUMNS if c != "recompute_layers" and (p := _check_value(c, row.get(c)))]
    if problems:
        return problems
    rl = row.get("recompute_layers")
    if not _missing(rl) and (row["recompute"] != "full" or not float(rl).is_integer() or not 0 <= rl <= row["layers"]):
        problems.append(("recompute_layers", f"{rl!r} needs recompute 'full' and 0..layers ({row['layers']})"))
    if int(row["layers"]) == 0 and not (row["first"] or row["last"]):
        problems.append(("layers", "is 0: the row must then measure the embedding (first) or output layer (last)"))
    status = row.get("status", "ok")
    if status not in STATUSES:
        problems.append(("status", f"is {status!r}; allowed: {', '.join(STATUSES)}"))
    for col in NUMBER_COLUMNS:
        v = row.get(col)
        if not _missing(v) and (not isinstance(v, (int, float, np.number)) or v < 0 or not math.isfinite(v)):
            problems.append((col, f"must be a finite number ≥ 0 or null, got {v!r}"))
    if status == "ok" and _missing(row.get("time_ms")):
        problems.append(("time_ms", "is null on an 'ok' row (time-only rows may omit memory, not time)"))
    if status != "ok" and not _missing(row.get("time_ms")):
        problems.append(("time_ms", f"is a number on a '{status}' row: failed points carry no numbers"))
    return problems


def validate_stage_runs(raw: pd.DataFrame, *, backend: str = "records", source: str = "",
                        file: str = "") -> tuple[pd.DataFrame, list[RejectedRow]]:
    """Keep valid rows of an imported table, fill optional columns, report the rest.

    Required: the signature columns except `recompute_layers`, and `time_ms` on ok rows.
    Optional (filled): recompute_layers (null), peak_mem_mib / static_mem_mib (null: time-only),
    status ('ok'), reason (''), backend (`backend`), measured_at (now), source (`source`).
    """
    missing = [c for c in SIGNATURE_COLUMNS if c != "recompute_layers" and c not in raw.columns]
    if missing:
        rejects = [RejectedRow(row=-1, column=c, reason="required column missing", file=file) for c in missing]
        return empty_stage_runs(), rejects
    keep, rejects, stamp = [], [], now_iso()
    for i, row in enumerate(raw.to_dict("records")):
        row = {k: (None if _missing(v) else v) for k, v in row.items()}
        for col in ("first", "last"):  # CSV text booleans
            if isinstance(row.get(col), str) and row[col].lower() in ("true", "false"):
                row[col] = row[col].lower() == "true"
        row.setdefault("status", "ok")
        row["status"] = row["status"] or "ok"
        problems = _row_problems(row)
        if problems:
            rejects.extend(RejectedRow(row=i, column=c, reason=p, file=file) for c, p in problems)
            continue
        row["backend"] = row.get("backend") or backend
        row["measured_at"] = row.get("measured_at") or stamp
        row["source"] = row.get("source") or source
        row["reason"] = row.get("reason") or ""
        keep.append(row)
    return to_stage_runs(keep), rejects


def format_rejects(rejects: Sequence[RejectedRow], limit: int = 20) -> str:
    """Human report: one line per rejected (row, column)."""
    lines = [f"{len({(r.file, r.row) for r in rejects})} row(s) rejected:"]
    for r in rejects[:limit]:
        where = f"{r.file}: " if r.file else ""
        row = "header" if r.row < 0 else f"row {r.row}"
        lines.append(f"  {where}{row}, column '{r.column}': {r.reason}")
    if len(rejects) > limit:
        lines.append(f"  … and {len(rejects) - limit} more")
    return "\n".join(lines)
