"""Hetu-Galvatron's model profiles (github.com/PKU-DAIR/Hetu-Galvatron, commit cea12ff):
configs/computation_profiling_<precision>_<model>_<unit>.json and memory_profiling_….json.

Computation — learned from galvatron/core/profiler/model_profiler.py (computation profiling runs on
ONE GPU: pp 1, tp 1, no checkpointing, chunks 1, `profile_forward: 1`, so FORWARD ONLY;
hybrid_parallel_model.py passes `forward_only=args.profile.profile_forward`) and
runtime_profiler.py (`save_profiled_time(…, avg_time * 1e3, …)`: the mean of CUDA-event times,
MILLISECONDS):
  `layernum[N]_bsz{B}_seq{S}`: forward time of the whole N-layer model (embedding and output
  included) on a batch of B sequences of S tokens → one row: layers N, first and last, tp 1,
  micro_batch B, seq_len S, phase forward.
  `layertype_{i|other}_bsz{B}_seq{S}`: Galvatron's own per-sample fit of those rows
  ((T[N2] − T[N1]) / B / (N2 − N1); the rest per sample): derived, not measured: skipped.
Memory — model states and activation peaks (torch.cuda.max_memory_allocated / 2^20, MiB) of runs on
8 GPUs with ZeRO-3 by default (profile_dp_type), keyed by pp_tp_dp: the model states are sharded
over dp, which the stage signature does not carry, and there is no time: skipped, said in the report.
The files do not name the GPU type: `--gpu` is required.
"""

from __future__ import annotations

import re
from pathlib import Path

from memx.domain.errors import InputError
from memx.domain.specs import ModelArch
from memx.profiling.importers.common import Entry, FileRows, point, read_json, row, to_ms

PATTERNS = ("computation_profiling_*.json", "memory_profiling_*.json")
FILE_NAME = re.compile(r"(computation|memory)_profiling_(bf16|fp16|fp32)_(.+)\.json")
MEASURED_KEY = re.compile(r"layernum\[(\d+)\]_bsz(\d+)_seq(\d+)")
DERIVED_KEY = re.compile(r"layertype_(\d+|other)_bsz(\d+)_seq(\d+)")
KNOWN_KEYS = "layernum[N]_bsz{B}_seq{S} (measured, ms) or layertype_{i|other}_bsz{B}_seq{S} (derived)"
REASON = "time only, forward only: Galvatron computation profile ({precision}, 1 GPU, ms)"


def gpu_label(file: Path) -> None:
    """Galvatron's profiles do not say which GPU measured them."""
    return None


def read_galvatron_file(file: Path, *, model: ModelArch, gpu: str) -> FileRows:
    """A computation profile → one forward-only row per measured (layers, batch, sequence) point;
    a memory profile → nothing imported, one line saying why."""
    m = FILE_NAME.fullmatch(file.name)
    if not m:
        raise InputError(f"{file}: not a Galvatron profile: expected computation_profiling_<bf16|fp16|fp32>_<model>"
                         "_<unit>.json or memory_profiling_….json")
    kind, precision = m[1], m[2]
    out, data = FileRows(), read_json(file)
    if kind == "memory":
        out.skipped.append(f"{file}: memory profile (MiB, ZeRO-3 sharded model states over dp, no time): "
                           "not a stage_runs row until the signature carries dp")
        return out
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected an object of {KNOWN_KEYS}")
    derived = 0
    for key, value in data.items():
        if DERIVED_KEY.fullmatch(key):
            derived += 1
            continue
        k = MEASURED_KEY.fullmatch(key)
        if not k:
            raise InputError(f"{file}: unknown key '{key}'; known: {KNOWN_KEYS}")
        forward = to_ms(value, "ms", file, key)
        base = point(model, gpu=gpu, tp=1, micro_batch=int(k[2]), seq_len=int(k[3]),
                     source=f"records:galvatron/{file.name}")
        out.rows.append(row(base, Entry(total_ms=forward, forward_ms=forward), layers=int(k[1]), first=True,
                            last=True, phase="forward", reason=REASON.format(precision=precision)))
    if derived:
        out.skipped.append(f"{file}: {derived} derived key(s) layertype_* (Galvatron's per-sample fit of the "
                           "layernum rows)")
    return out
