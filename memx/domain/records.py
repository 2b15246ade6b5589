"""The measurement records schema: `stage_runs` and `config_runs` (docs/architecture.md §Measurement records).

Column names, statuses and allowed values, the dtypes of a table, the row builders every backend
uses, the resume key of a stage signature, and the validation of imported rows, which keeps the
valid ones and reports each rejected one (row, column, why). Imports nothing from memx above
`memx.domain`: the simulator and the profiler both take the schema from here.

Plausibility: integers within the spec bounds (`memx.domain.specs.MAX_*`), GPU names that are
catalog names, finite non-negative numbers, times ≤ `MAX_TIME_MS`, memory ≤ the GPU's memory when
the GPU is known and ≤ `MAX_GPU_MEMORY_MIB` in any case. An import where no row survives raises
`NothingUsable` (`require_rows`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
# pandas is imported by the functions that build frames: the planner reads the schema without it.

from memx.domain import specs
from memx.domain.errors import NothingUsable, short_repr
from memx.domain.experts import MAX_IMBALANCE
from memx.domain.nulls import is_missing
from memx.domain.moe_records import (MOE_COLUMNS, MOE_DEFAULTS, MOE_DERIVED, MOE_FLOAT_COLUMNS, MOE_INT_COLUMNS,
                                     MOE_INT_RANGES, moe_derived, moe_fields)
from memx.domain.hashing import stable_hash
from memx.domain.plan import PLAN_RECOMPUTE, Recompute
from memx.domain.specs import MLP_KINDS, gpu_name_problem

# --- stage_runs -------------------------------------------------------------------------------
SIGNATURE_COLUMNS = (
    "gpu", "tp", "layers", "micro_batch", "seq_len", "recompute", "recompute_layers", "first", "last",
    "inflight", "hidden", "ffn_hidden", "heads", "query_groups", "vocab", "mlp",
    "distributed_optimizer", "dp", "sequence_parallel", "tied_embeddings",
)  # a stage signature: the stage_runs input columns, the predictor's input
# Job options appended to the signature (issue #14): older rows and files take these defaults, and
# `signature_key` hashes them only when not default, so resume keys of older profiles stay valid.
# `tied_embeddings` (issue #23: the model's input embedding and output layer share one weight) is a model
# fact that changes an end stage only; absent, false (untied: what every row before it was read as).
OPTION_DEFAULTS: dict[str, Any] = {"distributed_optimizer": False, "dp": 1, "sequence_parallel": False,
                                   "tied_embeddings": False}
NUMBER_COLUMNS = ("time_ms", "peak_mem_mib", "static_mem_mib")  # null: not measured (failed, or time only)
# What time_ms measured (issue #16): `phase` forward | forward_backward (one micro batch, the default)
# | iteration (`micro_batches` micro batches); `forward_ms` / `backward_ms`: the split, where known.
PHASES = ("forward", "forward_backward", "iteration")
DEFAULT_PHASE = "forward_backward"
SPLIT_COLUMNS = ("forward_ms", "backward_ms")
MEASUREMENT_COLUMNS = ("phase", "micro_batches") + SPLIT_COLUMNS
STAGE_RUN_COLUMNS = (SIGNATURE_COLUMNS + NUMBER_COLUMNS + ("status", "reason", "backend", "measured_at", "source")
                     + MEASUREMENT_COLUMNS + MOE_COLUMNS)
INT_COLUMNS = ("tp", "layers", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads",
               "query_groups", "vocab", "dp")
BOOL_COLUMNS = ("first", "last", "distributed_optimizer", "sequence_parallel", "tied_embeddings")
TEXT_COLUMNS = ("reason", "source")

STATUSES = ("ok", "oom", "failed")  # oom / failed rows carry a reason and never a number
DONE_STATUSES = ("ok", "oom")  # measured: a resumed profile does not run these again
BACKENDS = ("simulated", "command", "torch", "records")
STAGE_RECOMPUTE = PLAN_RECOMPUTE  # a stage's level; Megatron's block method = full + recompute_layers

# Plausible ranges of the integer columns: (least, most); the upper bounds are the spec bounds.
INT_RANGES: dict[str, tuple[int, int]] = {
    "tp": (1, specs.MAX_TP), "layers": (0, specs.MAX_LAYERS), "micro_batch": (1, specs.MAX_MICRO_BATCH),
    "seq_len": (1, specs.MAX_SEQ_LEN), "inflight": (1, specs.MAX_PP), "hidden": (1, specs.MAX_WIDTH),
    "ffn_hidden": (1, specs.MAX_WIDTH), "heads": (1, specs.MAX_HEADS), "query_groups": (1, specs.MAX_HEADS),
    "vocab": (1, specs.MAX_VOCAB), "dp": (1, specs.MAX_CLUSTER_GPUS),
    "micro_batches": (1, specs.MAX_CLUSTER_GPUS * specs.MAX_MICRO_BATCH),  # iteration rows only
    **MOE_INT_RANGES,
}
MAX_TIME_MS = 86_400_000.0  # one micro batch through one stage: at most a day (real: ms to seconds)
MAX_MEMORY_MIB = specs.MAX_GPU_MEMORY_MIB  # any memory column, when the GPU's own memory is not known

# --- config_runs ------------------------------------------------------------------------------
CONFIG_RUN_COLUMNS = ("plan", "iteration_time_ms", "peak_mem_mib", "oom", "source", "seed", "reason", "measured_at")


def now_iso() -> str:
    """UTC ISO-8601 timestamp (seconds) for `measured_at`."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def option_array(table: Any, col: str) -> np.ndarray:
    """An option column (OPTION_DEFAULTS) of a signature table — a DataFrame or a mapping of numpy
    columns — as a numpy array: its default where the table predates the column or a cell is null."""
    default = OPTION_DEFAULTS[col]
    if col not in table:
        return np.full(len(table["gpu"]), default)
    values = table[col].to_numpy() if hasattr(table[col], "to_numpy") else np.asarray(table[col])
    if values.dtype == object or values.dtype.kind == "f":
        null = np.isnan(values) if values.dtype.kind == "f" else np.array([is_missing(v) for v in values], dtype=bool)
        if null.any():
            values = np.where(null, default, values)
    return values


