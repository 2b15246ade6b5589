"""train flow: XGBoost variants + Optuna, logged to MLflow, registered with fingerprint tags."""

from __future__ import annotations

from prefect import flow, task

from flows.common import load_specs, load_table, newest_with, save_stage, stored_manifest
from memx.pipeline import steps as stages


@task(persist_result=False)
def fit(augmented, augment_manifest, cl, mo, sp, seed, tracking_uri):
    return stages.compute_train(augmented, augment_manifest, cl, mo, sp, seed=seed, tracking_uri=tracking_uri)


def _registered(manifest: dict, tracking_uri: str | None) -> bool:
    """A stored train stage is reusable only if its model version is in this registry."""
    from memx.pipeline import registry

    try:
        registry.setup(tracking_uri)
        registry.load_version(manifest["model_version"])
        return True
    except Exception:  # noqa: BLE001 - any failure to load means: retrain
        return False


@flow(name="memx-train", log_prints=True)
def train_flow(augment_version: str, cluster: str = "three-vendor-20", model: str = "llama2-7b",
               search: str = "default", conf: str | None = None, seed: int = 0, store: str | None = None,
               tracking_uri: str | None = None) -> str:
    from memx.pipeline import registry

    cl, mo, sp = load_specs(cluster, model, search, conf)
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    key = stages.version_train(augment_version, fp.fingerprint, seed=seed, budget={})
    found = newest_with(store, "train", key)
    if found is not None and _registered(found[1], tracking_uri):
        print(f"train: reused {found[0]} (model version {found[1]['model_version']})")
        return found[0]
    # Not trained yet, or trained against a registry that no longer has the model: (re)train. The
    # version also names the model version, so a retrain never collides with a stale manifest.
    augmented = {n: load_table(store, "augment", augment_version, n) for n in ("train", "valid", "gates")}
    result = fit(augmented, stored_manifest(store, "augment", augment_version), cl, mo, sp, seed, tracking_uri)
    version = stages.content_version(key, result.manifest["model_version"], registry.tracking_uri(tracking_uri))
    result.manifest["key"] = key
    save_stage(store, "train", version, result, {"augment": augment_version, "fingerprint": fp.fingerprint})
    print(f"train: model version {result.manifest['model_version']} ({result.manifest['variant']}) → {version}")
    return version
