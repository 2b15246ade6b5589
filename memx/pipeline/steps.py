"""The pipeline's steps: profile → augment → train → search, each a versioned artifact in the store
(docs/architecture.md §Artifact store, §Versions and fingerprints).

This is the only code that profiles, augments, trains and searches as stored artifacts. Each step
function takes a store, finds its version (memx.pipeline.versioning) and reuses a complete stored
version when there is one; otherwise it computes (`compute_*`, plain library code) and stores the
result, manifest last. memx.pipeline.local runs the steps in-process; flows/ wraps the same
functions as Prefect tasks. The search step plans with the registry champion of the fingerprint
(memx.pipeline.training), never with "the version just trained" (it may not have been promoted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from collections import Counter
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from memx.domain.errors import InputError, NothingUsable
from memx.domain.records import nothing_usable
from memx.domain.groups import any_plan_from_dict, validate_any_plan
from memx.domain.home import home_path
from memx.domain.plan import plan_to_dict
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.learn.augment import AugmentResult
from memx.pipeline import registry
from memx.pipeline.store import ArtifactStore
from memx.pipeline.training import TrainConfig, champion_predictor, champion_ref, split_and_augment, train_on
from memx.planner.result import search_result_to_dict
from memx.planner.launcher import launcher_search
from memx.planner.search import Progress
from memx.pipeline.versioning import (
    STEPS,
    profile_key,
    profile_subject,
    single_type,
    train_key,
    version_augment,
    version_profile,
    version_search,
    version_train,
)

log = logging.getLogger(__name__)

__all__ = ["STEPS", "StepResult", "StepRun", "augment_profiles", "profile_all", "profile_one", "search_champion",
           "stored_profiles", "train_augmented"]


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What a computed step hands to the store: tables, files and its manifest."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StepRun:
    """What running a step did: the version it stands for, whether it was reused, its manifest."""

    step: str
    version: str
    reused: bool
    manifest: dict[str, Any]

    def line(self) -> str:
        what = self.manifest.get("gpu", "")
        return f"{self.step}{' ' + what if what else ''}: {'reused' if self.reused else 'stored'} {self.version}"


def newest_with(store: ArtifactStore, step: str, **match: Any) -> tuple[str, dict[str, Any]] | None:
    """The newest complete version of `step` whose manifest has these values, with its manifest."""
    for ref in store.list_versions(step):
        doc = store.manifest(step, ref.version)
        if all(doc.get(k) == v for k, v in match.items()) and store.has_step(step, ref.version):
            return ref.version, doc
    return None


def save(store: ArtifactStore, step: str, version: str, result: StepResult, inputs: dict[str, Any],
         replace: bool = False) -> StepRun:
    store.put_step(step, version, tables=result.tables, files=result.files, manifest={**result.manifest, "inputs": inputs},
                   replace=replace)
    return StepRun(step=step, version=version, reused=False, manifest=store.manifest(step, version))


# --- profile: one artifact per GPU type ------------------------------------------------------------

def _require_usable_type(res: Any, gpu: str) -> None:
    """A records import (`ProfileResult`) holds a usable row of `gpu`: TypeNotInRecords when it names no row
    of it (the type stays unprofiled); NothingUsable when every row of it was rejected or failed (bad input:
    an all-failed profile is never stored)."""
    from memx.profiling import require_measured

    runs = res.stage_runs.loc[res.stage_runs["gpu"] == gpu]
    rejected = [r for r in res.rejected if r.gpu == gpu]
    if runs.empty and rejected:
        raise nothing_usable(rejected, what=f"records for {gpu}")
    if runs.empty:
        raise TypeNotInRecords(f"records for {gpu}: no imported row is for this GPU type",
                               dict(Counter(f"row for {g}" for g in res.stage_runs["gpu"].astype(str))))
    require_measured(runs, "records")


def _check_records(cluster: Cluster, model: ModelArch, space: SearchSpace, options: dict[str, Any]) -> None:
    """Before any GPU type is stored: every type the records name has a usable row (NothingUsable)."""
    from memx.profiling import profile

    res = profile(cluster, model, space, backend="records", records=options.get("records"))
    for g in cluster.gpu_types:
        with contextlib.suppress(TypeNotInRecords):
            _require_usable_type(res, g.name)


class TypeNotInRecords(NothingUsable):
    """A records import names no row of this GPU type (it stays unprofiled); every row of a type that the
    file does name being rejected is plain NothingUsable."""


def compute_profile(cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace, *, backend: str, seed: int,
                    conf_root: Path | None, options: dict[str, Any], key: str) -> StepResult:
    """One GPU type's profile. Points measured so far are kept in a scratch folder under MEMX_HOME
    (`profiling_scratch(key)`), so an interrupted profile resumes where it stopped; the caller removes
    it once the step is stored. A records file may hold every GPU type: this type's profile keeps only
    its own rows."""
    from memx.profiling import profile  # the profiler pulls in every backend: only when a profile is measured

    t0 = time.perf_counter()
    res = profile(single_type(cluster, gpu), model, space, backend=backend, seed=seed, conf_root=conf_root,
                  out_dir=None if backend == "records" else profiling_scratch(key), **options)  # records: no resume
    runs, count = res.stage_runs, res.runs
    if backend == "records":
        runs = runs.loc[runs["gpu"] == gpu].reset_index(drop=True)
        count = len(runs)
        _require_usable_type(res, gpu)
    return StepResult(
        tables={"stage_runs": runs, "sensitivity": res.sensitivity},
        manifest={"key": key, "subject": profile_subject(cluster, gpu, model, space), "gpu": gpu, "backend": backend,
                  "seed": seed, "model": model.name, "rows": int(len(runs)), "runs": count,
                  "full_grid": res.full_grid, "failed": int((runs["status"] == "failed").sum()),
                  "seconds": round(time.perf_counter() - t0, 3)})


def profiling_scratch(key: str) -> Path:
    """Where a profile step keeps the points measured so far (resumed after an interruption)."""
    return home_path("profiling", key)


def profile_one(store: ArtifactStore, cluster: Cluster, gpu: str, model: ModelArch, space: SearchSpace, *,
                backend: str, seed: int, conf_root: Path | None, options: dict[str, Any],
                refresh_token: str | None = None) -> StepRun:
    """One GPU type's profile: the newest stored one with the same key, else measured and stored.
    With `refresh_token`, measured again under a new version (the nightly re-profile)."""
    key = profile_key(cluster, gpu, model, space, backend=backend, seed=seed, options=options)
    found = None if refresh_token is not None else newest_with(store, "profile", key=key)
    if found is not None:
        return StepRun(step="profile", version=found[0], reused=True, manifest=found[1])
    result = compute_profile(cluster, gpu, model, space, backend=backend, seed=seed, conf_root=conf_root,
                             options=options, key=key)
    run = save(store, "profile", version_profile(key, refresh_token or ""), result,
               {"cluster": cluster.name, "gpu": gpu, "backend": backend})
    scratch = profiling_scratch(key)
    shutil.rmtree(scratch, ignore_errors=True)  # stored: nothing left to resume
    with contextlib.suppress(OSError):
        scratch.parent.rmdir()  # the scratch root goes too once no other profile is in progress
    return run


def profile_all(store: ArtifactStore, cluster: Cluster, model: ModelArch, space: SearchSpace, *, backend: str,
                seed: int, conf_root: Path | None, options: dict[str, Any], refresh: Collection[str] = (),
                refresh_token: str = "", log: Callable[[str], None] = lambda _: None) -> dict[str, str]:
    """{GPU type: profile version} for every GPU type of the cluster; types in `refresh` re-measured."""
    out, unusable = {}, []
    if backend == "records":
        _check_records(cluster, model, space, options)
    for g in cluster.gpu_types:
        try:
            run = profile_one(store, cluster, g.name, model, space, backend=backend, seed=seed, conf_root=conf_root,
                              options=options, refresh_token=refresh_token if g.name in refresh else None)
        except TypeNotInRecords as exc:
            # imported records may cover only some GPU types: the others stay unprofiled (said here and by
            # `memx train`, which names the types without a profile); nothing at all is still an error
            log(f"profile {g.name}: not stored — {str(exc).splitlines()[0]}")
            unusable.append(exc)
            continue
        log(run.line())
        out[g.name] = run.version
    if not out and unusable:
        raise unusable[0]
    return out


def stored_profiles(store: ArtifactStore, cluster: Cluster, model: ModelArch, space: SearchSpace) -> dict[str, str]:
    """{GPU type: newest stored profile version} of this cluster's GPU types, model and search space,
    whichever backend measured them; InputError naming the missing types and the fingerprint."""
    out, missing = {}, []
    for g in cluster.gpu_types:
        found = newest_with(store, "profile", subject=profile_subject(cluster, g.name, model, space))
        if found is None:
            missing.append(g.name)
        else:
            out[g.name] = found[0]
    if missing:
        fp = registry.fingerprint(cluster, model, space.global_batch)
        raise InputError(f"no stored profile for GPU type(s) {', '.join(missing)} of cluster {cluster.name}, model "
                         f"{model.name}, global batch {space.global_batch} (fingerprint {fp.fingerprint}) in "
                         f"{store.root_uri}; run `memx profile` first with the same cluster, model and search space")
    return out


# --- augment ---------------------------------------------------------------------------------------

def compute_augment(stage_runs: pd.DataFrame, config: TrainConfig) -> StepResult:
    """Hold out measured rows first, then interpolate inside the training rows only (R² gate)."""
    aug, valid = split_and_augment(stage_runs, config)
    return StepResult(
        tables={"train": aug.stage_runs, "valid": valid, "gates": aug.gates},
        manifest={"rows_before": aug.rows_before, "rows_after": aug.rows_after, "growth": round(aug.growth, 3),
                  "held_out": int(len(valid)), "r2_threshold": config.r2_threshold})


def augment_profiles(store: ArtifactStore, profile_versions: Collection[str], config: TrainConfig) -> StepRun:
    """The augmented training rows and held-out rows of these profiles (all GPU types together)."""
    versions = sorted(profile_versions)
    version = version_augment(versions, seed=config.seed, r2_threshold=config.r2_threshold,
                              valid_fraction=config.valid_fraction, max_new_per_gap=config.max_new_per_gap)
    if store.has_step("augment", version):
        return StepRun(step="augment", version=version, reused=True, manifest=store.manifest("augment", version))
    by_gpu = sorted(versions, key=lambda v: (store.manifest("profile", v).get("gpu", ""), v))  # rows in GPU-type order
    runs = pd.concat([store.get_table("profile", v, "stage_runs") for v in by_gpu], ignore_index=True)
    return save(store, "augment", version, compute_augment(runs, config), {"profiles": versions})


# --- train -----------------------------------------------------------------------------------------

def compute_train(augmented: dict[str, pd.DataFrame], augment_manifest: dict[str, Any], cluster: Cluster,
                  model: ModelArch, space: SearchSpace, *, config: TrainConfig, tracking_uri: str | None) -> StepResult:
    """augmented: the augment step's tables (train, valid, gates)."""
    fp = registry.fingerprint(cluster, model, space.global_batch)
    aug = AugmentResult(stage_runs=augmented["train"], gates=augmented["gates"],
                        rows_before=int(augment_manifest["rows_before"]), rows_after=int(augment_manifest["rows_after"]))
    out = train_on(aug, augmented["valid"], {g.name: g for g in cluster.gpu_types}, fp, config=config,
                   tracking_uri=tracking_uri, data_version=augment_manifest["version"])
    return StepResult(
        tables={"variants": out.variant_errors},
        manifest={"model_version": int(out.version), "run_id": out.run_id, "promoted": out.promoted,
                  "variant": out.predictor.variant, "predictor_version": out.predictor.version,
                  "fingerprint": fp.fingerprint, "held_out": {k: float(v) for k, v in out.errors.items()},
                  "sha256": dict(out.hashes),
                  "tracking_uri": registry.portable_uri(tracking_uri)})


