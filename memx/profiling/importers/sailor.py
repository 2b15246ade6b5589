"""Sailor's published per-layer profiles (github.com/eth-easl/sailor, commit cf2c8e3):
`profile.json` (Sailor's own format) and the Metis-format files Sailor derives from it.

profiles_sailor/<model>/<gpu>/profile.json — profile[mbs][tp][layer] = [fwd_s, bwd_s, optimizer_s]:
  learned from third_party/Megatron-DeepSpeed/megatron/training.py (the `sailor_profile` block writes
  `timing[layer] = [fwd, bwd, mean optimizer step]`, CUDA-event ms / 1000, so SECONDS) and
  Planner/sailor_planner/cpp_src/training.cpp (reads [0] forward, [1] backward, [2] update). Layer 0 is
  the embedding, 1..L the transformer layers (Sailor times two of them and copies the second to
  2..L), then the output layer (head + loss; LLaMA: final RMSNorm, then head + loss). The optimizer
  step (entry [2], the same on every layer) is that of the truncated model Sailor profiled, not of a
  stage: not imported.

profiles_metis_format/<model>/<gpu>/mbs<B>_tmp<T>.json — learned from Sailor's
  profiling/baselines/generate_baseline_profs.py (`generate_profile_Metis`):
  execution_time.layer_compute_total_ms[layer] = (fwd + bwd) · 1000 from profile.json, MILLISECONDS.
  execution_memory.layer_memory_total_mb is Sailor's formula (20 bytes/parameter + activations),
  not a measurement: not imported; total_time_ms / optimizer_time_ms add the optimizer step once per
  layer: not imported.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memx.domain.errors import InputError
from memx.domain.specs import ModelArch
from memx.profiling.importers.common import (Entry, FileRows, check_keys, int_key, per_layer_rows, point,
                                             read_json, to_ms)

# Sailor's GPU folder names → MemX GPU names. In conf/gpus: a100-40g, a100-80g, v100-16g, rtx3090-24g.
# Not (yet) in conf/gpus, named by the catalog's convention: GH200 96 GB, RTX 2080 8 GB, Titan RTX 24 GB.
SAILOR_GPUS = {"A100-40": "a100-40g", "A100-80": "a100-80g", "V100-16": "v100-16g", "RTX-3090": "rtx3090-24g",
               "GH-96": "gh200-96g", "RTX-2080": "rtx2080-8g", "Titan-RTX": "titan-rtx-24g"}
SAILOR_REASON = "time only: Sailor profile.json (fwd + bwd, s → ms)"
METIS_REASON = "time only: Sailor's Metis-format profile (layer_compute_total_ms = fwd + bwd, ms)"
METIS_KEYS = ("model", "execution_time", "execution_memory")
METIS_MODEL_KEYS = ("model_name", "num_layers", "parameters")
METIS_TIME_KEYS = ("total_time_ms", "forward_backward_time_ms", "batch_generator_time_ms", "optimizer_time_ms",
                   "layer_compute_total_ms")
METIS_MEMORY_KEYS = ("layer_memory_total_mb",)
METIS_NAME = re.compile(r"mbs(\d+)_tmp(\d+)")


def gpu_label(file: Path) -> str:
    """Sailor keeps one folder per GPU type: <model>/<gpu>/<file>."""
    return file.parent.name


def _sailor_entry(value: Any, file: Path, where: str) -> Entry:
    if not isinstance(value, list) or len(value) != 3:
        raise InputError(f"{file}: {where}: expected [fwd_s, bwd_s, optimizer_s], got {value!r}")
    fwd, bwd = to_ms(value[0], "s", file, where + "[0]"), to_ms(value[1], "s", file, where + "[1]")
    to_ms(value[2], "s", file, where + "[2]")  # checked, not imported (module docstring)
    return Entry(total_ms=fwd + bwd, forward_ms=fwd, backward_ms=bwd)


def read_sailor_file(file: Path, *, model: ModelArch, gpu: str) -> FileRows:
    """One profile.json → three rows (embedding, one layer, output) per (mbs, tp)."""
    out, data = FileRows(), read_json(file)
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected {{mbs: {{tp: {{layer: [fwd_s, bwd_s, optimizer_s]}}}}}}")
    for mbs, by_tp in data.items():
        for tp, layers in (by_tp.items() if isinstance(by_tp, dict) else [("?", None)]):
            where = f"[{mbs}][{tp}]"
            if not isinstance(layers, dict):
                raise InputError(f"{file}: {where}: expected {{layer: [fwd_s, bwd_s, optimizer_s]}}")
            keys = sorted(layers, key=lambda k: int_key(k, file, where))
            if [int(k) for k in keys] != list(range(len(keys))):
                raise InputError(f"{file}: {where}: layer keys must be 0..{len(keys) - 1}, got {keys}")
            entries = [_sailor_entry(layers[k], file, f"{where}[{k}]") for k in keys]
            base = point(model, gpu=gpu, tp=int_key(tp, file, where), micro_batch=int_key(mbs, file, where),
                         seq_len=model.seq_len, source=f"records:sailor/{file.parent.parent.name}/{gpu_label(file)}/"
                                                        f"{file.name}")
            out.rows += per_layer_rows(base, entries, model, file, phase="forward_backward", reason=SAILOR_REASON)
    return out


def _metis_times(data: Any, file: Path) -> list[float]:
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a Metis profile object with keys {', '.join(METIS_KEYS)}")
    check_keys(data, METIS_KEYS, file, "top level")
    check_keys(data["model"], METIS_MODEL_KEYS, file, "model")
    check_keys(data["execution_time"], METIS_TIME_KEYS, file, "execution_time")
    check_keys(data["execution_memory"], METIS_MEMORY_KEYS, file, "execution_memory")
    times = data["execution_time"]["layer_compute_total_ms"]
    if not isinstance(times, list):
        raise InputError(f"{file}: execution_time.layer_compute_total_ms must be a list of ms per layer")
    if len(times) != data["model"]["num_layers"]:
        raise InputError(f"{file}: layer_compute_total_ms has {len(times)} entries, model.num_layers says "
                         f"{data['model']['num_layers']}")
    return [to_ms(t, "ms", file, f"layer_compute_total_ms[{i}]") for i, t in enumerate(times)]


def read_metis_file(file: Path, *, model: ModelArch, gpu: str) -> FileRows:
    """One mbs<B>_tmp<T>.json → three rows (embedding, one layer, output); fwd + bwd only."""
    m = METIS_NAME.fullmatch(file.stem)
    if not m:
        raise InputError(f"{file}: file name must be mbs<B>_tmp<T>.json (micro batch B, tensor parallel T)")
    entries = [Entry(total_ms=t) for t in _metis_times(read_json(file), file)]
    base = point(model, gpu=gpu, tp=int(m[2]), micro_batch=int(m[1]), seq_len=model.seq_len,
                 source=f"records:metis/{file.parent.parent.name}/{gpu_label(file)}/{file.name}")
    out = FileRows()
    out.rows = per_layer_rows(base, entries, model, file, phase="forward_backward", reason=METIS_REASON)
    return out
