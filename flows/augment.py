"""augment flow: hold out measured rows, R²-gated interpolation of the rest (memx.learn.augment)."""

from __future__ import annotations

import pandas as pd
from prefect import flow, task

from flows.common import load_table, save_stage, stored_manifest
from memx.pipeline import steps as stages


@task(persist_result=False)
def interpolate(stage_runs: pd.DataFrame, seed: int, r2_threshold: float, valid_fraction: float):
    return stages.compute_augment(stage_runs, seed=seed, r2_threshold=r2_threshold, valid_fraction=valid_fraction)


@flow(name="memx-augment", log_prints=True)
def augment_flow(profile_versions: list[str], seed: int = 0, r2_threshold: float = 0.95, valid_fraction: float = 0.2,
                 store: str | None = None) -> str:
    version = stages.version_augment(profile_versions, seed=seed, r2_threshold=r2_threshold, valid_fraction=valid_fraction)
    if stored_manifest(store, "augment", version) is not None:
        print(f"augment: reused {version}")
        return version
    runs = pd.concat([load_table(store, "profile", v, "stage_runs") for v in sorted(profile_versions)], ignore_index=True)
    result = interpolate(runs, seed, r2_threshold, valid_fraction)
    save_stage(store, "augment", version, result, {"profiles": sorted(profile_versions)})
    print(f"augment: {result.manifest['rows_before']} → {result.manifest['rows_after']} rows → {version}")
    return version