def signature_arrays(table: Any) -> dict[str, np.ndarray]:
    """Every column of a signature table (a DataFrame or a mapping of columns) as a numpy array, the option
    columns filled (option_array) and recompute_layers as float64 with NaN where none (all layers)."""
    out = {k: (v.to_numpy() if hasattr(v := table[k], "to_numpy") else np.asarray(v)) for k in table.keys()}
    out.update({c: option_array(table, c) for c in OPTION_DEFAULTS})
    if "recompute_layers" in out:
        out["recompute_layers"] = nullable_floats(out["recompute_layers"])
    return out


def nullable_floats(values: Any) -> np.ndarray:
    """A column of numbers with nulls (None, pandas NA, NaN; nullable integers) as float64, NaN for null."""
    values = values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)
    if values.dtype.kind == "f":
        return values.astype(np.float64, copy=False)
    return np.array([np.nan if is_missing(v) else float(v) for v in values], dtype=np.float64)


def _norm(col: str, value: Any) -> Any:
    if col == "recompute_layers":
        return None if is_missing(value) else int(value)
    if col in BOOL_COLUMNS:
        return bool(value)
    if col in INT_COLUMNS:
        return int(value)
    return str(value)


def tied_on_ends(tied: Any, first: Any, last: Any) -> Any:
    """The canonical `tied_embeddings` of stages (scalars or numpy arrays): the model's flag on the stages that
    hold an end of the model (first or last), false on the others, which hold no embedding weight either way."""
    return np.logical_and(tied, np.logical_or(first, last))


