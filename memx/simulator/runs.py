"""Simulated stage_runs / config_runs rows and the `simulated` profiling backend entry point.

The tables' schema (columns, statuses, dtypes) is memx.domain.records (docs/architecture.md
§Measurement records); this module fills it with what the virtual cluster measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from memx.domain.catalog import load_gpu
from memx.domain.errors import InputError
from memx.domain.groups import AnyPlan, any_plan_to_json
from memx.domain.moe_records import is_moe_row
from memx.domain.records import (CONFIG_RUN_COLUMNS, STAGE_RUN_COLUMNS, config_runs_frame,
                                 now_iso, stage_run_row, stage_runs_frame)
from memx.domain.specs import Cluster, GpuType
from memx.simulator.moe import measure_expert_stage
from memx.simulator.schedule import PlanRun
from memx.simulator.stage import (
    ADAM_STATIC_BYTES_PER_PARAM,
    measure_stage,
    signature_from_dict,
)
from memx.simulator.traits import GpuTraits, load_traits

__all__ = ["CONFIG_RUN_COLUMNS", "STAGE_RUN_COLUMNS", "config_run_row", "config_runs_frame", "measure_stage_rows",
           "measure_stages", "now_iso", "stage_runs_frame"]

BACKEND = "simulated"
SOURCE = "memx.simulator"

GpuCatalog = Cluster | Mapping[str, GpuType] | Iterable[GpuType] | None


def _gpu_lookup(gpus: GpuCatalog, conf_root: Path | None):
    if isinstance(gpus, Cluster):
        table = {g.name: g for g in gpus.gpu_types}
    elif isinstance(gpus, Mapping):
        table = dict(gpus)
    elif gpus is not None:
        table = {g.name: g for g in gpus}
    else:
        table = {}

    def get(name: str) -> GpuType:
        if name not in table:
            if gpus is not None:
                raise InputError(f"stage signature: field 'gpu' {name!r} is not among the GPUs given: "
                                 f"{', '.join(sorted(table)) or '(none)'}")
            table[name] = load_gpu(name, conf_root)
        return table[name]

    return get


def measure_stages(signatures: pd.DataFrame | Sequence[Mapping[str, Any]], *, seed: int,
                   gpus: GpuCatalog = None, conf_root: Path | None = None,
                   traits: Mapping[str, GpuTraits] | None = None, repeats: int = 1,
                   static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM,
                   source: str = SOURCE) -> pd.DataFrame:
    """The `simulated` profiling backend: measure every stage signature (rows with the stage_runs input
    columns; extra columns are ignored) `repeats` times; returns a stage_runs DataFrame.

    GPUs come from `gpus` (a Cluster, a name→GpuType mapping or GpuTypes) or, when None, from the
    catalog under `conf_root`. Deterministic for a seed; each measurement gets its own noise draw.
    """
    return stage_runs_frame(measure_stage_rows(signatures, seed=seed, gpus=gpus, conf_root=conf_root,
                                               traits=traits, repeats=repeats,
                                               static_bytes_per_param=static_bytes_per_param, source=source))


def measure_stage_rows(signatures: pd.DataFrame | Sequence[Mapping[str, Any]], *, seed: int,
                       gpus: GpuCatalog = None, conf_root: Path | None = None,
                       traits: Mapping[str, GpuTraits] | None = None, repeats: int = 1,
                       static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM,
                       source: str = SOURCE) -> list[dict[str, Any]]:
    """`measure_stages` as stage_runs rows (dicts, not yet a typed table): the profiler's per-point
    backend calls this, since building a one-row DataFrame per point cost more than the measurement."""
    records = signatures.to_dict("records") if isinstance(signatures, pd.DataFrame) else list(signatures)
    get_gpu, given = _gpu_lookup(gpus, conf_root), dict(traits or {})
    rng = np.random.default_rng(seed)
    stamp, rows = now_iso(), []
    for i, raw in enumerate(records):
        try:
            sig = signature_from_dict(raw)
        except InputError as exc:
            raise InputError(f"row {i}: {exc}") from exc
        gpu = get_gpu(sig.gpu)
        tr = given.get(sig.gpu) or load_traits(sig.gpu, conf_root)
        moe = is_moe_row(raw)  # a stage with experts (issue #27): its MoE layers, all-to-all over the ep group
        cluster = gpus if isinstance(gpus, Cluster) else None
        for _ in range(repeats):
            run = measure_expert_stage(sig, raw, gpu, tr, cluster, rng=rng, static_bytes_per_param=static_bytes_per_param) \
                if moe else measure_stage(sig, gpu, tr, rng=rng, static_bytes_per_param=static_bytes_per_param)
            rows.append(stage_run_row({**raw, **sig.to_dict()}, status=run.status, backend=BACKEND, time_ms=run.time_ms,
                                      peak_mem_mib=run.peak_mem_mib, static_mem_mib=run.static_mem_mib,
                                      reason=run.reason, measured_at=stamp, source=source))
    return rows


def config_run_row(plan: AnyPlan, run: PlanRun, *, seed: int, measured_at: str, source: str = SOURCE) -> dict[str, Any]:
    """One config_runs row; the plan as its JSON, schema 1 or 2 (docs/architecture.md §Plan JSON)."""
    return {
        "plan": any_plan_to_json(plan),
        "iteration_time_ms": run.iteration_time_ms,
        "peak_mem_mib": None if run.peak_mem_mib is None else list(run.peak_mem_mib),
        "oom": run.oom,
        "source": source,
        "seed": seed,
        "reason": run.reason,
        "measured_at": measured_at,
    }
