"""The measurement records schema: `stage_runs` and `config_runs` (docs/architecture.md §Measurement records).

Column names, statuses and allowed values, the dtypes of a table, the row builders every backend
uses, the resume key of a stage signature, and the validation of imported rows, which keeps the
valid ones and reports each rejected one (row, column, why). Imports nothing from memx above
`memx.domain`: the simulator and the profiler both take the schema from here.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from memx.domain.hashing import stable_hash
from memx.domain.plan import PLAN_RECOMPUTE, Recompute
from memx.domain.specs import MLP_KINDS

# --- stage_runs -------------------------------------------------------------------------------
SIGNATURE_COLUMNS = (
    "gpu", "tp", "layers", "micro_batch", "seq_len", "recompute", "recompute_layers", "first", "last",
    "inflight", "hidden", "ffn_hidden", "heads", "query_groups", "vocab", "mlp",
)  # a stage signature: the stage_runs input columns, the predictor's input
NUMBER_COLUMNS = ("time_ms", "peak_mem_mib", "static_mem_mib")  # null: not measured (failed, or time only)
STAGE_RUN_COLUMNS = SIGNATURE_COLUMNS + NUMBER_COLUMNS + ("status", "reason", "backend", "measured_at", "source")
INT_COLUMNS = ("tp", "layers", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads",
               "query_groups", "vocab")
BOOL_COLUMNS = ("first", "last")
TEXT_COLUMNS = ("reason", "source")

STATUSES = ("ok", "oom", "failed")  # oom / failed rows carry a reason and never a number
DONE_STATUSES = ("ok", "oom")  # measured: a resumed profile does not run these again
BACKENDS = ("simulated", "command", "torch", "records")
STAGE_RECOMPUTE = PLAN_RECOMPUTE  # a stage's level; Megatron's block method = full + recompute_layers

# --- config_runs ------------------------------------------------------------------------------
CONFIG_RUN_COLUMNS = ("plan", "iteration_time_ms", "peak_mem_mib", "oom", "source", "seed", "reason", "measured_at")


def now_iso() -> str:
    """UTC ISO-8601 timestamp (seconds) for `measured_at`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def is_missing(value: Any) -> bool:
    """None, pandas NA or NaN: a null cell."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _norm(col: str, value: Any) -> Any:
    if col == "recompute_layers":
        return None if is_missing(value) else int(value)
    if col in BOOL_COLUMNS:
        return bool(value)
    if col in INT_COLUMNS:
        return int(value)
    return str(value)


def signature_key(point: Mapping[str, Any]) -> str:
    """`stable_hash` of the signature columns (normalised): the resume key, same stage ⇒ same key."""
    return stable_hash("stage-signature", [_norm(c, point.get(c)) for c in SIGNATURE_COLUMNS])


def stage_run_row(point: Mapping[str, Any], *, status: str, backend: str, time_ms: float | None = None,
                  peak_mem_mib: float | None = None, static_mem_mib: float | None = None, reason: str = "",
                  measured_at: str | None = None, source: str | None = None) -> dict[str, Any]:
    """One stage_runs row: the point's signature columns plus what was measured."""
    row = {c: point.get(c) for c in SIGNATURE_COLUMNS}
    row.update(time_ms=time_ms, peak_mem_mib=peak_mem_mib, static_mem_mib=static_mem_mib, status=status,
               reason=reason, backend=backend, measured_at=measured_at or now_iso(),
               source=point.get("source", "") if source is None else source)
    return row


def ok_row(point: Mapping[str, Any], *, time_ms: float, peak_mem_mib: float | None,
           static_mem_mib: float | None, backend: str, reason: str = "") -> dict[str, Any]:
    """A measured point (memory may be null: time-only measurements)."""
    return stage_run_row(point, status="ok", backend=backend, time_ms=time_ms, peak_mem_mib=peak_mem_mib,
                         static_mem_mib=static_mem_mib, reason=reason)


def failed_row(point: Mapping[str, Any], *, status: str, reason: str, backend: str,
               measured_at: str | None = None) -> dict[str, Any]:
    """A row for a point that produced no numbers (status oom or failed) — never a number."""
    return stage_run_row(point, status=status, backend=backend, reason=reason, measured_at=measured_at)