def stage_options(point: Mapping[str, Any]) -> dict[str, Any]:
    """The option columns of a row or point, canonical: defaults where absent or null (older rows);
    `dp` 1 without the distributed optimizer (nothing else in a stage's cost depends on dp: the DP
    step is the plan's, docs/architecture.md §Closed-form model); `sequence_parallel` false at tp = 1
    (Megatron-LM disables it there); `tied_embeddings` false on a stage that holds neither end
    (tied_on_ends). Same stage ⇒ same options."""
    raw = {c: OPTION_DEFAULTS[c] if is_missing(point.get(c)) else point.get(c) for c in OPTION_DEFAULTS}
    do, sp, tp = raw["distributed_optimizer"], raw["sequence_parallel"], point.get("tp")
    tp_one = isinstance(tp, (int, float, np.number)) and not isinstance(tp, bool) and tp == 1
    ends = any(point.get(c) is True or point.get(c) is np.True_ for c in ("first", "last"))
    return {"distributed_optimizer": do, "dp": raw["dp"] if do is True or do is np.True_ else 1,
            "sequence_parallel": False if tp_one else sp, "tied_embeddings": raw["tied_embeddings"] if ends else False}


def signature_key(point: Mapping[str, Any]) -> str:
    """`stable_hash` of the signature columns (normalised): the resume key, same stage ⇒ same key.
    Option and MoE columns enter only when not default, so keys of rows older than them are unchanged."""
    base = [_norm(c, point.get(c)) for c in SIGNATURE_COLUMNS if c not in OPTION_DEFAULTS]
    options = [[c, _norm(c, v)] for c, v in stage_options(point).items() if _norm(c, v) != OPTION_DEFAULTS[c]]
    options += [[c, v] for c, v in moe_fields(point).items() if c in MOE_DEFAULTS and v != MOE_DEFAULTS[c]]
    return stable_hash("stage-signature", base + options if options else base)


def stage_run_row(point: Mapping[str, Any], *, status: str, backend: str, time_ms: float | None = None,
                  peak_mem_mib: float | None = None, static_mem_mib: float | None = None, reason: str = "",
                  measured_at: str | None = None, source: str | None = None, phase: str = DEFAULT_PHASE,
                  micro_batches: int | None = None, forward_ms: float | None = None,
                  backward_ms: float | None = None) -> dict[str, Any]:
    """One stage_runs row: the point's signature columns (options default) plus what was measured."""
    row = {**{c: point.get(c) for c in SIGNATURE_COLUMNS}, **stage_options(point), **moe_fields(point)}
    row.update(time_ms=time_ms, peak_mem_mib=peak_mem_mib, static_mem_mib=static_mem_mib, status=status,
               reason=reason, backend=backend, measured_at=measured_at or now_iso(),
               source=point.get("source", "") if source is None else source, phase=phase,
               micro_batches=micro_batches, forward_ms=forward_ms, backward_ms=backward_ms)
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
    recompute_layers and micro_batches Int64 (NA = all layers / not an iteration row), numbers float64
    (NaN = null), reason/source text. Columns older tables lack take their defaults (options, phase)."""
    import pandas as pd

    records = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else list(rows)
    df = pd.DataFrame(records, columns=list(STAGE_RUN_COLUMNS))
    for col, default in {**OPTION_DEFAULTS, **MOE_DEFAULTS, "phase": DEFAULT_PHASE}.items():
        df[col] = df[col].where(df[col].notna(), default)
    for col in MOE_INT_COLUMNS:
        df[col] = df[col].astype("int64")
    for col in MOE_FLOAT_COLUMNS:
        df[col] = pd.to_numeric(df[col]).astype("float64")
    for col, values in moe_derived(df).items():
        df[col] = values
    for col in NUMBER_COLUMNS + SPLIT_COLUMNS:
        df[col] = pd.to_numeric(df[col]).astype("float64")
    for col in ("recompute_layers", "micro_batches"):
        df[col] = df[col].astype("Int64")
    for col in BOOL_COLUMNS:
        df[col] = df[col].astype(bool)
    for col in INT_COLUMNS:
        df[col] = df[col].astype("int64")
    for col in TEXT_COLUMNS + ("phase",):
        df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
    return df


def with_record_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the option and measurement columns it lacks added at their defaults (tables written
    before issues #14/#16), nulls in them (rows concatenated from such tables) at their defaults too;
    other columns untouched."""
    import pandas as pd

    missing = {c: (df[c].where(df[c].notna(), v) if c in df.columns else v)
               for c, v in {**OPTION_DEFAULTS, **MOE_DEFAULTS, "phase": DEFAULT_PHASE}.items()
               if c not in df.columns or df[c].isna().any()}
    missing.update({c: 0.0 for c in MOE_DERIVED if c not in df.columns})  # dense, or filled by moe_fields
    if "micro_batches" not in df.columns:
        missing["micro_batches"] = pd.Series(pd.NA, index=df.index, dtype="Int64")
    missing.update({c: np.nan for c in SPLIT_COLUMNS if c not in df.columns})
    return df.assign(**missing) if missing else df


