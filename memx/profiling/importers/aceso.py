"""Aceso per-layer times as Sailor publishes them: profiles_aceso_layer_time/<gpu>.csv.

Columns `mbs,tp,algo,fwd,bwd,fwd+bwd` — learned from Sailor's
Planner/baselines/Aceso/profiler/scripts/layer_time.py: for each (mbs, tp, algo) it sums the
forward-compute and backward-compute columns (MICROSECONDS) of the op rows of ONE transformer layer
(enc-1st-layernorm … enc-post-MLP-dropout; embedding and output rows excluded) of Aceso's fp32 op
profiles of OPT-350 (`{gpu}/profiled-data-fp32/OPT-350_mbs…_tp…_algo….csv`), divides by 10^6 and
writes SECONDS with 6 decimals. The file names the GPU type only; the model (OPT-350, fp32) is fixed
by that script.

`algo` is Aceso's tensor-parallel partition algorithm (Aceso profiler/model_configs.py; runtime
flex_ops.py: 0 = "column", 1 = "row"). Algo 0 is Megatron-LM's partition, the layout MemX plans:
imported. Algo 1 is a layout MemX does not plan: skipped (said in the report). Any other value is an
error.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from memx.domain.errors import InputError
from memx.domain.records import RejectedRow
from memx.domain.specs import ModelArch
from memx.profiling.importers.common import Entry, FileRows, int_key, point, row, to_ms

ACESO_COLUMNS = ("mbs", "tp", "algo", "fwd", "bwd", "fwd+bwd")
ALGOS = {"0": "column (Megatron-LM's partition)", "1": "row"}
IMPORTED_ALGO = "0"
ROUNDING_S = 2e-6  # fwd, bwd and fwd+bwd are each rounded to 1 µs: their sum may differ by 2 µs
REASON = "time only: Aceso fp32 op profile of one OPT-350 layer (fwd + bwd, s → ms)"


def gpu_label(file: Path) -> str:
    """Sailor names each Aceso layer-time file after its GPU type: <gpu>.csv."""
    return file.stem


def _header(reader: csv.DictReader, file: Path) -> None:
    cols = tuple(reader.fieldnames or ())
    unknown = [c for c in cols if c not in ACESO_COLUMNS]
    missing = [c for c in ACESO_COLUMNS if c not in cols]
    if unknown or missing:
        what = f"unknown column '{unknown[0]}'" if unknown else f"column '{missing[0]}' missing"
        raise InputError(f"{file}: {what}; known columns: {', '.join(ACESO_COLUMNS)}")


def read_aceso_file(file: Path, *, model: ModelArch, gpu: str) -> FileRows:
    """One <gpu>.csv → one single-layer row per (mbs, tp) of algo 0."""
    out, skipped_row = FileRows(), 0
    with open(file, newline="") as fh:
        reader = csv.DictReader(fh)
        _header(reader, file)
        for i, r in enumerate(reader):
            where = f"row {i}"
            algo = r["algo"].strip()
            if algo not in ALGOS:
                raise InputError(f"{file}: {where}: algo {algo!r}; known: "
                                 + ", ".join(f"{k} ({v})" for k, v in ALGOS.items()))
            if algo != IMPORTED_ALGO:
                skipped_row += 1
                continue
            fwd, bwd, both = (to_ms(_number(r[c], file, where, c), "s", file, f"{where}, column '{c}'")
                              for c in ("fwd", "bwd", "fwd+bwd"))
            if not math.isclose(fwd + bwd, both, abs_tol=ROUNDING_S * 1e3):
                out.rejects.append(RejectedRow(row=i, column="fwd+bwd", file=str(file),
                                               reason=f"{both / 1e3} s ≠ fwd + bwd = {(fwd + bwd) / 1e3} s"))
                continue
            base = point(model, gpu=gpu, tp=int_key(r["tp"], file, where), micro_batch=int_key(r["mbs"], file, where),
                         seq_len=model.seq_len, source=f"records:aceso/{file.name}")
            out.rows.append(row(base, Entry(total_ms=fwd + bwd, forward_ms=fwd, backward_ms=bwd), layers=1,
                                first=False, last=False, phase="forward_backward", reason=REASON))
    if skipped_row:
        out.skipped.append(f"{file}: {skipped_row} row(s) of algo 1 ({ALGOS['1']} partition): a layout MemX "
                           "does not plan")
    return out


def _number(text: str, file: Path, where: str, column: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise InputError(f"{file}: {where}, column '{column}': not a number: {text!r}") from None
