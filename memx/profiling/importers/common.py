"""Shared pieces of the profile importers: file discovery, strict JSON/key checks, GPU name mapping,
the composition of per-layer entries into stage rows, and the frame with the `phase` extra columns.

Every importer turns one source file into `FileRows` (rows built with `memx.domain.records.ok_row`,
plus the entries it knowingly leaves out, with why); `to_frame` validates the rows against the
stage_runs schema (docs/architecture.md §Measurement records) and keeps the extra columns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memx.domain.errors import InputError
from memx.domain.plan import Recompute
from memx.domain.records import (MEASUREMENT_COLUMNS, PHASES, RejectedRow, row_problems, stage_run_row,
                                 stage_runs_frame)
from memx.domain.specs import ModelArch

EXTRA_COLUMNS = MEASUREMENT_COLUMNS  # phase, micro_batches, forward_ms, backward_ms: stage_runs columns now
BACKEND = "records"
UNIT_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3}  # factor to ms
MAX_LAYER_S = 3600.0  # a per-layer time above an hour is not a per-layer time: wrong unit or wrong file


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One measured per-layer (or per-part) time of one micro batch, ms; forward/backward when known."""

    total_ms: float
    forward_ms: float | None = None
    backward_ms: float | None = None


@dataclass(kw_only=True)
class FileRows:
    """What one source file gives: stage rows, rows it rejects, entries it knowingly skips (why)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[RejectedRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def files_under(path: Path, patterns: Sequence[str], what: str) -> list[Path]:
    """`path` itself, or every file under the folder matching one of `patterns` (recursive, sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path}: no such file or folder ({what})")
    files = sorted({f for pat in patterns for f in path.rglob(pat) if f.is_file()})
    if not files:
        raise InputError(f"{path}: no {what} files ({', '.join(patterns)}) under this folder")
    return files


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read as JSON: {exc}") from exc


def check_keys(obj: Mapping[str, Any], known: Sequence[str], file: Path, where: str) -> None:
    """Unknown keys (columns) are an error naming the file, the key and the known ones — never guessed."""
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise InputError(f"{file}: {where}: unknown key '{unknown[0]}'; known: {', '.join(known)}")
    missing = [k for k in known if k not in obj]
    if missing:
        raise InputError(f"{file}: {where}: key '{missing[0]}' missing; expected: {', '.join(known)}")


def int_key(key: str, file: Path, where: str) -> int:
    if not str(key).isdigit():
        raise InputError(f"{file}: {where}: key {key!r} must be a whole number")
    return int(key)


def to_ms(value: Any, unit: str, file: Path, where: str) -> float:
    """A published time in `unit` (s, ms or us) as ms; a non-number, a negative or an implausible
    value (over an hour for one layer) is an error naming the file and the entry."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{file}: {where}: time must be a number ≥ 0 ({unit}), got {value!r}")
    ms = float(value) * UNIT_MS[unit]
    if ms > MAX_LAYER_S * 1e3:
        raise InputError(f"{file}: {where}: {value} {unit} for one layer is implausible: is the unit {unit}?")
    return ms


def catalog_gpu(label: str | None, table: Mapping[str, str], override: str | None, file: Path, tool: str) -> str:
    """The MemX GPU name of a tool's GPU label: `--gpu` when given, else the explicit table, else an error."""
    if override:
        return override
    if label is None:
        raise InputError(f"{file}: {tool} profiles do not name the GPU type; give --gpu with the MemX GPU name")
    if label in table:
        return table[label]
    raise InputError(f"{file}: GPU '{label}' is not in the {tool} GPU table (known: {', '.join(table)}); "
                     "give --gpu with the MemX GPU name")


def split_layers(entries: Sequence[Entry], model: ModelArch, file: Path) -> tuple[Entry, list[Entry], list[Entry]]:
    """(embedding, transformer layers, output parts) of a per-layer list: entry 0 is the embedding, the
    next `model.layers` entries the transformer layers, the rest (1 part, or 2 when a final norm has its
    own entry, as in Sailor's LLaMA profiles) the output layer."""
    n, n_layers = len(entries), model.layers
    tail = n - 1 - n_layers
    if tail not in (1, 2):
        raise InputError(f"{file}: {n} layer entries, but model '{model.name}' has {n_layers} transformer layers: "
                         f"expected {n_layers + 2} (embedding, layers, output) or {n_layers + 3} "
                         "(… final norm, output); is --model the model this file profiled?")
    return entries[0], list(entries[1:1 + n_layers]), list(entries[1 + n_layers:])