def stage_runs_frame(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """A stage_runs table with exactly STAGE_RUN_COLUMNS and their dtypes: integers int64,
    recompute_layers Int64 (NA = all layers), numbers float64 (NaN = null), reason/source text."""
    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else list(rows)
    df = pd.DataFrame(records, columns=list(STAGE_RUN_COLUMNS))
    for col in NUMBER_COLUMNS:
        df[col] = df[col].astype("float64")
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    for col in BOOL_COLUMNS:
        df[col] = df[col].astype(bool)
    for col in INT_COLUMNS:
        df[col] = df[col].astype("int64")
    for col in TEXT_COLUMNS:
        df[col] = df[col].fillna("").astype(str)
    return df


def empty_stage_runs() -> pd.DataFrame:
    return stage_runs_frame([])


def config_runs_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A config_runs table: plan JSON string, time (NaN = failed), per-GPU peak list (None on OOM), oom."""
    df = pd.DataFrame(list(rows), columns=list(CONFIG_RUN_COLUMNS))
    df["iteration_time_ms"] = df["iteration_time_ms"].astype("float64")
    df["oom"] = df["oom"].astype(bool)
    df["seed"] = df["seed"].astype("int64")
    return df


# --- validation of imported stage_runs ----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RejectedRow:
    """One imported row that failed validation: its index in the input (-1: the header), the column and why."""

    row: int
    column: str
    reason: str
    file: str = ""


def _allowed(value: Any, allowed: Sequence[str]) -> str | None:
    return None if value in allowed else f"is {value!r}; allowed: {', '.join(allowed)}"


def _check_value(col: str, value: Any) -> str | None:
    if col in INT_COLUMNS:
        minimum = 0 if col == "layers" else 1
        try:
            ok = not is_missing(value) and float(value).is_integer() and float(value) >= minimum
        except (TypeError, ValueError):
            ok = False
        return None if ok else f"must be an integer ≥ {minimum}, got {value!r}"
    if col in BOOL_COLUMNS:
        return None if isinstance(value, (bool, np.bool_)) else f"must be true or false, got {value!r}"
    if col == "recompute":
        return _allowed(value, STAGE_RECOMPUTE)
    if col == "mlp":
        return _allowed(value, MLP_KINDS)
    if col == "gpu":
        return None if isinstance(value, str) and value else f"must be a non-empty GPU name, got {value!r}"
    return None


def _measurement_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    status = row.get("status", "ok")
    problems = [("status", p)] if (p := _allowed(status, STATUSES)) else []
    for col in NUMBER_COLUMNS:
        v = row.get(col)
        if not is_missing(v) and (not isinstance(v, (int, float, np.number)) or v < 0 or not math.isfinite(v)):
            problems.append((col, f"must be a finite number ≥ 0 or null, got {v!r}"))
    if status == "ok" and is_missing(row.get("time_ms")):
        problems.append(("time_ms", "is null on an 'ok' row (time-only rows may omit memory, not time)"))
    if status != "ok" and not is_missing(row.get("time_ms")):
        problems.append(("time_ms", f"is a number on a '{status}' row: failed points carry no numbers"))
    return problems


def row_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(column, why) for everything wrong with one stage_runs row; [] for a valid row."""
    problems = [(c, p) for c in SIGNATURE_COLUMNS if c != "recompute_layers" and (p := _check_value(c, row.get(c)))]
    if problems:
        return problems
    rl = row.get("recompute_layers")
    if not is_missing(rl) and (row["recompute"] != Recompute.FULL or not float(rl).is_integer() or not 0 <= rl <= row["layers"]):
        problems.append(("recompute_layers", f"{rl!r} needs recompute 'full' and 0..layers ({row['layers']})"))
    if int(row["layers"]) == 0 and not (row["first"] or row["last"]):
        problems.append(("layers", "is 0: the row must then measure the embedding (first) or output layer (last)"))
    return problems + _measurement_problems(row)


def _clean(row: Mapping[str, Any]) -> dict[str, Any]:
    """Nulls as None, CSV text booleans as booleans, a missing status as 'ok'."""
    out = {k: (None if is_missing(v) else v) for k, v in row.items()}
    for col in BOOL_COLUMNS:
        if isinstance(out.get(col), str) and out[col].lower() in ("true", "false"):
            out[col] = out[col].lower() == "true"
    out["status"] = out.get("status") or "ok"
    return out


def validate_stage_runs(raw: pd.DataFrame, *, backend: str = "records", source: str = "",
                        file: str = "") -> tuple[pd.DataFrame, list[RejectedRow]]:
    """Keep valid rows of an imported table, fill optional columns, report the rest.

    Required: the signature columns except `recompute_layers`, and `time_ms` on ok rows.
    Optional (filled): recompute_layers (null), peak_mem_mib / static_mem_mib (null: time-only),
    status ('ok'), reason (''), backend (`backend`), measured_at (now), source (`source`).
    """
    missing = [c for c in SIGNATURE_COLUMNS if c != "recompute_layers" and c not in raw.columns]
    if missing:
        return empty_stage_runs(), [RejectedRow(row=-1, column=c, reason="required column missing", file=file)
                                    for c in missing]
    keep, rejects, stamp = [], [], now_iso()
    for i, row in enumerate(raw.to_dict("records")):
        row = _clean(row)
        problems = row_problems(row)
        if problems:
            rejects.extend(RejectedRow(row=i, column=c, reason=p, file=file) for c, p in problems)
            continue
        row.update(backend=row.get("backend") or backend, measured_at=row.get("measured_at") or stamp,
                   source=row.get("source") or source, reason=row.get("reason") or "")
        keep.append(row)
    return stage_runs_frame(keep), rejects


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