def empty_stage_runs() -> pd.DataFrame:
    return stage_runs_frame([])


def config_runs_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A config_runs table: plan JSON string, time (NaN = failed), per-GPU peak list (None on OOM), oom."""
    import pandas as pd

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
    gpu: str = ""  # the row's GPU name as given (a per-type verdict: every row of one type rejected)


def _allowed(value: Any, allowed: Sequence[str]) -> str | None:
    return None if value in allowed else f"allowed: {', '.join(allowed)}; got {short_repr(value)}"


def _int_problem(col: str, value: Any) -> str | None:
    least, most = INT_RANGES[col]
    try:
        ok = not is_missing(value) and float(value).is_integer() and least <= float(value) <= most
    except (TypeError, ValueError, OverflowError):
        ok = False
    return None if ok else f"must be an integer in {least}..{most}; got {short_repr(value)}"


def _check_value(col: str, value: Any) -> str | None:
    if col in INT_COLUMNS:
        return _int_problem(col, value)
    if col in BOOL_COLUMNS:
        return None if isinstance(value, (bool, np.bool_)) else f"must be true or false; got {short_repr(value)}"
    if col == "recompute":
        return _allowed(value, STAGE_RECOMPUTE)
    if col == "mlp":
        return _allowed(value, MLP_KINDS)
    if col == "gpu":
        return None if (p := gpu_name_problem(value)) is None else f"{p}; got {short_repr(value)}"
    return None


def _number_problem(col: str, value: Any, memory_mib: float | None) -> str | None:
    """Why a measured number is implausible: not finite, negative, or above its bound."""
    if is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or not math.isfinite(value) or value < 0:
        return f"must be a finite number ≥ 0 or null; got {short_repr(value)}"
    most, what = (MAX_TIME_MS, "a day") if col == "time_ms" else \
        ((memory_mib, "the GPU's memory") if memory_mib is not None else (MAX_MEMORY_MIB, "16 TiB"))
    return None if value <= most else f"must be ≤ {most:.12g} ({what}); got {short_repr(value)}"


def measurement_problems(row: Mapping[str, Any], gpu_memory_mib: Mapping[str, float]) -> list[tuple[str, str]]:
    """(column, why) for the measured part of a row: status, backend, and plausible numbers."""
    status = row.get("status", "ok")
    problems = [("status", p)] if (p := _allowed(status, STATUSES)) else []
    if not is_missing(row.get("backend")) and (p := _allowed(row.get("backend"), BACKENDS)):
        problems.append(("backend", p))
    memory = gpu_memory_mib.get(row.get("gpu"))
    problems += [(col, p) for col in NUMBER_COLUMNS if (p := _number_problem(col, row.get(col), memory))]
    if status == "ok" and is_missing(row.get("time_ms")):
        problems.append(("time_ms", "is null on an 'ok' row (time-only rows may omit memory, not time)"))
    if status != "ok" and not is_missing(row.get("time_ms")):
        problems.append(("time_ms", f"is a number on a '{status}' row: failed points carry no numbers"))
    return problems + phase_problems(row)


def phase_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(column, why) for what a row says it measured: `phase`, `micro_batches`, the forward/backward split."""
    phase = row.get("phase", DEFAULT_PHASE)
    phase = DEFAULT_PHASE if is_missing(phase) else phase
    if p := _allowed(phase, PHASES):
        return [("phase", p)]
    problems = [(c, p) for c in SPLIT_COLUMNS if (p := _number_problem("time_ms", row.get(c), None))]
    mb = row.get("micro_batches")
    if phase == "iteration":
        if _int_problem("micro_batches", mb) if not is_missing(mb) else True:
            problems.append(("micro_batches", f"must be an integer ≥ 1 on an 'iteration' row; got {short_repr(mb)}"))
    elif not is_missing(mb) and mb != 1:
        problems.append(("micro_batches", f"is {short_repr(mb)} on a '{phase}' row: only 'iteration' rows time "
                                          "several micro batches"))
    if phase == "forward" and not is_missing(row.get("backward_ms")):
        problems.append(("backward_ms", "is a number on a 'forward' row: a forward-only row has no backward time"))
    parts, total = [row.get(c) for c in SPLIT_COLUMNS], row.get("time_ms")
    if phase == "forward_backward" and not problems and not any(map(is_missing, parts + [total])) \
            and abs(sum(parts) - total) > 0.01 * total + 1e-6:
        problems.append(("time_ms", f"is not forward_ms + backward_ms ({parts[0]:.6g} + {parts[1]:.6g}) "
                                    f"on a 'forward_backward' row; got {short_repr(total)}"))
    return problems


