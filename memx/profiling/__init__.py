"""Minimal-set profiler (paper, "How do tens of thousands of configurations become affordable").

    result = profile(cluster, model, space, backend="simulated", out_dir=Path("profiles/x"))

Per GPU type: single-parameter sweeps around a centre point → sensitivity table → a 3-point grid over
the selected parameters plus embedding/output stages, block recompute, `inflight` coverage, and dense
intervals on one representative GPU type for the interpolation gate. Every point becomes one
`stage_runs` row (docs/architecture.md §Measurement records), failed ones included. See docs/profiling.md.

Nothing usable → `NothingUsable` (exit 5): a records import where every row is rejected (nothing is
written), or a profile whose sensitivity sweeps measured no point (every one failed or ran out of
memory; the failed rows stay in stage_runs.parquet, with their reasons, and a rerun retries them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from memx.domain.errors import InputError, NothingUsable
from memx.domain.io import atomic_write_parquet, atomic_write_text
from memx.domain.records import RejectedRow, require_rows, signature_key
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.profiling.backends import BACKENDS, Backend, check_backend
from memx.planner.variants import model_variants
from memx.planner.moe import dense_equivalent
from memx.profiling.design import (axis_points, context_points, dense_first_points, dense_points, ep_points,
                                   full_grid_size, gpu_axes, grid_points, inflight_points, profile_precision,
                                   representative_gpu, with_precision)
from memx.profiling.experts import ExpertDesign, expert_design, with_experts
from memx.profiling.runner import load_existing, run_points
from memx.profiling.sensitivity import (sensitivity_frame, sensitivity_markdown, sensitivity_rows, sweep_plan,
                                        sweep_points)

__all__ = ["BACKENDS", "ProfileResult", "profile", "require_measured"]

STAGE_RUNS_FILE = "stage_runs.parquet"
SENSITIVITY_FILE = "sensitivity.parquet"
SENSITIVITY_MD = "sensitivity.md"
MAX_JOBS = 1_024  # points measured at once (one thread each)
MAX_TIMEOUT_S = 7 * 86_400.0  # one point may run a week at most
MAX_RETRIES = 100  # retries of a point that exits non-zero
SEARCHED = {"tp", "micro_batch", "recompute", "layers", "inflight", "position"}  # seq_len: one value per search


@dataclass(frozen=True, kw_only=True)
class ProfileResult:
    stage_runs: pd.DataFrame  # STAGE_RUN_COLUMNS (memx.domain.records), failed rows included (status oom/failed + reason)
    sensitivity: pd.DataFrame  # per gpu × parameter: time_change, mem_change (fractions), selected
    runs: int  # points of the minimal-set design (sweeps, grid, dense, inflight), or rows imported
    full_grid: int  # points of the full grid over the same parameters and values
    failed: int  # rows with status 'failed' (no measurement); OOM rows are counted in `oom`
    path: Path | None  # stage_runs Parquet written under out_dir
    oom: int = 0
    runs_by_gpu: dict[str, int] = field(default_factory=dict)
    full_grid_by_gpu: dict[str, int] = field(default_factory=dict)
    rejected: tuple[RejectedRow, ...] = ()  # records backend: rows that failed validation

    def failures_by_reason(self) -> dict[str, int]:
        return failures_by_reason(self.stage_runs)

    def summary(self) -> str:
        ratio = self.full_grid / self.runs if self.runs else float("nan")
        lines = [f"runs={self.runs} full_grid={self.full_grid} reduction={ratio:.1f}x "
                 f"failed={self.failed} oom={self.oom}"]
        for gpu, n in self.runs_by_gpu.items():
            lines.append(f"  {gpu}: {n} runs vs full grid {self.full_grid_by_gpu.get(gpu, 0)}")
        for reason, n in sorted(self.failures_by_reason().items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n} × {reason}")
        return "\n".join(lines)


def failures_by_reason(stage_runs: pd.DataFrame) -> dict[str, int]:
    """Rows not measured (status oom/failed), counted per status and reason class."""
    bad = stage_runs[stage_runs["status"] != "ok"]
    return dict(Counter(f"{s}: {_reason_class(r)}" for s, r in zip(bad["status"], bad["reason"])))


def require_measured(stage_runs: pd.DataFrame, backend: str) -> None:
    """NothingUsable when no row is 'ok': counts per reason and the first three points."""
    if (stage_runs["status"] == "ok").any():
        return
    bad = stage_runs[stage_runs["status"] != "ok"].head(3)
    examples = [f"{r.gpu} tp={r.tp} layers={r.layers} micro_batch={r.micro_batch} {r.recompute}: {r.status}, "
                f"{r.reason[:160]}" for r in bad.itertuples(index=False)]
    raise NothingUsable(f"backend '{backend}' measured none of {len(stage_runs)} point(s)",
                        failures_by_reason(stage_runs), examples)


def _reason_class(reason: str) -> str:
    """Group reasons for the summary: drop per-point details after the first ':' of known kinds."""
    for prefix in ("timeout after", "command not found", "command not executable", "exit code", "unparseable output",
                   "out of memory", "JSON output"):
        if reason.startswith(prefix):
            return prefix
    return reason.split(";")[0][:60] or "(no reason)"


def _make_backend(name: str, *, cluster: Cluster, model: ModelArch, seed: int, conf_root: Path | None,
                  command: list[str] | None, timeout_s: float, retries: int) -> Backend:
    if name == "simulated":
        from memx.profiling.backends.simulated import SimulatedBackend
        return SimulatedBackend(cluster=cluster, seed=seed, conf_root=conf_root)
    if name == "command":
        from memx.profiling.backends.command import CommandBackend, check_template
        if not command:
            raise InputError("backend 'command' needs --command (the program and its arguments)")
        check_template(list(command))
        if not 0 < timeout_s <= MAX_TIMEOUT_S:
            raise InputError(f"--timeout must be in (0, {MAX_TIMEOUT_S:g}] seconds; got {timeout_s!r}")
        if not 0 <= retries <= MAX_RETRIES:
            raise InputError(f"--retries must be in 0..{MAX_RETRIES}; got {retries!r}")
        return CommandBackend(argv=tuple(command), model_name=model.name, timeout_s=timeout_s, retries=retries,
                              gpu_memory_mib={g.name: g.memory_mib for g in cluster.gpu_types})
    from memx.profiling.backends.torch import TorchBackend
    return TorchBackend(seed=seed)


def _torch_model(model: ModelArch) -> ModelArch:
    """The model the torch backend runs: scaled down on CPU (rows record the shapes run)."""
    try:
        import torch
    except ImportError as exc:
        raise InputError("backend 'torch' needs PyTorch: pip install -e '.[torch]' (CPU build is enough)") from exc
    from memx.profiling.backends.torch import auto_scale, scale_model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return scale_model(model, auto_scale(model, device))


def _import_records(records: Path | None, out_path: Path | None, cluster: Cluster) -> tuple[pd.DataFrame, list]:
    from memx.profiling.backends.imported import read_records
    if records is None:
        raise InputError("backend 'records' needs --records PATH (CSV, Parquet or JSONL)")
    df, rejects = read_records(Path(records), gpu_memory_mib={g.name: g.memory_mib for g in cluster.gpu_types})
    require_rows(df, rejects, what=f"records {records}")
    if out_path is not None:
        atomic_write_parquet(df, out_path)
    return df, rejects


def profile(cluster: Cluster, model: ModelArch, space: SearchSpace, *, backend: str = "simulated",
            out_dir: Path | None = None, seed: int = 0, jobs: int = 1, command: list[str] | None = None,
            records: Path | None = None, timeout_s: float = 600.0, retries: int = 1,
            conf_root: Path | None = None, progress: bool = False, moe_layers: str = "points") -> ProfileResult:
    """Profile every GPU type of `cluster` for `model` over `space`; see the module docstring. `moe_layers` (a
    MoE model, memx.profiling.experts.MOE_LAYERS): "points" (the default) the dense equivalent's design plus MoE
    points at every searched ep and tp, "all" every point a MoE stage, "none" the dense equivalent only (the design
    before issue #27); measured side by side in bench/moe_learned.py (docs/results.md §15)."""
    check_backend(backend)
    if not 1 <= jobs <= MAX_JOBS:
        raise InputError(f"--jobs must be in 1..{MAX_JOBS}, got {jobs!r}")
    experts = expert_design(cluster, model, space, moe_layers if backend != "torch" else "none")  # issue #27
    model = profiled_model(model)
    if backend == "torch":
        model = _torch_model(model)
    axes = {g.name: gpu_axes(cluster, model, space, g, experts) for g in cluster.gpu_types}
    full_by_gpu = {g: full_grid_size(a) for g, a in axes.items()}
    out_path = Path(out_dir) / STAGE_RUNS_FILE if out_dir is not None else None
    if backend == "records":
        df, rejects = _import_records(records, out_path, cluster)
        return _result(df, sensitivity_frame([]), runs_by_gpu=dict(Counter(df["gpu"])), full_by_gpu=full_by_gpu,
                       path=out_path, rejected=rejects, out_dir=out_dir)
    be = _make_backend(backend, cluster=cluster, model=model, seed=seed, conf_root=conf_root, command=command,
                       timeout_s=timeout_s, retries=retries)
    plans = {g: {k: [(v, *with_experts([p], experts)) for v, p in vals] for k, vals in sweep_plan(a, model).items()}
             for g, a in axes.items()}
    precision = profile_precision(cluster, space)  # measured in the precision the plans train in (issue #23)
    phase1 = with_experts(dense_points(axes[representative_gpu(cluster).name], model), experts)
    phase1 = with_precision(phase1 + [p for g in axes for p in sweep_points(plans[g])], precision)
    with _launch_guard(backend):
        df = run_points(phase1, be, existing=load_existing(out_path), out_path=out_path, jobs=jobs,
                        progress=progress, label="sensitivity sweeps")
        require_measured(df, backend)  # nothing measured: the 3-point grid would fail the same way
        variant_axes = _variant_axes(cluster, model, space)
        df, sens, runs_by_gpu = _phase2(model, axes, plans, phase1, df, be, out_path, jobs, progress, variant_axes,
                                        precision, experts)
    return _result(df, sensitivity_frame(sens), runs_by_gpu=runs_by_gpu,
                   full_by_gpu=full_by_gpu, path=out_path, rejected=[], out_dir=out_dir)


def profiled_model(model: ModelArch) -> ModelArch:
    """The model whose signature columns a profile's points carry: a MoE model's dense equivalent (issue #27,
    memx.planner.moe.dense_equivalent) — the signatures the search asks a stage predictor for. The points also
    carry the MoE signature (memx.profiling.experts: the expert fields, ep, the all-to-all link), and a backend
    runs the real MoE layers (docs/profiling.md §Mixture of experts)."""
    return dense_equivalent(model) if model.is_moe else model


def _launch_guard(backend: str) -> contextlib.AbstractContextManager:
    """Command launches: killed on SIGTERM, Ctrl-C and errors (memx.profiling.backends.launches)."""
    if backend != "command":
        return contextlib.nullcontext()
    from memx.profiling.backends.launches import guard
    return guard()


def _variant_axes(cluster: Cluster, model: ModelArch, space: SearchSpace) -> list[tuple[ModelArch, dict]]:
    """(model, axes per GPU type) of every model variant the search will train besides the job as given
    (memx.planner.variants: heads / query_groups / seq_len options, issue #14); [] without options."""
    plain = dataclasses.replace(space, heads_options=(), query_groups_options=(), seq_len_options=())
    out = []
    for v in model_variants(model, space):
        if (v.model, v.seq_len) == (model, space.seq_len or model.seq_len):
            continue
        sp = dataclasses.replace(plain, seq_len=v.seq_len)
        out.append((v.model, {g.name: gpu_axes(cluster, v.model, sp, g) for g in cluster.gpu_types}))
    return out


def _phase2(model: ModelArch, axes: dict, plans: dict, phase1: list, df: pd.DataFrame,
            be: Backend, out_path: Path | None, jobs: int, progress: bool,
            variant_axes: list[tuple[ModelArch, dict]] = (), precision: str = "bf16",
            experts: ExpertDesign | None = None) -> tuple[pd.DataFrame, list, dict]:
    """Sensitivity of each GPU type → the 3-point grid over the selected parameters, measured; each model
    variant the search trains gets the same grid on its own shapes (heads, query groups, sequence length move
    attention time and activation memory, so the predictor must not extrapolate to them)."""
    sens, phase2 = [], []
    for g, a in axes.items():
        searched = SEARCHED | ({"sequence_parallel"} if len(a.sp_options) > 1 else set())  # issue #14
        rows = sensitivity_rows(g, plans[g], df, searched)
        selected = {r["parameter"] for r in rows if r["selected"]}
        sens += rows
        phase2 += grid_points(a, model, selected) + inflight_points(a, model, selected)
        phase2 += axis_points(a, model, selected)  # a second micro batch, the other sequence parallelism (#23)
        phase2 += ep_points(a, model, memory=experts is not None and not experts.everywhere)  # other ep values (#27)
        phase2 += context_points(a, model, selected)  # the rank lengths of the searched cp sizes (#27)
        phase2 += [p for vm, va in variant_axes for p in grid_points(va[g], vm, selected)]
    # a MoE model's dense-first layers as the dense layers they are, never given expert columns (#27 session 5)
    dense_first = [p for a in axes.values() for p in dense_first_points(a, experts.model)] if experts is not None else []
    phase2 = with_precision(with_experts(phase2, experts) + dense_first, precision)
    df = run_points(phase2, be, existing=df, out_path=out_path, jobs=jobs, progress=progress, label="3-point grid")
    unique = {signature_key(p): p["gpu"] for p in phase1 + phase2}
    return df, sens, dict(Counter(unique.values()))


def _result(df: pd.DataFrame, sens: pd.DataFrame, *, runs_by_gpu: dict[str, int], full_by_gpu: dict[str, int],
            path: Path | None, rejected: list, out_dir: Path | None) -> ProfileResult:
    if out_dir is not None:
        atomic_write_parquet(sens, Path(out_dir) / SENSITIVITY_FILE)
        atomic_write_text(Path(out_dir) / SENSITIVITY_MD, sensitivity_markdown(sens))
    return ProfileResult(stage_runs=df, sensitivity=sens, runs=sum(runs_by_gpu.values()),
                         full_grid=sum(full_by_gpu.values()), failed=int((df["status"] == "failed").sum()),
                         oom=int((df["status"] == "oom").sum()), path=path, runs_by_gpu=runs_by_gpu,
                         full_grid_by_gpu=full_by_gpu, rejected=tuple(rejected))
