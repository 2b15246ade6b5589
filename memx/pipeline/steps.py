"""The pipeline's versioned stages: profile → augment → train → search (DESIGN.md §1).

Each stage's version is a content hash of its inputs — catalog specs, upstream versions, options
and the code version — so the same inputs find the stored artifact and the stage is skipped.
Functions here are plain library code: `version_*` names a stage's output, `compute_*` produces
it; flows/ wraps them as Prefect tasks and does the store I/O (with retries) around them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from memx.domain.plan import plan_to_dict
from memx.pipeline.store import content_version
from memx.domain.specs import Cluster, ModelArch, SearchSpace

STAGES = ("profile", "augment", "train", "search")


# What each stage's code version covers, as packages/modules under memx/ (docs/architecture.md):
# a change there re-versions the stage (and, through the upstream versions, everything after it);
# unrelated code (reports, experiments, CLI) does not.
STAGE_CODE = {
    "profile": ("profiling", "simulator", "domain", "planner/cost.py", "planner/signatures.py", "../conf/simulator"),
    "augment": ("learn/augment.py",),
    "train": ("learn", "pipeline/local.py", "pipeline/registry.py", "planner/cost.py"),
    "search": ("planner", "domain", "learn/cache.py", "report/table.py"),
}


@lru_cache(maxsize=None)
def code_version(stage: str) -> str:
    """Hash of the source files (and, for profiles, the simulator's trait catalog) a stage runs."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for part in STAGE_CODE[stage]:
        target = (root / part).resolve()
        files = sorted(target.rglob("*")) if target.is_dir() else [target]
        for p in files:
            if p.is_file() and p.suffix in (".py", ".yaml"):
                h.update(str(p.relative_to(root.parent)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def gpu_specs(cluster: Cluster) -> list[dict[str, Any]]:
    return [dataclasses.asdict(g) for g in sorted(cluster.gpu_types, key=lambda g: g.name)]


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """What a computed stage hands to the store: tables, files and its manifest."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


# --- profile (one artifact per GPU type) -------------------------------------------------------

def single_type(cluster: Cluster, gpu: str) -> Cluster:
    """The cluster's nodes of one GPU type: profiles measure single stages, so node counts of other
    types do not matter and adding nodes of a known type re-profiles nothing."""
    return dataclasses.replace(cluster, name=f"{cluster.name}:{gpu}", nodes=tuple(n for n in cluster.nodes if n.gpu.name == gpu))


def profile_key(cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace, *, backend: str, seed: int,
                options: dict[str, Any]) -> str:
    """What a GPU type's profile depends on: its spec and node size, the model, the search ranges."""
    sub = single_type(cluster, gpu)
    return content_version("profile", dataclasses.asdict(sub.gpu(gpu)), max(sub.node_sizes(gpu)),
                           dataclasses.asdict(model), dataclasses.asdict(space), backend, seed, options,
                           code_version("profile"))


def version_profile(key: str, refresh: str = "") -> str:
    """A profile version: its key, plus a refresh token when a re-profile is forced (nightly)."""
    return content_version(key, refresh)


def compute_profile(cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace, *, backend: str, seed: int,
                    conf_root: Path | None, options: dict[str, Any], key: str) -> StageResult:
    from memx.profiling import profile

    t0 = time.perf_counter()
    res = profile(single_type(cluster, gpu), model, space, backend=backend, seed=seed, conf_root=conf_root, **options)
    return StageResult(
        tables={"stage_runs": res.stage_runs, "sensitivity": res.sensitivity},
        manifest={"stage": "profile", "key": key, "gpu": gpu, "backend": backend, "seed": seed, "model": model.name,
                  "rows": int(len(res.stage_runs)), "runs": res.runs, "full_grid": res.full_grid,
                  "failed": res.failed, "seconds": round(time.perf_counter() - t0, 3)})


# --- augment -------------------------------------------------------------------------------------

def version_augment(profile_versions: list[str], *, seed: int, r2_threshold: float, valid_fraction: float) -> str:
    return content_version("augment", sorted(profile_versions), seed, r2_threshold, valid_fraction, code_version("augment"))


def compute_augment(stage_runs: pd.DataFrame, *, seed: int, r2_threshold: float, valid_fraction: float) -> StageResult:
    """Hold out measured rows first, then interpolate inside the training rows only (R² gate)."""
    from memx.learn.augment import augment
    from memx.pipeline.local import split_held_out

    train, valid = split_held_out(stage_runs, valid_fraction, seed)
    aug = augment(train, r2_threshold=r2_threshold)
    return StageResult(
        tables={"train": aug.stage_runs, "valid": valid, "gates": aug.gates},
        manifest={"stage": "augment", "rows_before": aug.rows_before, "rows_after": aug.rows_after,
                  "growth": round(aug.growth, 3), "held_out": int(len(valid)), "r2_threshold": r2_threshold})


# --- train ---------------------------------------------------------------------------------------

def version_train(augment_version: str, fingerprint: str, *, seed: int, budget: dict[str, Any]) -> str:
    return content_version("train", augment_version, fingerprint, seed, budget, code_version("train"))


def compute_train(augmented: dict[str, pd.DataFrame], augment_manifest: dict[str, Any], cluster: Cluster,
                  model: ModelArch, space: SearchSpace, *, seed: int, tracking_uri: str | None) -> StageResult:
    """augmented: the augment stage's tables (train, valid, gates)."""
    from memx.pipeline import registry
    from memx.learn.augment import AugmentResult
    from memx.pipeline.local import TrainConfig, train_on

    fp = registry.fingerprint(cluster, model, space.global_batch)
    aug = AugmentResult(stage_runs=augmented["train"], gates=augmented["gates"],
                        rows_before=int(augment_manifest["rows_before"]), rows_after=int(augment_manifest["rows_after"]))
    out = train_on(aug, augmented["valid"], {g.name: g for g in cluster.gpu_types}, fp, config=TrainConfig(seed=seed),
                   tracking_uri=tracking_uri, data_version=augment_manifest["version"])
    return StageResult(
        tables={"variants": out.variant_errors},
        manifest={"stage": "train", "model_version": int(out.version), "run_id": out.run_id, "promoted": out.promoted,
                  "variant": out.predictor.variant, "fingerprint": fp.fingerprint,
                  "experiment_id": _experiment_of(out.run_id),
                  "held_out": {k: float(v) for k, v in out.errors.items()},
                  "tracking_uri": registry.tracking_uri(tracking_uri)})


def _experiment_of(run_id: str) -> str:
    import mlflow

    return mlflow.get_run(run_id).info.experiment_id


def load_trained(manifest: dict[str, Any], tracking_uri: str | None):
    """The stage predictor a train manifest names, wrapped in its prediction cache."""
    from memx.pipeline import registry
    from memx.pipeline.local import cached

    registry.setup(tracking_uri)
    pred = registry.load_version(manifest["model_version"])
    return cached(pred, manifest["fingerprint"], manifest["model_version"])


# --- search --------------------------------------------------------------------------------------

def version_search(train_version: str, cluster: Cluster, model: ModelArch, space: SearchSpace, *,
                   weights: str | None, top_k: int) -> str:
    return content_version("search", train_version, dataclasses.asdict(cluster), dataclasses.asdict(model),
                           dataclasses.asdict(space), weights, top_k, code_version("search"))


def compute_search(predictor, cluster: Cluster, model: ModelArch, space: SearchSpace, *, weights: str | None,
                   top_k: int, mapper=None, shard_by: str = "layout", predictor_name: str = "learned") -> StageResult:
    from memx.report.table import to_json_obj, to_markdown
    from memx.planner.search import search

    result = search(cluster, model, space, predictor, weights=weights, top_k=top_k, mapper=mapper, shard_by=shard_by)
    obj = to_json_obj(result, predictor_name)
    top = pd.DataFrame([{"rank": i + 1, "plan": json.dumps(plan_to_dict(c.plan)), "phi": c.phi,
                         "iteration_time_ms": c.iteration_time_ms, "max_mem_mib": c.max_mem_mib,
                         "mem_std_gib": c.mem_variance_mib2 ** 0.5 / 1024, "min_margin": c.min_margin}
                        for i, c in enumerate(result.top)])
    hit = getattr(predictor, "last_hit_rate", None)
    return StageResult(
        tables={"top": top},
        files={"plan.json": json.dumps(obj, indent=2).encode(), "plan.md": to_markdown(obj).encode()},
        manifest={"stage": "search", "search_s": round(result.search_s, 3), "evaluated": result.space.evaluated,
                  "feasible": result.space.feasible, "weights": result.weights.profile,
                  "cache_hit_rate": None if hit is None else float(hit() if callable(hit) else hit),
                  "iteration_time_ms": result.best.iteration_time_ms, "min_margin": result.best.min_margin})
