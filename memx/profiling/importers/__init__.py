"""Import the per-layer profiles other tools publish as MemX `stage_runs` rows (issue #16).

    result = import_profiles("sailor", Path("profiles_sailor/OPT-350"), model=arch)        # GPU from folders
    result = import_profiles("galvatron", Path("configs"), model=arch, gpu="a100-80g")     # GPU not in the files
    result.frame      # stage_runs columns + phase, micro_batches, forward_ms, backward_ms
    result.rejects    # rows that failed the schema (file, row, column, why)
    result.skipped    # entries knowingly not imported, with why

Formats (FORMATS; units and sources in each module's docstring and docs/importers.md):
sailor (profile.json, s), metis (Sailor's Metis-format json, ms), aceso (Sailor's Aceso layer-time
csv, s), galvatron (computation profiles, ms, forward only). Rows carry `phase` (forward |
forward_backward | iteration); MemX's schema today reads time_ms as forward + backward of one micro
batch, so forward-only rows must not be trained on as such until the schema has `phase`.
Bad input (unknown key, column, unit, GPU; a layer count that does not fit --model) → InputError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import pandas as pd

from memx.domain.errors import InputError
from memx.domain.records import RejectedRow, format_rejects
from memx.domain.specs import ModelArch
from memx.profiling.importers import aceso, galvatron, sailor
from memx.profiling.importers.common import (EXTRA_COLUMNS, PHASES, FileRows, backward_forward_ratios,
                                             catalog_gpu, files_under, to_frame)

__all__ = ["EXTRA_COLUMNS", "FORMATS", "PHASES", "Format", "ImportResult", "backward_forward_ratios",
           "import_profiles"]


@dataclass(frozen=True, kw_only=True)
class Format:
    """One importable format: where its files are, how a file names its GPU, how a file becomes rows."""

    name: str
    about: str
    patterns: tuple[str, ...]
    gpus: Mapping[str, str]  # the tool's GPU labels → MemX GPU names (explicit; unknown → error)
    gpu_label: Callable[[Path], str | None]
    read_file: Callable[..., FileRows]


@dataclass(frozen=True, kw_only=True)
class ImportResult:
    frame: pd.DataFrame
    rejects: tuple[RejectedRow, ...]
    skipped: tuple[str, ...]
    files: tuple[str, ...]

    def summary(self) -> str:
        """What the CLI prints: counts per phase and GPU, then rejects and skipped entries."""
        df = self.frame
        by = ", ".join(f"{g} {n}" for g, n in df.groupby("gpu").size().items()) or "none"
        phases = ", ".join(f"{p} {n}" for p, n in df.groupby("phase").size().items()) or "none"
        lines = [f"{len(df)} rows from {len(self.files)} file(s) (phase: {phases}; gpu: {by}); "
                 f"memory measured on {int(df['peak_mem_mib'].notna().sum())} rows"]
        if self.rejects:
            lines.append(format_rejects(list(self.rejects)))
        lines += [f"skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


_SAILOR_ABOUT = "Sailor profile.json: profile[mbs][tp][layer] = [fwd_s, bwd_s, optimizer_s]"
FORMATS: Mapping[str, Format] = MappingProxyType({
    "sailor": Format(name="sailor", about=_SAILOR_ABOUT, patterns=("profile.json",), gpus=sailor.SAILOR_GPUS,
                     gpu_label=sailor.gpu_label, read_file=sailor.read_sailor_file),
    "metis": Format(name="metis", about="Sailor's Metis-format mbs<B>_tmp<T>.json: layer_compute_total_ms (fwd+bwd)",
                    patterns=("mbs*_tmp*.json",), gpus=sailor.SAILOR_GPUS, gpu_label=sailor.gpu_label,
                    read_file=sailor.read_metis_file),
    "aceso": Format(name="aceso", about="Sailor's Aceso layer time <gpu>.csv: mbs,tp,algo,fwd,bwd,fwd+bwd (s)",
                    patterns=("*.csv",), gpus=sailor.SAILOR_GPUS, gpu_label=aceso.gpu_label,
                    read_file=aceso.read_aceso_file),
    "galvatron": Format(name="galvatron", about="Galvatron computation_profiling_*.json: forward ms per batch",
                        patterns=galvatron.PATTERNS, gpus={}, gpu_label=galvatron.gpu_label,
                        read_file=galvatron.read_galvatron_file),
})


def import_profiles(fmt: str, path: Path, *, model: ModelArch, gpu: str | None = None) -> ImportResult:
    """Every `fmt` file at `path` (a file, or a folder searched recursively) as stage_runs rows.

    `model`: the structure the files profiled (their layer count is checked against it); `gpu`: the
    MemX GPU name, overriding the format's table (required when the files do not name the GPU).
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown profile format {fmt!r}; known: {', '.join(FORMATS)}")
    f = FORMATS[fmt]
    files = files_under(Path(path), f.patterns, f"{fmt} profile")
    rows, row_files, rejects, skipped = [], [], [], []
    for file in files:
        got = f.read_file(file, model=model, gpu=catalog_gpu(f.gpu_label(file), f.gpus, gpu, file, fmt))
        rows += got.rows
        row_files += [str(file)] * len(got.rows)
        rejects += got.rejects
        skipped += got.skipped
    frame, bad = to_frame(rows, row_files)
    return ImportResult(frame=frame, rejects=tuple(rejects + bad), skipped=tuple(skipped),
                        files=tuple(str(p) for p in files))