def _registered(manifest: dict[str, Any], tracking_uri: str | None) -> bool:
    """A stored train step is reusable only if this registry holds the very model it registered, that
    model loads (files present, sha256 as recorded), and the fingerprint's champion loads too (else
    training again promotes a usable one)."""
    if registry.predictor_version_of(manifest["model_version"], tracking_uri) != manifest.get("predictor_version"):
        return False
    mv = registry.champion(manifest["fingerprint"])
    return registry.usable(manifest["model_version"]) and (mv is None or registry.usable(mv.version))


def train_augmented(store: ArtifactStore, augment_version: str, cluster: Cluster, model: ModelArch,
                    space: SearchSpace, *, config: TrainConfig, tracking_uri: str | None) -> StepRun:
    """Train on an augment version and register the model (champion only if better, training.train_on);
    reused when the same training is stored and its model is still in this registry."""
    fp = registry.fingerprint(cluster, model, space.global_batch)
    key = train_key(augment_version, fp.fingerprint, seed=config.seed, budget=dataclasses.asdict(config.budget))
    found = newest_with(store, "train", key=key, tracking_uri=registry.portable_uri(tracking_uri))
    if found is not None and _registered(found[1], tracking_uri):
        return StepRun(step="train", version=found[0], reused=True, manifest=found[1])
    augmented = {n: store.get_table("augment", augment_version, n) for n in ("train", "valid", "gates")}
    result = compute_train(augmented, store.manifest("augment", augment_version), cluster, model, space,
                           config=config, tracking_uri=tracking_uri)
    result.manifest["key"] = key
    version = version_train(key, result.manifest["model_version"], result.manifest["tracking_uri"])
    return save(store, "train", version, result, {"augment": augment_version, "fingerprint": fp.fingerprint})


