"""search flow: the sharded search on Prefect's task runner (threads, or Dask with `dask`), plus
Prefect artifacts for people: the plan (Markdown), the top-k (table), a link to the MLflow run."""

from __future__ import annotations

import json

from prefect import flow, task, unmapped

from flows.common import load_file, load_specs, save_stage, stored_manifest
from memx.pipeline import steps as stages


@task(persist_result=False)
def search_shard(fn, shard):
    return fn(shard)


def task_mapper(fn, shards):
    """memx.planner.search mapper: one Prefect task per shard, results in shard order."""
    return [f.result() for f in search_shard.map(unmapped(fn), shards)]


@task(persist_result=False)
def run_search(train_manifest, cl, mo, sp, weights, top_k, tracking_uri, sharded: bool):
    predictor = stages.load_trained(train_manifest, tracking_uri)
    name = f"{train_manifest['variant']} v{train_manifest['model_version']}"
    return stages.compute_search(predictor, cl, mo, sp, weights=weights, top_k=top_k,
                                 mapper=task_mapper if sharded else None, shard_by="pp-order" if sharded else "layout",
                                 predictor_name=name)


def publish(plan_obj: dict, markdown: str, train_manifest: dict) -> None:
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    create_markdown_artifact(key="memx-plan", markdown=markdown, description="MemX recommended plan")
    rows = [{"rank": i + 1, "phi": round(e["predicted"]["phi"], 4), "time_ms": round(e["predicted"]["iteration_time_ms"]),
             "max_mem_gib": round(e["predicted"]["max_mem_mib"] / 1024, 2), "min_margin": e["predicted"]["min_margin"],
             "plan": json.dumps(e["plan"]["stages"])} for i, e in enumerate(plan_obj["top"])]
    create_table_artifact(key="memx-top-plans", table=rows, description="Top plans by Φ")
    uri = train_manifest.get("tracking_uri", "")
    if uri.startswith("http"):
        run = f"{uri}/#/experiments/{train_manifest['experiment_id']}/runs/{train_manifest['run_id']}"
        create_link_artifact(key="memx-mlflow-run", link=run,
                             description="MLflow run of the stage predictor")


@flow(name="memx-search", log_prints=True)
def search_flow(train_version: str, cluster: str = "three-vendor-20", model: str = "llama2-7b", search: str = "default",
                conf: str | None = None, weights: str | None = None, top_k: int = 10, store: str | None = None,
                tracking_uri: str | None = None, sharded: bool = False) -> dict:
    cl, mo, sp = load_specs(cluster, model, search, conf)
    train_manifest = stored_manifest(store, "train", train_version)
    version = stages.version_search(train_version, cl, mo, sp, weights=weights, top_k=top_k)
    if stored_manifest(store, "search", version) is None:
        result = run_search(train_manifest, cl, mo, sp, weights, top_k, tracking_uri, sharded)
        save_stage(store, "search", version, result, {"train": train_version, "cluster": cluster, "model": model})
        print(f"search: {result.manifest['evaluated']:,} plans in {result.manifest['search_s']} s → {version}")
    else:
        print(f"search: reused {version}")
    plan_obj = json.loads(load_file(store, "search", version, "plan.json"))
    publish(plan_obj, load_file(store, "search", version, "plan.md").decode(), train_manifest)
    return {"version": version, **plan_obj}
