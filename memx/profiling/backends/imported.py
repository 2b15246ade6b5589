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

import json
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
# Model structure: Sailor's own training configs (model_configs/training_config_*.json) for OPT-350 and
# GPT-Neo-2.7 (its heads 32 and vocab 128256 are Sailor's, kept as published); LLaMA-3-8B and OPT-30B
# from their public model cards. ffn = 4·hidden for OPT/GPT-Neo (GeLU). seq_len 2048 everywhere: the
# configs say so for OPT-350/GPT-Neo; for LLaMA-3-8 and OPT-30 it is our assumption.
SAILOR_MODELS = {
    "OPT-350": dict(hidden=1024, ffn_hidden=4096, heads=16, query_groups=16, vocab=50272, mlp="gelu"),
    "GPT-Neo-2.7": dict(hidden=2560, ffn_hidden=10240, heads=32, query_groups=32, vocab=128256, mlp="gelu"),
    "LLAMA-3-8": dict(hidden=4096, ffn_hidden=14336, heads=32, query_groups=8, vocab=128256, mlp="swiglu"),
    "OPT-30": dict(hidden=7168, ffn_hidden=28672, heads=56, query_groups=56, vocab=50272, mlp="gelu"),
}
SAILOR_SEQ_LEN = 2048
# Sailor's GPU folder names → our catalog names where the catalog has the part, else a lower-case
# name with the memory size (GH200 96 GB, RTX 2080 8 GB, Titan RTX 24 GB are not in conf/gpus).
SAILOR_GPUS = {"A100-40": "a100-40g", "A100-80": "a100-80g", "V100-16": "v100-16g", "RTX-3090": "rtx3090-24g",
               "GH-96": "gh200-96g", "RTX-2080": "rtx2080-8g", "Titan-RTX": "titan-rtx-24g"}
SAILOR_REASON = "time only: published per-layer profile ({what}); no recompute assumed; memory not a device peak"


def _layer_rows(*, model: str, gpu: str, mbs: int, tp: int, times_ms: list[float], source: str,
                what: str) -> list[dict]:
    """Entry 0 = embedding, last = output layer, the rest = identical transformer layers (median)."""
    arch = SAILOR_MODELS[model]
    base = dict(gpu=SAILOR_GPUS.get(gpu, gpu.lower()), tp=tp, micro_batch=mbs, seq_len=SAILOR_SEQ_LEN,
                recompute=Recompute.NONE.value, recompute_layers=None, inflight=1, source=source, **arch)
    inner = sorted(times_ms[1:-1])
    layer = inner[len(inner) // 2] if inner else None
    rows = []
    for layers, first, last, t in ((0, True, False, times_ms[0]), (1, False, False, layer),
                                   (0, False, True, times_ms[-1])):
        if t is not None:
            rows.append(ok_row({**base, "layers": layers, "first": first, "last": last}, time_ms=t,
                               peak_mem_mib=None, static_mem_mib=None, backend="records",
                               reason=SAILOR_REASON.format(what=what)))
    return rows


def _sailor_json(root: Path) -> list[dict]:
    """profiles_sailor/<model>/<gpu>/profile.json: profile[mbs][tp][layer] = [fwd_s, bwd_s, update_s]
    (Sailor's simulator reads value[0], [1], [2] as forward, backward and update times)."""
    rows = []
    for f in sorted(root.glob("profiles_sailor/*/*/profile.json")):
        model, gpu = f.parent.parent.name, f.parent.name
        if model not in SAILOR_MODELS:
            continue
        for mbs, by_tp in json.loads(f.read_text()).items():
            for tp, layers in by_tp.items():
                order = sorted(layers, key=int)
                times = [(layers[k][0] + layers[k][1]) * 1e3 for k in order]
                rows += _layer_rows(model=model, gpu=gpu, mbs=int(mbs), tp=int(tp), times_ms=times,
                                    source=f"records:sailor/{model}/{gpu}/profile.json", what="Sailor fwd+bwd")
    return rows


def _metis_json(root: Path) -> list[dict]:
    """profiles_metis_format/<model>/<gpu>/mbs<B>_tmp<T>.json: execution_time.layer_compute_total_ms
    per layer (fwd+bwd of one micro batch). layer_memory_total_mb is Metis's per-layer accounting
    (weights + optimizer + activations, no allocator context), not a device peak: not imported."""
    rows = []
    for f in sorted(root.glob("profiles_metis_format/*/*/mbs*_tmp*.json")):
        model, gpu = f.parent.parent.name, f.parent.name
        m = re.fullmatch(r"mbs(\d+)_tmp(\d+)", f.stem)
        if model not in SAILOR_MODELS or not m:
            continue
        times = json.loads(f.read_text())["execution_time"]["layer_compute_total_ms"]
        rows += _layer_rows(model=model, gpu=gpu, mbs=int(m[1]), tp=int(m[2]), times_ms=list(times),
                            source=f"records:metis/{model}/{gpu}/{f.name}", what="Metis layer_compute_total_ms")
    return rows


def _aceso_csv(root: Path) -> tuple[list[dict], list[RejectedRow]]:
    """profiles_aceso_layer_time/<gpu>.csv: mbs,tp,algo,fwd,bwd (s) of one transformer layer. The files
    do not name the model; Sailor's Aceso validation uses OPT-350, which we assume. `algo` 0 is
    imported as no recompute; other values are rejected (their meaning is not documented)."""
    rows, rejects = [], []
    for f in sorted(root.glob("profiles_aceso_layer_time/*.csv")):
        gpu = SAILOR_GPUS.get(f.stem, f.stem.lower())
        for i, r in enumerate(pd.read_csv(f).to_dict("records")):
            if int(r["algo"]) != 0:
                rejects.append(RejectedRow(row=i, column="algo", reason=f"algo {r['algo']}: meaning not documented "
                                           "in the source; only algo 0 (taken as no recompute) is imported", file=str(f)))
                continue
            point = dict(gpu=gpu, tp=int(r["tp"]), micro_batch=int(r["mbs"]), seq_len=SAILOR_SEQ_LEN, layers=1,
                         first=False, last=False, recompute=Recompute.NONE.value, recompute_layers=None, inflight=1,
                         source=f"records:aceso/{f.name}", **SAILOR_MODELS["OPT-350"])
            rows.append(ok_row(point, time_ms=(r["fwd"] + r["bwd"]) * 1e3, peak_mem_mib=None, static_mem_mib=None,
                               backend="records", reason="time only: Aceso layer profile; model OPT-350 assumed"))
    return rows, rejects


def read_sailor_profiles(root: Path) -> tuple[pd.DataFrame, list[RejectedRow]]:
    """All of Sailor's published profiles under `root` (the realdata `sailor` folder) as stage_runs."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: no such folder (expected Sailor's profiles_sailor/, profiles_metis_format/, "
                         "profiles_aceso_layer_time/)")
    aceso, rejects = _aceso_csv(root)
    rows = _sailor_json(root) + _metis_json(root) + aceso
    if not rows:
        return empty_stage_runs(), rejects
    df, bad = validate_stage_runs(pd.DataFrame(rows), backend="records")
    return df, rejects + bad
