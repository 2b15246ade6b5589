"""train flow: XGBoost variants + Optuna, logged to MLflow, registered with fingerprint tags; the
champion moves only when the new version is better on the held-out rows (memx.pipeline.training)."""

from __future__ import annotations

from prefect import flow, task

from flows.common import NO_RETRY, config, load_specs, store
from memx.pipeline import steps


@task(**NO_RETRY)
def train(store_uri, augment_version, cl, mo, sp, cfg, tracking_uri):
    return steps.train_augmented(store(store_uri), augment_version, cl, mo, sp, config=cfg, tracking_uri=tracking_uri)


@flow(name="memx-train", log_prints=True)
def train_flow(augment_version: str, cluster: str = "three-vendor-20", model: str = "llama2-7b",
               search: str = "default", conf: str | None = None, seed: int = 0, store: str | None = None,
               tracking_uri: str | None = None) -> str:
    cl, mo, sp = load_specs(cluster, model, search, conf)
    run = train(store, augment_version, cl, mo, sp, config(seed), tracking_uri)
    m = run.manifest
    print(f"{run.line()} (model version {m['model_version']}, {m['variant']}, "
          f"champion {'moved' if m['promoted'] else 'kept'})")
    return run.version