# --- search ----------------------------------------------------------------------------------------

def compute_search(predictor, cluster: Cluster, model: ModelArch, space: SearchSpace, *, weights: str | None,
                   top_k: int, mapper=None, shard_by: str = "layout", predictor_name: str = "learned",
                   on_progress: Progress | None = None, pool=None) -> StepResult:
    """The search step's tables, plan.json and manifest; `on_progress(done, total)`, `mapper` and `pool` (the
    boxes on workers: memx.planner.distributed) as in memx.planner.search.search."""
    result = launcher_search(cluster, model, space, predictor, weights=weights, top_k=top_k, mapper=mapper, shard_by=shard_by,
                    on_progress=on_progress, pool=pool)
    obj = search_result_to_dict(result, predictor_name)
    top = pd.DataFrame([{"rank": i + 1, "plan": json.dumps(plan_to_dict(c.plan)), "phi": c.phi,
                         "iteration_time_ms": c.iteration_time_ms, "max_mem_mib": c.max_mem_mib,
                         "mem_std_gib": c.mem_variance_mib2 ** 0.5 / 1024, "min_margin": c.min_margin}
                        for i, c in enumerate(result.top)])
    return StepResult(
        tables={"top": top},
        files={"plan.json": json.dumps(obj, indent=2).encode()},  # rendered (Markdown, HTML) by report/
        manifest={"search_s": round(result.search_s, 3), "evaluated": result.space.evaluated,
                  "feasible": result.space.feasible, "weights": result.weights.profile,
                  "cache_hit_rate": result.cache_hit_rate,
                  "iteration_time_ms": result.chosen.iteration_time_ms, "min_margin": result.chosen.min_margin})


