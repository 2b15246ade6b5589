"""The `records` backend: import existing measurements as stage_runs, with a report of rejected rows.

- `read_records(path)`: CSV, Parquet or JSONL (one object per line) with stage_runs columns, or a
  folder of such files. Time-only rows (peak_mem_mib null), single-layer, embedding-only
  (layers 0, first) and output-only (layers 0, last) rows are valid.
- `ingest_megatron(logdir, model=, gpu=)`: a folder of Megatron-LM logs, one run per file.
- `read_sailor_profiles(root)`: Sailor's published per-layer profiles (time only; mapping below).
Imported rows keep their own `source`, else get `records:<file name>`. Implausible rows are rejected
one by one (`memx.domain.records.validate_stage_runs`); `ingest_megatron` raises `NothingUsable` when
no row survives, and `InputError` (file, line, field) for a malformed number in a log.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from memx.domain.errors import InputError, short_repr
from memx.domain.io import path_kind
from memx.domain.plan import Recompute
from memx.domain.records import (RejectedRow, empty_stage_runs, failed_row, ok_row, require_rows, stage_runs_frame,
                                 validate_stage_runs)
from memx.domain.specs import MAX_GLOBAL_BATCH, ModelArch, gpu_name_problem
from memx.profiling.megatron_logs import megatron_args, parse_output, point_from_args, point_from_header

FORMATS = (".csv", ".parquet", ".jsonl", ".json")
LOG_SUFFIXES = (".log", ".txt", ".out")
log = logging.getLogger(__name__)


def _read_table(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=True)
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: cannot read as {suffix[1:]}: {exc}") from exc
    raise InputError(f"{path}: unknown records format {suffix!r}; allowed: {', '.join(FORMATS)}")


def read_records(path: Path, *, gpu_memory_mib: dict[str, float] | None = None
                 ) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """Import one file or every records file of a folder; rows are validated one by one.

    `gpu_memory_mib` (GPU name → memory, MiB; e.g. the cluster's GPUs): peaks must fit in it."""
    path = Path(path)
    kind = path_kind(path, "--records")
    if kind == "dir":
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in FORMATS)
        if not files:
            raise InputError(f"{path}: no records files ({', '.join(FORMATS)}) in this folder")
    elif kind == "file":
        files = [path]
    else:
        raise InputError(f"--records {path}: no such file or folder")
    frames, rejects = [], []
    for f in files:
        df, bad = validate_stage_runs(_read_table(f), backend="records", source=f"records:{f.name}", file=str(f),
                                      gpu_memory_mib=gpu_memory_mib)
        frames.append(df)
        rejects.extend(bad)
    frames = [f for f in frames if len(f)]
    return (stage_runs_frame(pd.concat(frames, ignore_index=True)) if frames else empty_stage_runs()), rejects


def _log_point(text: str, model: ModelArch, gpu: str, source: str) -> tuple[dict, str]:
    """The point a log measured: header line, else Megatron's argument dump; problem text or ''."""
    point = point_from_header(text, source=source)
    if point is None:
        args = megatron_args(text)
        if not args:
            return {}, "no 'memx-point: {json}' header and no Megatron arguments dump"
        point = point_from_args(args)
    defaults = {"gpu": gpu, "hidden": model.hidden, "ffn_hidden": model.ffn_hidden, "heads": model.heads,
                "query_groups": model.query_groups, "vocab": model.vocab, "mlp": model.mlp,
                "tied_embeddings": model.tied_embeddings,
                "seq_len": model.seq_len, "recompute": Recompute.NONE.value, "first": True, "last": True, "inflight": 1}
    point = {**defaults, **point}
    missing = [c for c in ("tp", "layers", "micro_batch") if c not in point]
    problem = point.pop("_problem", "")
    if missing:
        problem = problem or f"cannot recover field(s) {', '.join(missing)} from the log"
    return point, problem


def _micro_batches(point: dict, source: str) -> int:
    """Micro batches per logged iteration (header or argument dump; 1 when neither says)."""
    m = point.pop("micro_batches", None)
    m = 1 if m is None or m == 0 else m
    if not 1 <= m <= MAX_GLOBAL_BATCH:
        raise InputError(f"{source}: field 'micro_batches': must be an integer in 1..{MAX_GLOBAL_BATCH}; "
                         f"got {short_repr(m)}")
    return int(m)


_ITER_OF = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)")


def truncation(text: str) -> str:
    """Why a Megatron log looks cut short ('' when it does not): its last logged iteration is below the
    run's total (`iteration N/ M`, N < M), or its last line is unfinished (no newline at the end)."""
    seen = [(int(n), int(m)) for n, m in _ITER_OF.findall(text)]
    if seen and seen[-1][0] < seen[-1][1]:
        return f"truncated? it ends at iteration {seen[-1][0]} of {seen[-1][1]}"
    if text and not text.endswith("\n"):
        return "truncated? its last line is unfinished"
    return ""


