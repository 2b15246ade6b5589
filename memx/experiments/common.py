"""Shared by the experiments: predictors per scale, spaces, measuring plans on the virtual cluster,
measured Φ, Markdown tables."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from memx.planner.cost import AnalyticStageModel
from memx.learn.cache import CachedPredictor
from memx.domain.catalog import load_search
from memx.planner.objective import phi
from memx.domain.groups import AnyPlan, GroupedPlan, any_plan_to_json, group_plans
from memx.simulator import simulate_plan
from memx.domain.specs import Cluster, ModelArch, Node, SearchSpace, Weights

SCALES = ("small", "full")
EPSILON_MIB2 = 1.0e4
MAX_TIME_RATIO = 1.25  # conf/search/default.yaml


@dataclass
class Result:
    """What one experiment returns: its tables, the files it wrote and headline numbers."""

    name: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0


def check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}: allowed values are {', '.join(SCALES)}")


def space(name: str, **changes) -> SearchSpace:
    """A catalog search space in the paper's plan space: no distributed optimizer, no sequence
    parallelism (the paper's configurations have neither; the catalog's searches now turn both on, as
    Megatron-LM users do), and the paper's 1F1B formula (§3.1.2; the catalog's default is the cycle mean,
    docs/results.md §The 1F1B assembly: paper vs cycle-mean). `small` gets the default max_time_ratio (1.25) so Φ picks stay comparable."""
    sp = load_search(name)
    if name == "small" and "max_time_ratio" not in changes:
        changes["max_time_ratio"] = MAX_TIME_RATIO
    changes.setdefault("distributed_optimizer", (False,))
    changes.setdefault("sequence_parallel", (False,))
    changes.setdefault("pipeline_assembly", "paper")
    return dataclasses.replace(sp, **changes)


_PREDICTORS: dict[tuple, object] = {}


def predictor_kind(scale: str, kind: str | None) -> str:
    """analytic: the closed form; quick: profile on the simulator + one hybrid-calibrated fit (seconds, no
    Optuna/MLflow); registered: the pipeline's steps in-process (memx.pipeline.local: profile → augment →