def search_champion(store: ArtifactStore, cluster: Cluster, model: ModelArch, space: SearchSpace, *,
                    tracking_uri: str | None, weights: str | None, top_k: int, mapper=None,
                    shard_by: str = "layout", inputs: dict[str, Any] | None = None,
                    on_progress: Progress | None = None, pool=None) -> StepRun:
    """The best plans by the registry champion of the fingerprint; reused when the champion, the specs
    and the options are unchanged (then `on_progress` is not called)."""
    fp = registry.fingerprint(cluster, model, space.global_batch)
    ref = champion_ref(fp.fingerprint, tracking_uri)
    if ref is None:
        raise InputError(f"no champion predictor for fingerprint {fp.fingerprint} (GPU types {fp.gpu_types}, "
                         f"global batch {fp.global_batch}) in {registry.public_tracking_uri(tracking_uri)}; run the train step first")
    planner = {k: ref[k] for k in ("model_version", "predictor_version", "tracking_uri", "calibration_sha256") if k in ref}
    version = version_search(planner, cluster, model, space, weights=weights, top_k=top_k)
    stored = store.has_step("search", version)
    if stored and stored_plan_valid(store, version, cluster, model):
        return StepRun(step="search", version=version, reused=True, manifest=store.manifest("search", version))
    predictor, _ = champion_predictor(fp.fingerprint, tracking_uri=tracking_uri)
    result = compute_search(predictor, cluster, model, space, weights=weights, top_k=top_k, mapper=mapper,
                            shard_by=shard_by, predictor_name=f"{ref['variant']} v{ref['model_version']}",
                            on_progress=on_progress, pool=pool)
    result.manifest.update(champion=ref, experiment_id=registry.experiment_of(ref["run_id"]))
    return save(store, "search", version, result, {**(inputs or {}), "cluster": cluster.name, "model": model.name},
                replace=stored)


def stored_plan_valid(store: ArtifactStore, version: str, cluster: Cluster, model: ModelArch) -> bool:
    """Whether a stored search's plan.json holds valid plans for this cluster and model (the pick and
    every top-k entry: memx.domain.plan.plan_from_dict + validate_plan). A hand-edited or otherwise
    invalid plan is not served: a warning names it and the search runs again (issue #11)."""
    try:
        obj = json.loads(store.get_file("search", version, "plan.json"))
        for entry in [obj, *obj["top"]]:  # the pick may be a schema-2 plan (max_replica_groups ≥ 2)
            validate_any_plan(any_plan_from_dict(entry["plan"], source=f"search/{version}/plan.json"), cluster, model,
                              source=f"search/{version}/plan.json")
    except (InputError, ValueError, KeyError, TypeError) as exc:
        log.warning("memx: stored plan search/%s is not served: %s", version, str(exc).splitlines()[0])
        return False
    return True