def row_problems(row: Mapping[str, Any], gpu_memory_mib: Mapping[str, float] | None = None) -> list[tuple[str, str]]:
    """(column, why) for everything wrong with one stage_runs row; [] for a valid row.

    `gpu_memory_mib` (GPU name → device memory, MiB): peaks of known GPUs must fit in it. An option column
    absent from the row is its default (OPTION_DEFAULTS: a row from before it)."""
    problems = [(c, p) for c in SIGNATURE_COLUMNS if c != "recompute_layers"
                and (p := _check_value(c, row.get(c, OPTION_DEFAULTS.get(c))))]
    if problems:
        return problems
    rl = row.get("recompute_layers")
    if not is_missing(rl) and (row["recompute"] != Recompute.FULL or not float(rl).is_integer() or not 0 <= rl <= row["layers"]):
        problems.append(("recompute_layers", f"needs recompute 'full' and 0..layers ({row['layers']}); "
                                              f"got {short_repr(rl)}"))
    if int(row["layers"]) == 0 and not (row["first"] or row["last"]):
        problems.append(("layers", "is 0: the row must then measure the embedding (first) or output layer (last)"))
    return problems + moe_problems(row) + measurement_problems(row, gpu_memory_mib or {})


def moe_problems(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(column, why) for the MoE columns of a row (absent or null: a dense stage): integers in range, finite
    non-negative numbers, and on a MoE row (num_experts > 0) what memx.domain.experts and Megatron-LM require:
    1 ≤ moe_router_topk ≤ num_experts, moe_ffn_hidden > 0, 1 ≤ moe_load_imbalance ≤ 64, ep dividing num_experts."""
    given = {c: row.get(c) for c in MOE_DEFAULTS if not is_missing(row.get(c))}
    problems = [(c, p) for c in MOE_INT_COLUMNS if c in given and (p := _int_problem(c, given[c]))]
    problems += [(c, p) for c in MOE_FLOAT_COLUMNS if c in given and (p := _number_problem("a2a", given[c], None))]
    if problems or not given.get("num_experts"):
        return problems
    f = {**MOE_DEFAULTS, **given}
    e = int(f["num_experts"])
    if not 1 <= f["moe_router_topk"] <= e:
        problems.append(("moe_router_topk", f"must be in 1..num_experts ({e}); got {short_repr(f['moe_router_topk'])}"))
    if not f["moe_ffn_hidden"]:
        problems.append(("moe_ffn_hidden", "must be > 0 on a row with experts (one routed expert's MLP size)"))
    if not 1 <= f["moe_load_imbalance"] <= MAX_IMBALANCE:
        problems.append(("moe_load_imbalance", f"must be in 1..{MAX_IMBALANCE:g}; got {short_repr(f['moe_load_imbalance'])}"))
    if e % int(f["expert_parallel"]):
        problems.append(("expert_parallel", f"must divide num_experts ({e}); got {short_repr(f['expert_parallel'])}"))
    return problems


def _clean(row: Mapping[str, Any]) -> dict[str, Any]:
    """Nulls as None, CSV text booleans as booleans, a missing status as 'ok', missing options and
    phase as their defaults (older files)."""
    out = {k: (None if is_missing(v) else v) for k, v in row.items()}
    for col in BOOL_COLUMNS:
        if isinstance(out.get(col), str) and out[col].lower() in ("true", "false"):
            out[col] = out[col].lower() == "true"
    out.update(stage_options(out))
    out.update({c: d for c, d in MOE_DEFAULTS.items() if out.get(c) is None})  # a dense stage (older files)
    out["phase"] = out.get("phase") or DEFAULT_PHASE
    out["status"] = out.get("status") or "ok"
    return out


def validate_stage_runs(raw: pd.DataFrame, *, backend: str = "records", source: str = "", file: str = "",
                        gpu_memory_mib: Mapping[str, float] | None = None) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """Keep valid rows of an imported table, fill optional columns, report the rest.

    Required: the signature columns except `recompute_layers` and the options, and `time_ms` on ok rows.
    Optional (filled): recompute_layers (null), distributed_optimizer (false), dp (1),
    sequence_parallel (false), tied_embeddings (false), phase (forward_backward), micro_batches / forward_ms / backward_ms
    (null; micro_batches required on iteration rows), peak_mem_mib / static_mem_mib (null: time-only),
    status ('ok'), reason (''), backend (`backend`), measured_at (now), source (`source`).
    `gpu_memory_mib`: device memory of the GPUs known (e.g. the cluster's), MiB, for the peak check.
    """
    missing = [c for c in SIGNATURE_COLUMNS if c != "recompute_layers" and c not in OPTION_DEFAULTS
               and c not in raw.columns]
    if missing:
        return empty_stage_runs(), [RejectedRow(row=-1, column=c, reason="required column missing", file=file)
                                    for c in missing]
    keep, rejects, stamp = [], [], now_iso()
    for i, row in enumerate(raw.to_dict("records")):
        row = _clean(row)
        problems = row_problems(row, gpu_memory_mib)
        if problems:
            gpu = str(row.get("gpu", ""))[:specs.MAX_GPU_NAME_CHARS]
            rejects.extend(RejectedRow(row=i, column=c, reason=p, file=file, gpu=gpu) for c, p in problems)
            continue
        row.update(backend=row.get("backend") or backend, measured_at=row.get("measured_at") or stamp,
                   source=row.get("source") or source, reason=row.get("reason") or "")
        keep.append(row)
    return stage_runs_frame(keep), rejects


def reject_line(r: RejectedRow) -> str:
    """One rejected (row, column) in words: file, row, column and why."""
    where = f"{r.file}: " if r.file else ""
    return f"{where}{'header' if r.row < 0 else f'row {r.row}'}, column '{r.column}': {r.reason}"


def format_rejects(rejects: Sequence[RejectedRow], limit: int = 20) -> str:
    """Human report: one line per rejected (row, column)."""
    lines = [f"{len({(r.file, r.row) for r in rejects})} row(s) rejected:"]
    lines += [f"  {reject_line(r)}" for r in rejects[:limit]]
    if len(rejects) > limit:
        lines.append(f"  … and {len(rejects) - limit} more")
    return "\n".join(lines)


def reason_class(reason: str) -> str:
    """A reason without the offending value ("…; got X"): what rejects and failures are counted by."""
    return reason.split("; got ")[0]


def nothing_usable(rejects: Sequence[RejectedRow], *, what: str, examples: int = 3) -> NothingUsable:
    """The error for an import where no row survived: counts per (column, reason), the first rows."""
    counts = Counter(f"column '{r.column}': {reason_class(r.reason)}" for r in rejects)
    rows = len({(r.file, r.row) for r in rejects})
    return NothingUsable(f"{what}: all {rows} row(s) rejected" if rejects else f"{what}: no rows",
                         counts, [reject_line(r) for r in rejects[:examples]])


def require_rows(df: pd.DataFrame, rejects: Sequence[RejectedRow], *, what: str) -> pd.DataFrame:
    """`df` when it holds a row; else raise `NothingUsable` summarising why every row was rejected."""
    if len(df) == 0:
        raise nothing_usable(rejects, what=what)
    return df