def ingest_megatron(logdir: Path, *, model: ModelArch, gpu: str, gpu_memory_mib: float | None = None
                    ) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """One stage_runs row per Megatron-LM log in `logdir` (*.log, *.txt, *.out).

    `gpu_memory_mib`: the GPU's memory, when known (peaks must fit in it). NothingUsable when every
    log is rejected; InputError for a bad `gpu` name or a malformed value in a log (file, line, field)."""
    logdir = Path(logdir)
    if problem := gpu_name_problem(gpu):
        raise InputError(f"--gpu {short_repr(gpu)}: {problem}")
    if path_kind(logdir, "log folder") != "dir":
        raise InputError(f"{logdir}: no such log folder")
    files = sorted(p for p in logdir.iterdir() if p.suffix.lower() in LOG_SUFFIXES)
    if not files:
        raise InputError(f"{logdir}: no Megatron logs ({', '.join(LOG_SUFFIXES)}) in this folder")
    rows, rejects, row_files = [], [], []
    for i, f in enumerate(files):
        text = f.read_text(errors="replace")
        point, problem = _log_point(text, model, gpu, str(f))
        if problem:
            rejects.append(RejectedRow(row=i, column="point", reason=problem, file=str(f)))
            continue
        point["source"] = point.get("source") or f"records:{f.name}"
        m = _micro_batches(point, str(f))
        parsed = parse_output(text, micro_batches=m, source=str(f))  # OOM or unparseable → a row that says why
        if parsed.status == "ok" and (cut := truncation(text)):
            log.warning("memx: %s: %s; its row is kept from the iterations logged", f, cut)
        row_files.append(f)
        if parsed.status == "ok":
            rows.append(ok_row(point, time_ms=parsed.time_ms, peak_mem_mib=parsed.peak_mem_mib,
                               static_mem_mib=parsed.static_mem_mib, backend="records", reason=parsed.reason))
        else:
            rows.append(failed_row(point, status=parsed.status, reason=parsed.reason, backend="records"))
    df, bad = (validate_stage_runs(pd.DataFrame(rows), backend="records",
                                   gpu_memory_mib=None if gpu_memory_mib is None else {gpu: gpu_memory_mib})
               if rows else (empty_stage_runs(), []))
    rejects += [RejectedRow(row=r.row, column=r.column, reason=r.reason, file=str(row_files[r.row])) for r in bad]
    return require_rows(df, rejects, what=f"Megatron logs in {logdir}"), rejects


# --- Sailor's published profiles (../shared/realdata/sailor/profiles_*) -------------------------
# Read by memx.profiling.importers (the one reader of Sailor's formats; units and layouts in its
# modules). Model structure: Sailor's own training configs (model_configs/training_config_*.json) for
# OPT-350 and GPT-Neo-2.7 (its heads 32 and vocab 128256 are Sailor's, kept as published); LLaMA-3-8B and
# OPT-30B from their public model cards. ffn = 4·hidden for OPT/GPT-Neo (GeLU). seq_len 2048 everywhere:
# the configs say so for OPT-350/GPT-Neo; for LLaMA-3-8 and OPT-30 it is our assumption.
SAILOR_SEQ_LEN = 2048
SAILOR_MODELS = {
    "OPT-350": ModelArch(name="OPT-350", layers=24, hidden=1024, ffn_hidden=4096, heads=16, query_groups=16,
                         vocab=50272, seq_len=SAILOR_SEQ_LEN, mlp="gelu"),
    "GPT-Neo-2.7": ModelArch(name="GPT-Neo-2.7", layers=32, hidden=2560, ffn_hidden=10240, heads=32, query_groups=32,
                             vocab=128256, seq_len=SAILOR_SEQ_LEN, mlp="gelu"),
    "LLAMA-3-8": ModelArch(name="LLAMA-3-8", layers=32, hidden=4096, ffn_hidden=14336, heads=32, query_groups=8,
                           vocab=128256, seq_len=SAILOR_SEQ_LEN, mlp="swiglu"),
    "OPT-30": ModelArch(name="OPT-30", layers=48, hidden=7168, ffn_hidden=28672, heads=56, query_groups=56,
                        vocab=50272, seq_len=SAILOR_SEQ_LEN, mlp="gelu"),
}
_SAILOR_FOLDERS = (("sailor", "profiles_sailor"), ("metis", "profiles_metis_format"))


def _import_folder(fmt: str, folder: Path, model: ModelArch) -> tuple[list[pd.DataFrame], list[RejectedRow]]:
    """One model/GPU folder through memx.profiling.importers; a folder whose files do not fit the model
    (e.g. Sailor's GPT-Neo-2.7/GH-96/profile.json, a copy of OPT-350's 26 entries) is rejected whole."""
    from memx.profiling.importers import import_profiles  # the importers pull in every format's reader

    try:
        got = import_profiles(fmt, folder, model=model)
    except InputError as exc:
        return [], [RejectedRow(row=0, column="layers", reason=str(exc), file=str(folder))]
    return [got.frame], list(got.rejects)


def read_sailor_profiles(root: Path) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """All of Sailor's published profiles under `root` (the realdata `sailor` folder) as stage_runs, read by
    memx.profiling.importers folder by folder (profiles_sailor/<model>/<gpu>/, profiles_metis_format/<model>/<gpu>/,
    profiles_aceso_layer_time/ taken as OPT-350, as Sailor's Aceso validation uses it)."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: no such folder (expected Sailor's profiles_sailor/, profiles_metis_format/, "
                         "profiles_aceso_layer_time/)")
    frames, rejects = [], []
    for fmt, sub in _SAILOR_FOLDERS:
        for folder in sorted(p for p in (root / sub).glob("*/*") if p.is_dir()):
            if (model := SAILOR_MODELS.get(folder.parent.name)) is not None:
                got, bad = _import_folder(fmt, folder, model)
                frames, rejects = frames + got, rejects + bad
    if (root / "profiles_aceso_layer_time").is_dir():
        got, bad = _import_folder("aceso", root / "profiles_aceso_layer_time", SAILOR_MODELS["OPT-350"])
        frames, rejects = frames + got, rejects + bad
    frames = [f for f in frames if len(f)]
    if not frames:
        return empty_stage_runs(), rejects
    return stage_runs_frame(pd.concat(frames, ignore_index=True)), rejects
