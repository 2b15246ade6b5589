"""The whole pipeline: profile → augment → train → search (memx.pipeline.steps, as
memx.pipeline.local.run_local runs them in-process), each step reused when its inputs are unchanged;
a crash leaves no partial artifact and a re-run resumes after the last complete step. The search plans
with the registry champion of the fingerprint."""

from __future__ import annotations

from prefect import flow

from flows.augment import augment_flow
from flows.profile import profile_flow
from flows.search import search_flow
from flows.train import train_flow
from memx.pipeline import lifeline


def dask_runner(spec: str, workers: int | None = None):
    """DaskTaskRunner on a local cluster of single-threaded processes (`--dask local[:N]`; `workers` overrides
    N), or an existing scheduler (`tcp://127.0.0.1:8786`): memx.planner.distributed.parse_dask."""
    from prefect_dask import DaskTaskRunner

    from memx.planner.distributed import parse_dask

    local, address = parse_dask(spec)
    if local:
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers or local, "threads_per_worker": 1, "processes": True,
                                              "host": "127.0.0.1", "dashboard_address": None})
    return DaskTaskRunner(address=address)


@flow(name="memx-pipeline", log_prints=True)
def pipeline_flow(cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                  conf: str | None = None, backend: str = "simulated", seed: int = 0, store: str | None = None,
                  tracking_uri: str | None = None, weights: str | None = None, top_k: int = 10,
                  sharded: bool = False, dask: str | None = None, refresh: list[str] | None = None,
                  refresh_token: str = "", profile_options: dict | None = None) -> dict:
    """`dask`: "local" (a 2-worker LocalCluster), "local:N" or a scheduler address: the search's boxes on it.
    One run per $MEMX_HOME at a time (lifeline.home_lock); the helper servers started so far (Prefect's
    temporary API server) end with this process, kill -9 included (lifeline.adopt_children)."""
    lifeline.adopt_children()
    with lifeline.home_lock():
        return _pipeline(cluster, model, search, conf, backend, seed, store, tracking_uri, weights, top_k, sharded, dask,
                         refresh, refresh_token, profile_options)


def _pipeline(cluster, model, search, conf, backend, seed, store, tracking_uri, weights, top_k, sharded, dask, refresh,
              refresh_token, profile_options) -> dict:
    profiles = profile_flow(cluster, model, search, conf, backend, seed, store, refresh, refresh_token, profile_options)
    augmented = augment_flow(sorted(profiles.values()), seed=seed, store=store)
    trained = train_flow(augmented, cluster, model, search, conf, seed, store, tracking_uri)
    runner = search_flow if dask is None else search_flow.with_options(task_runner=dask_runner(dask))
    result = runner(trained, cluster, model, search, conf, weights, top_k, store, tracking_uri, sharded or dask is not None)
    return {"profiles": profiles, "augment": augmented, "train": trained, **result}
