"""search flow: the search by the registry champion, plus Prefect artifacts for people: the plan (Markdown),
the top-k (table), a link to the champion's MLflow run. On Prefect's DaskTaskRunner the search task explores
the branch-and-bound's boxes on that Dask cluster (memx.planner.distributed, issue #26); elsewhere `sharded`
runs its layout shards as Prefect tasks (threads)."""

from __future__ import annotations

import json
from contextlib import contextmanager

from prefect import flow, task, unmapped

from flows.common import STEP_RETRIES, load_specs, store
from memx.pipeline import steps
from memx.report.table import to_markdown


@task(persist_result=False)
def search_shard(fn, shard):
    return fn(shard)


def task_mapper(fn, shards):
    """memx.planner.search mapper: one Prefect task per shard, results in shard order."""
    return [f.result() for f in search_shard.map(unmapped(fn), shards)]


@contextmanager
def worker_pool():
    """On a Dask worker (the DaskTaskRunner runs this task there): a pool over its cluster, through the worker's
    client (`distributed.worker_client`: the task's thread leaves the worker's count while it waits); else None."""
    try:
        from distributed import get_worker, worker_client

        get_worker()
    except (ImportError, ValueError):
        yield None
        return
    from memx.planner.distributed import DaskPool

    with worker_client() as client:
        yield DaskPool(client)


@task(**STEP_RETRIES)
def search_champion(store_uri, cl, mo, sp, weights, top_k, tracking_uri, sharded: bool, inputs: dict):
    with worker_pool() as pool:
        shards = sharded and pool is None
        return steps.search_champion(store(store_uri), cl, mo, sp, tracking_uri=tracking_uri, weights=weights,
                                     top_k=top_k, mapper=task_mapper if shards else None,
                                     shard_by="pp-order" if shards else "layout", inputs=inputs, pool=pool)


@task(**STEP_RETRIES)
def load_file(store_uri, version: str, name: str) -> bytes:
    return store(store_uri).get_file("search", version, name)


def publish(plan_obj: dict, markdown: str, manifest: dict) -> None:
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    create_markdown_artifact(key="memx-plan", markdown=markdown, description="MemX recommended plan")
    rows = [{"rank": i + 1, "phi": round(e["predicted"]["phi"], 4), "time_ms": round(e["predicted"]["iteration_time_ms"]),
             "max_mem_gib": round(e["predicted"]["max_mem_mib"] / 1024, 2), "min_margin": e["predicted"]["min_margin"],
             "plan": json.dumps(e["plan"]["stages"])} for i, e in enumerate(plan_obj["top"])]
    create_table_artifact(key="memx-top-plans", table=rows, description="Top plans by Φ")
    champion = manifest.get("champion", {})
    uri = champion.get("tracking_uri", "").replace("://***@", "://", 1)  # redacted: a link without the user info
    if uri.startswith("http"):
        run = f"{uri}/#/experiments/{manifest['experiment_id']}/runs/{champion['run_id']}"
        create_link_artifact(key="memx-mlflow-run", link=run, description="MLflow run of the champion stage predictor")


@flow(name="memx-search", log_prints=True)
def search_flow(train_version: str | None = None, cluster: str = "three-vendor-20", model: str = "llama2-7b",
                search: str = "default", conf: str | None = None, weights: str | None = None, top_k: int = 10,
                store: str | None = None, tracking_uri: str | None = None, sharded: bool = False) -> dict:
    """`train_version`: the train step this search follows (recorded; the champion plans)."""
    cl, mo, sp = load_specs(cluster, model, search, conf)
    run = search_champion(store, cl, mo, sp, weights, top_k, tracking_uri, sharded,
                          {"train": train_version, "cluster": cluster, "model": model})
    m = run.manifest
    print(f"{run.line()}: {m['evaluated']:,} plans in {m['search_s']} s by champion v{m['champion']['model_version']}")
    plan_obj = json.loads(load_file(store, run.version, "plan.json"))
    publish(plan_obj, to_markdown(plan_obj), m)
    return {"version": run.version, **plan_obj}
