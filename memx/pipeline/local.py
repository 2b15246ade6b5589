"""The in-process runner (no Prefect): the pipeline's steps (memx.pipeline.steps) with the same
versions and reuse as flows/pipeline.py. Benchmarks, experiments and the CLI call these entry points.

- `profile_step`: one stored profile per GPU type (reused when its key is stored);
- `train_step`: augment + train from the profiles the store holds for this cluster, model and space;
- `calibrate_registered`: a plan calibration fitted on measured plans, attached to a registered version;
- `registered_predictor`: the registry champion of the fingerprint (calibrated), behind its prediction cache;
- `search_step`: the best plans by that champion;
- `run_local`: the whole path.
Artifacts go to the store (default ``$MEMX_HOME/artifacts``), models to the MLflow registry (default
``sqlite:///$MEMX_HOME/mlflow.db``), prediction caches to ``$MEMX_HOME/models`` (docs/architecture.md
§Local state).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from memx.domain.errors import InputError
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.learn.cache import CachedPredictor
from memx.learn.calibration import PlanCalibration, fit_from_config_runs
from memx.learn.tuning import TuneBudget
from memx.pipeline import lifeline, registry, steps
from memx.pipeline.steps import StepRun
from memx.pipeline.store import ArtifactStore, store_from_uri
from memx.pipeline.training import TrainConfig, cached, champion_ref, train_and_register
from memx.planner.search import Progress

__all__ = ["LocalRun", "TrainConfig", "TrainStepOutcome", "cached", "calibrate_registered", "profile_step", "registered_predictor", "run_local",
           "search_step", "train_and_register", "train_step"]

StoreArg = ArtifactStore | str | None  # a store, a store URI, or None for the default store


@dataclass(frozen=True, kw_only=True)
class TrainStepOutcome:
    """The steps `train_step` ran or reused, and the champion that plans afterwards."""

    fingerprint: str
    profiles: dict[str, str]  # GPU type → profile version
    augment: StepRun
    train: StepRun
    champion: dict[str, Any]  # training.champion_ref: model_version, predictor_version, variant, run_id, …

    @property
    def model_version(self) -> int:
        """The version this training registered (champion only if `promoted`)."""
        return int(self.train.manifest["model_version"])

    @property
    def promoted(self) -> bool:
        return bool(self.train.manifest["promoted"])


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    """Every step of one run, and the plan (memx.report.table JSON) the search stored."""

    profiles: dict[str, str]
    trained: TrainStepOutcome
    search: StepRun
    plan: dict[str, Any]

    def artifacts(self) -> dict[str, Any]:
        return {"profiles": self.profiles, "augment": self.trained.augment.version, "train": self.trained.train.version,
                "search": self.search.version}


def _store(store: StoreArg) -> ArtifactStore:
    return store if isinstance(store, ArtifactStore) else store_from_uri(store)


def profile_step(cluster: Cluster, model: ModelArch, space: SearchSpace, *, backend: str = "simulated",
                 store: StoreArg = None, seed: int = 0, conf_root: Path | None = None,
                 options: dict[str, Any] | None = None, refresh: Collection[str] = (), refresh_token: str = "",
                 log: Callable[[str], None] = lambda _: None) -> dict[str, str]:
    """{GPU type: profile version}: each GPU type's stage_runs stored as a profile version (reused
    when the same key is stored; types in `refresh` are measured again under `refresh_token`)."""
    with lifeline.home_lock():
        return steps.profile_all(_store(store), cluster, model, space, backend=backend, seed=seed, conf_root=conf_root,
                                 options=dict(options or {}), refresh=refresh, refresh_token=refresh_token, log=log)


def train_config(seed: int = 0, trials: int | None = None, seconds: float | None = None) -> TrainConfig:
    """The training configuration of the runner and the flows (TuneBudget defaults unless given)."""
    default = TuneBudget()
    budget = TuneBudget(trials=default.trials if trials is None else trials,
                        seconds=default.seconds if seconds is None else seconds)
    return TrainConfig(seed=seed, budget=budget)


def train_step(cluster: Cluster, model: ModelArch, space: SearchSpace, *, store: StoreArg = None, seed: int = 0,
               tracking_uri: str | None = None, trials: int | None = None, seconds: float | None = None,
               config: TrainConfig | None = None, profiles: dict[str, str] | None = None,
               log: Callable[[str], None] = lambda _: None) -> TrainStepOutcome:
    """Augment + train from the profiles stored for this cluster, model and space (`profiles`: these
    versions instead); InputError naming the fingerprint when none are stored ("run `memx profile` first")."""
    st = _store(store)
    config = config or train_config(seed, trials, seconds)
    with lifeline.home_lock():
        found = profiles if profiles is not None else steps.stored_profiles(st, cluster, model, space)
        aug = steps.augment_profiles(st, found.values(), config)
        log(aug.line())
        trained = steps.train_augmented(st, aug.version, cluster, model, space, config=config, tracking_uri=tracking_uri)
        log(trained.line())
    fp = trained.manifest["fingerprint"]
    return TrainStepOutcome(fingerprint=fp, profiles=dict(found), augment=aug, train=trained,
                            champion=champion_ref(fp, tracking_uri) or {})


def registered_predictor(cluster: Cluster, model: ModelArch, space: SearchSpace, *,
                         tracking_uri: str | None = None) -> CachedPredictor:
    """The registry champion of the fingerprint (GPU types, model structure, global batch), with the plan
    calibration `memx train --measured` attached to it (registry.load_calibrated), behind its prediction
    cache; InputError naming the fingerprint and the commands that create it."""
    fp = registry.fingerprint(cluster, model, space.global_batch)
    ref = champion_ref(fp.fingerprint, tracking_uri)
    if ref is None:
        raise InputError(
            f"no registered predictor for cluster {cluster.name} (GPU types {fp.gpu_types}), model {model.name}, global "
            f"batch {space.global_batch} (fingerprint {fp.fingerprint}) in {registry.public_tracking_uri(tracking_uri)}; "
            f"run `memx profile` then `memx train` with --cluster {cluster.name} --model {model.name} first")
    return cached(registry.load_calibrated(ref["model_version"])[0], fp.fingerprint, ref["model_version"])


def calibrate_registered(version: int, cluster: Cluster, model: ModelArch, runs: pd.DataFrame, *,
                         tracking_uri: str | None = None, residual: bool = True) -> PlanCalibration:
    """Fit a plan calibration (memx.learn.calibration, guarded) of registered `version` on measured plans
    (config_runs) and attach it to the version (registry.store_calibration): from then on
    `registered_predictor` and the pipeline's search apply it. A guard that keeps everything at the
    identity is stored too, so the plan output can say so. `residual`: also the plan residual
    (memx.learn.residual; from MIN_RESIDUAL_PLANS timed plans on, guarded)."""
    registry.setup(tracking_uri)
    cal = fit_from_config_runs(runs, cluster, model, registry.load_version(version), residual=residual)
    registry.store_calibration(version, cal)
    return cal


def promote_if_calibrated_better(version: int, cal: PlanCalibration, fp: str, cluster: Cluster, model: ModelArch,
                                 runs: pd.DataFrame, *, tracking_uri: str | None = None,
                                 residual: bool = True) -> str | None:
    """After `memx train --measured`: when `version` is not the champion of `fp`, the champion is calibrated
    on the same measured plans (not stored) and `version` is promoted if its calibrated held-out plan time
    error (PlanCalibration.time_error) is lower. The sentence saying what was decided; None when there is
    nothing to compare (no champion, already champion, no timed plans)."""
    ref = champion_ref(fp, tracking_uri)
    mine = cal.time_error()
    if ref is None or int(ref["model_version"]) == int(version) or mine is None:
        return None
    theirs = fit_from_config_runs(runs, cluster, model, registry.load_version(ref["model_version"]),
                                  residual=residual).time_error()
    if theirs is not None and mine >= theirs:
        return (f"champion stays version {ref['model_version']}: calibrated plan time error {theirs:.1%} ≤ "
                f"version {version}'s {mine:.1%}")
    registry.promote(version, fp)
    return (f"promoted version {version} to champion: calibrated plan time error {mine:.1%} < version "
            f"{ref['model_version']}'s {'n/a' if theirs is None else f'{theirs:.1%}'} on the same measured plans")


def search_step(cluster: Cluster, model: ModelArch, space: SearchSpace, *, store: StoreArg = None,
                tracking_uri: str | None = None, weights: str | None = None, top_k: int = 10, mapper=None,
                shard_by: str = "layout", on_progress: Progress | None = None) -> tuple[StepRun, dict[str, Any]]:
    """(the search step, its plan JSON): the best plans by the champion (reused when stored);
    `on_progress(done, total)` as in memx.planner.search.search, while a search runs."""
    st = _store(store)
    with lifeline.home_lock():
        run = steps.search_champion(st, cluster, model, space, tracking_uri=tracking_uri, weights=weights, top_k=top_k,
                                    mapper=mapper, shard_by=shard_by, on_progress=on_progress)
        return run, json.loads(st.get_file("search", run.version, "plan.json"))


def run_local(cluster: Cluster, model: ModelArch, space: SearchSpace, *, backend: str = "simulated",
              store: StoreArg = None, seed: int = 0, conf_root: Path | None = None,
              options: dict[str, Any] | None = None, tracking_uri: str | None = None, weights: str | None = None,
              top_k: int = 10, config: TrainConfig | None = None,
              log: Callable[[str], None] = lambda _: None) -> LocalRun:
    """profile → augment → train → search in-process, each step reused when its inputs are unchanged."""
    st = _store(store)
    with lifeline.home_lock():  # one run per $MEMX_HOME: a second waits, then reuses this one's artifacts
        profiles = profile_step(cluster, model, space, backend=backend, store=st, seed=seed, conf_root=conf_root,
                                options=options, log=log)
        trained = train_step(cluster, model, space, store=st, seed=seed, tracking_uri=tracking_uri,
                             config=config or train_config(seed), profiles=profiles, log=log)
        run, plan = search_step(cluster, model, space, store=st, tracking_uri=tracking_uri, weights=weights, top_k=top_k)
    log(run.line())
    return LocalRun(profiles=profiles, trained=trained, search=run, plan=plan)
