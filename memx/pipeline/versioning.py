"""Versions of the pipeline's steps (docs/architecture.md §Versions and fingerprints).

Every version here is `memx.domain.hashing.stable_hash` of its inputs — catalog specs, upstream
versions, options and the code version of the step — so the same inputs find the stored artifact
and the step is skipped. `version_*` names a step's output; memx.pipeline.steps computes it.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from memx.domain.hashing import bytes_hash, stable_hash
from memx.domain.specs import Cluster, ModelArch, SearchSpace

STEPS = ("profile", "augment", "train", "search")
PRESENTATION_OPTIONS = ("progress", "jobs")  # profiling options that do not change what is measured

# What each step's code version covers, as packages/modules under memx/: a change there re-versions the
# step (and, through the upstream versions, everything after it); unrelated code (reports, experiments,
# CLI) does not. conf/runtime's driver reserves set every GPU's usable capacity (memx.domain.runtime.
# usable_capacity_mib), which places the profiling design's points and bounds the search: both steps cover it.
STEP_CODE = {
    "profile": ("profiling", "simulator", "domain", "planner/cost.py", "planner/signatures.py", "../conf/simulator",
                "../conf/runtime"),
    "augment": ("learn/augment.py", "pipeline/training.py"),
    "train": ("learn", "pipeline/training.py", "pipeline/registry.py", "planner/cost.py"),
    "search": ("planner", "domain", "learn/cache.py", "../conf/runtime"),
}


def content_version(*parts: Any) -> str:
    """The version naming a step's output: the one hash family over its inputs."""
    return stable_hash(*parts)


@lru_cache(maxsize=None)
def code_version(step: str) -> str:
    """Hash of the source files (and, for profiles, the simulator's trait catalog) a step runs."""
    root = Path(__file__).resolve().parents[1]
    files = []
    for part in STEP_CODE[step]:
        target = (root / part).resolve()
        for p in sorted(target.rglob("*")) if target.is_dir() else [target]:
            if p.is_file() and p.suffix in (".py", ".yaml"):
                files.append((str(p.relative_to(root.parent)), bytes_hash(p.read_bytes())))
    return stable_hash(step, files)


def frame_version(df: pd.DataFrame) -> str:
    """Content hash of a table (the registry's data_version and held_out tags)."""
    rows = pd.util.hash_pandas_object(df.astype(str), index=False).to_numpy()  # one uint64 per row, vectorised
    return stable_hash(bytes_hash(rows.tobytes()), [str(c) for c in df.columns])


# --- profile: one artifact per GPU type -----------------------------------------------------------

def single_type(cluster: Cluster, gpu: str) -> Cluster:
    """The cluster's nodes of one GPU type: profiles measure single stages, so node counts of other
    types do not matter and adding nodes of a known type re-profiles nothing."""
    return dataclasses.replace(cluster, name=f"{cluster.name}:{gpu}", nodes=tuple(n for n in cluster.nodes if n.gpu.name == gpu))


def profile_subject(cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace) -> str:
    """What a GPU type's profile measures — its spec and node size, the model, the search ranges —
    whatever backend measured it (how `train_step` finds the profiles `memx profile` stored)."""
    sub = single_type(cluster, gpu)
    return content_version("profile-subject", dataclasses.asdict(sub.gpu(gpu)), max(sub.node_sizes(gpu)),
                           dataclasses.asdict(model), dataclasses.asdict(space))


def profile_key(cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace, *, backend: str, seed: int,
                options: dict[str, Any]) -> str:
    """What a GPU type's profile depends on: its subject, the backend, seed, options and code (not how it
    is shown or how many points run at once: PRESENTATION_OPTIONS)."""
    measured = {k: v for k, v in options.items() if k not in PRESENTATION_OPTIONS}
    return content_version("profile", profile_subject(cluster, gpu, model, space), backend, seed, measured,
                           code_version("profile"))


def version_profile(key: str, refresh: str = "") -> str:
    """A profile version: its key, plus a refresh token when a re-profile is forced (nightly)."""
    return content_version(key, refresh)


# --- augment, train, search -----------------------------------------------------------------------

def version_augment(profile_versions: list[str], *, seed: int, r2_threshold: float, valid_fraction: float,
                    max_new_per_gap: int) -> str:
    return content_version("augment", sorted(profile_versions), seed, r2_threshold, valid_fraction, max_new_per_gap,
                           code_version("augment"))


def train_key(augment_version: str, fingerprint: str, *, seed: int, budget: dict[str, Any]) -> str:
    """What a training depends on; the stored version adds the model version it registered."""
    return content_version("train", augment_version, fingerprint, seed, budget, code_version("train"))


def version_train(key: str, model_version: int, tracking_uri: str) -> str:
    """A train version names the registered model too, so a retrain (against a registry that lost the
    model) never collides with a stale manifest."""
    return content_version(key, model_version, tracking_uri)


def version_search(champion: dict[str, Any], cluster: Cluster, model: ModelArch, space: SearchSpace, *,
                   weights: str | None, top_k: int) -> str:
    """`champion`: the registry champion the search plans with (model version, predictor version,
    tracking URI) — not the version just trained, which may not have been promoted."""
    return content_version("search", champion, dataclasses.asdict(cluster), dataclasses.asdict(model),
                           dataclasses.asdict(space), weights, top_k, code_version("search"))
