"""Re-profiling flows behind the deployments in prefect.yaml.

* reprofile_stale_flow (cron, `reprofile-nightly`): re-profile GPU types whose newest profile is
  older than `max_age_days`, then retrain and re-plan.
* reprofile_on_hardware_flow (event `memx.cluster.changed`, `reprofile-on-hardware`): profile only
  GPU types not yet profiled (the profile flow reuses the others), then retrain and re-plan; a node
  of a known type re-plans only.
"""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow, task

from flows.common import load_specs, store as open_store
from flows.pipeline import pipeline_flow
from memx.pipeline import steps
from memx.pipeline.versioning import profile_key


@task(persist_result=False)
def stale_types(cluster: str, model: str, search: str, conf: str | None, backend: str, seed: int, store: str | None,
                max_age_days: float, options: dict | None = None) -> list[str]:
    cl, mo, sp = load_specs(cluster, model, search, conf)
    st = open_store(store)
    now = datetime.now(timezone.utc)
    out = []
    for g in cl.gpu_types:
        key = profile_key(cl, g.name, mo, sp, backend=backend, seed=seed, options=dict(options or {}))
        found = steps.newest_with(st, "profile", key=key)
        if found is None:
            continue  # never profiled: the pipeline profiles it anyway
        created = datetime.fromisoformat(found[1]["created_at"])
        if (now - created).total_seconds() > max_age_days * 86400:
            out.append(g.name)
    return out


@flow(name="memx-reprofile-stale", log_prints=True)
def reprofile_stale_flow(cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                         conf: str | None = None, backend: str = "simulated", seed: int = 0, store: str | None = None,
                         max_age_days: float = 7.0, profile_options: dict | None = None) -> dict:
    stale = stale_types(cluster, model, search, conf, backend, seed, store, max_age_days, profile_options)
    token = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%S")
    print(f"stale GPU types: {stale or 'none'}")
    return pipeline_flow(cluster, model, search, conf, backend, seed, store, refresh=stale, refresh_token=token,
                         profile_options=profile_options)


@flow(name="memx-reprofile-on-hardware", log_prints=True)
def reprofile_on_hardware_flow(cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                               conf: str | None = None, backend: str = "simulated", seed: int = 0,
                               store: str | None = None, gpu: str | None = None,
                               profile_options: dict | None = None) -> dict:
    print(f"cluster {cluster} changed (gpu {gpu}): profiling new GPU types, then retrain and re-plan")
    return pipeline_flow(cluster, model, search, conf, backend, seed, store, profile_options=profile_options)
