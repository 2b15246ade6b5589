"""augment flow: hold out measured rows, R²-gated interpolation of the rest (memx.pipeline.steps)."""

from __future__ import annotations

from prefect import flow, task

from flows.common import STEP_RETRIES, config, store
from memx.pipeline import steps


@task(**STEP_RETRIES)
def augment(store_uri, profile_versions, cfg):
    return steps.augment_profiles(store(store_uri), profile_versions, cfg)


@flow(name="memx-augment", log_prints=True)
def augment_flow(profile_versions: list[str], seed: int = 0, r2_threshold: float = 0.95, valid_fraction: float = 0.2,
                 store: str | None = None) -> str:
    run = augment(store, sorted(profile_versions), config(seed, r2_threshold=r2_threshold, valid_fraction=valid_fraction))
    print(f"{run.line()} ({run.manifest['rows_before']} → {run.manifest['rows_after']} rows)")
    return run.version