Optuna → MLflow registry) and the champion of the fingerprint."""
    kind = kind or ("quick" if scale == "small" else "registered")
    if kind not in ("analytic", "quick", "registered"):
        raise ValueError(f"predictor {kind!r}: allowed values are analytic, quick, registered")
    return kind


def get_predictor(cluster: Cluster, model: ModelArch, sp: SearchSpace, kind: str, seed: int = 0):
    """A StagePredictor (memoised per GPU types, model, global batch, kind and seed in this process)."""
    key = (tuple(sorted(g.name for g in cluster.gpu_types)), model, sp.global_batch, kind, seed)
    if key in _PREDICTORS:
        return _PREDICTORS[key]
    gpus = {g.name: g for g in cluster.gpu_types}
    if kind == "analytic":
        pred = AnalyticStageModel(gpus=gpus)
    elif kind == "quick":
        from memx.learn.augment import augment
        from memx.learn import fit_predictor
        from memx.profiling import profile

        runs = profile(cluster, model, sp, backend="simulated", seed=seed).stage_runs
        pred = fit_predictor(augment(runs).stage_runs, gpus, seed=seed)
    else:
        pred = registered(cluster, model, sp, seed)
    _PREDICTORS[key] = pred
    return pred


def registered(cluster: Cluster, model: ModelArch, sp: SearchSpace, seed: int = 0):
    """The registry champion after the profile and train steps (each reused when stored)."""
    from memx.pipeline.local import profile_step, registered_predictor, train_step  # MLflow/XGBoost: only when asked

    profiles = profile_step(cluster, model, sp, backend="simulated", seed=seed)
    train_step(cluster, model, sp, seed=seed, profiles=profiles)
    return registered_predictor(cluster, model, sp).inner


def cached(pred) -> CachedPredictor:
    """A fresh in-memory prediction cache in front of `pred` (for hit-rate measurements)."""
    return CachedPredictor(pred, version=str(getattr(pred, "version", getattr(pred, "name", "p"))))


def grow(cluster: Cluster, factor: int, name: str | None = None) -> Cluster:
    """The cluster with every node repeated `factor` times (same GPU types: same predictor fingerprint)."""
    return dataclasses.replace(cluster, name=name or f"{cluster.name}-x{factor}", nodes=cluster.nodes * factor)  # network kept


def build_cluster(name: str, per_type: dict, *, node_size: int = 8, bandwidth_gbps: float = 28.0) -> Cluster:
    """A cluster of `per_type` {GpuType: count} in nodes of `node_size` GPUs of one type."""
    nodes = []
    for gpu, count in per_type.items():
        full, rest = divmod(count, node_size)
        nodes += [Node(gpu=gpu, count=node_size)] * full + ([Node(gpu=gpu, count=rest)] if rest else [])
    return Cluster(name=name, inter_node_bandwidth_gbps=bandwidth_gbps, nodes=tuple(nodes))


def measure(plans: list[AnyPlan], cluster: Cluster, model: ModelArch, *, seed: int, **sim) -> pd.DataFrame:
    """Simulate each plan once: time, per-GPU peaks, OOM, M, V, smallest margin (out of each GPU's own capacity, as
    the run reports it: nominal − the virtual cluster's driver reserve)."""
    rows = []
    for i, p in enumerate(plans):
        r = simulate_plan(p, cluster, model, seed=seed * 1_000_003 + i, **sim)
        peaks = np.asarray(r.peak_mem_mib if r.peak_mem_mib is not None else r.demand_mem_mib, dtype=float)
        cap = np.asarray(r.capacity_mib, dtype=float)
        rows.append({"plan": any_plan_to_json(p), "time_ms": r.iteration_time_ms if not r.oom else np.nan, "oom": r.oom,
                     "peaks": peaks, "capacity": cap, "M": float(peaks.max()), "V": float(peaks.var()),
                     "margin": float(((cap - peaks) / cap).min()), "reason": r.reason})
    return pd.DataFrame(rows)


def measured_phi(t, m, v, w: Weights) -> np.ndarray:
    """Φ of measured plans, medians over the measured plans given (paper §3.1.2)."""
    t, m, v = (np.asarray(x, dtype=float) for x in (t, m, v))
    refs = (float(np.median(t)), float(np.median(m)), float(np.median(v)))
    return np.asarray(phi(t, m, v, refs=refs, weights=w, epsilon_mib2=EPSILON_MIB2))


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")


def describe(plan: AnyPlan | None) -> str:
    """Compact plan text: dp, mb, then gpu×tp:layers[recompute] per stage (schema 2: each group with its
    share, groups joined by " ‖ ")."""
    if plan is None:
        return "—"
    if isinstance(plan, GroupedPlan):
        return " ‖ ".join(f"[{g.global_batch}] {describe(g)}" for g in group_plans(plan))
    short = {"none": "", "selective": "/sel", "full": "/full"}

    def st(s):
        rec = short[s.recompute]
        if s.recompute == "full" and s.recompute_layers is not None and s.recompute_layers < s.layers:
            rec = f"/blk{s.recompute_layers}"
        return f"{s.gpu.rsplit('-', 1)[0]}×{s.tp}:{s.layers}{rec}"

    return f"dp{plan.dp} mb{plan.micro_batch} " + " | ".join(st(s) for s in plan.stages)


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        a = abs(float(v))
        return f"{v:.3g}" if a < 1 else (f"{v:,.1f}" if a < 1e4 else f"{v:,.0f}")
    return str(v)


def markdown(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def write_tables(res: Result, out: Path, title: str, notes: str = "") -> Path:
    """One Markdown file per experiment: title, notes, every table; plus CSVs."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", "", notes.strip(), ""] if notes else [f"# {title}", ""]
    for name, df in res.tables.items():
        parts += [f"## {name}", "", markdown(df), ""]
        csv = out / f"{res.name}-{name}.csv"
        df.to_csv(csv, index=False)
        res.files.append(csv)
    parts.append(f"_Generated by `memx experiments {res.name.replace('_', '-')}` in {res.seconds:.1f} s._")
    path = out / f"{res.name}.md"
    path.write_text("\n".join(parts) + "\n")
    res.files.append(path)
    return path


def timer():
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0