def _sum(entries: Sequence[Entry]) -> Entry:
    def part(name: str) -> float | None:
        vals = [getattr(e, name) for e in entries]
        return None if any(v is None for v in vals) else float(sum(vals))

    return Entry(total_ms=float(sum(e.total_ms for e in entries)), forward_ms=part("forward_ms"),
                 backward_ms=part("backward_ms"))


def median_entry(entries: Sequence[Entry]) -> Entry:
    """The median transformer layer (an actual entry, so its forward/backward stay consistent)."""
    ordered = sorted(entries, key=lambda e: e.total_ms)
    return ordered[len(ordered) // 2]


def point(model: ModelArch, *, gpu: str, tp: int, micro_batch: int, seq_len: int, source: str) -> dict[str, Any]:
    """The signature fields every importer fills the same way: structure from `model`, no recompute,
    one micro batch in flight (these profilers measure one pass of one micro batch)."""
    return dict(gpu=gpu, tp=tp, micro_batch=micro_batch, seq_len=seq_len, recompute=Recompute.NONE.value,
                recompute_layers=None, inflight=1, hidden=model.hidden, ffn_hidden=model.ffn_hidden,
                heads=model.heads, query_groups=model.query_groups, vocab=model.vocab, mlp=model.mlp,
                tied_embeddings=model.tied_embeddings, source=source)  # stage_run_row keeps it on end stages only


def row(base: Mapping[str, Any], entry: Entry, *, layers: int, first: bool, last: bool, phase: str,
        reason: str, micro_batches: int | None = None) -> dict[str, Any]:
    """A time-only stage row (peak_mem_mib null) with its phase and forward/backward split."""
    assert phase in PHASES, phase
    return stage_run_row({**base, "layers": layers, "first": first, "last": last}, status="ok", backend=BACKEND,
                         time_ms=entry.total_ms, reason=reason, phase=phase, micro_batches=micro_batches,
                         forward_ms=entry.forward_ms, backward_ms=entry.backward_ms)


def per_layer_rows(base: Mapping[str, Any], entries: Sequence[Entry], model: ModelArch, file: Path, *,
                   phase: str, reason: str) -> list[dict[str, Any]]:
    """Per-layer list → three stage rows of one micro batch (docs/importers.md §Composition):
    embedding only (layers 0, first), one transformer layer (layers 1: the median layer entry) and
    output only (layers 0, last: the sum of the output parts)."""
    emb, layers, tail = split_layers(entries, model, file)
    return [row(base, emb, layers=0, first=True, last=False, phase=phase, reason=reason),
            row(base, median_entry(layers), layers=1, first=False, last=False, phase=phase, reason=reason),
            row(base, _sum(tail), layers=0, first=False, last=True, phase=phase, reason=reason)]


def to_frame(rows: Sequence[Mapping[str, Any]], files: Sequence[str]) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """Validate rows one by one (memx.domain.records.row_problems); the kept ones as a stage_runs
    frame (its measurement columns: phase, micro_batches, forward_ms, backward_ms)."""
    good, rejects = [], []
    for i, (r, f) in enumerate(zip(rows, files)):
        problems = row_problems(r)
        rejects += [RejectedRow(row=i, column=c, reason=p, file=f) for c, p in problems]
        if not problems:
            good.append(r)
    return stage_runs_frame(good), rejects


def backward_forward_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Per GPU type: backward / forward of the transformer-layer rows that carry both (the data a
    backward model learns from, issue #16): n, median, 10th and 90th percentile."""
    rows = frame[(frame["layers"] >= 1) & frame["forward_ms"].notna() & frame["backward_ms"].notna()
                 & (frame["forward_ms"] > 0)]
    ratio = (rows["backward_ms"] / rows["forward_ms"]).groupby(rows["gpu"])
    return pd.DataFrame({"n": ratio.size(), "median": ratio.median(), "p10": ratio.quantile(0.1),
                         "p90": ratio.quantile(0.9)}).reset_index()
