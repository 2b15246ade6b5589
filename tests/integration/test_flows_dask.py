"""The sharded search on Prefect's Dask task runner (a LocalCluster of 2 processes on 127.0.0.1)
returns exactly what the single-process search returns."""

from __future__ import annotations

import pytest

import dataclasses

from memx.planner.cost import AnalyticStageModel
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.search import search


@pytest.mark.slow  # ~18 s: a Dask LocalCluster start (issue #17: `make test` under 3 min)
def test_dask_sharded_search_equals_single_process(prefect_api, conf_root):
    from prefect import flow

    from flows.pipeline import dask_runner
    from flows.search import task_mapper
    from memx.pipeline.steps import compute_search

    cl, mo = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    sp = dataclasses.replace(load_search("small", conf_root), weights="default")
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})

    @flow(task_runner=dask_runner("local", workers=2))
    def sharded():
        return compute_search(pred, cl, mo, sp, weights=None, top_k=5, mapper=task_mapper, shard_by="pp-order",
                              predictor_name="analytic")

    out = sharded()
    ref = search(cl, mo, sp, pred, top_k=5)
    import json

    plan = json.loads(out.files["plan.json"])
    from memx.domain.plan import plan_to_dict

    assert plan["plan"] == plan_to_dict(ref.chosen.plan)  # the pick rule's plan (memx.planner.pick)
    assert [e["plan"] for e in plan["pareto"]] == [plan_to_dict(c.plan) for c in ref.pareto]
    assert [e["plan"] for e in plan["top"]] == [plan_to_dict(c.plan) for c in ref.top]
    assert plan["fastest"]["plan"] == plan_to_dict(ref.fastest.plan)
    assert out.manifest["evaluated"] == ref.space.evaluated and out.manifest["feasible"] == ref.space.feasible


@pytest.mark.slow  # a Dask LocalCluster of 2 processes under Prefect's DaskTaskRunner (issue #26)
def test_a_search_task_on_the_dask_task_runner_explores_its_boxes_there(prefect_api, conf_root):
    from prefect import flow, task

    from flows.pipeline import dask_runner
    from flows.search import worker_pool

    cl, mo = load_cluster("three-vendor-20", conf_root), dataclasses.replace(load_model("llama-6l", conf_root), layers=24)
    sp = dataclasses.replace(load_search("small", conf_root), max_pp=4)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})

    @task
    def boxes():
        with worker_pool() as pool:
            assert pool is not None and pool.threads == 2
            r = search(cl, mo, sp, pred, top_k=5, pool=pool)
        return r.chosen.plan, [c.plan for c in r.top], [c.plan for c in r.pareto], r.refs

    @flow(task_runner=dask_runner("local:2"))
    def distributed():
        return boxes.submit().result()

    ref = search(cl, mo, sp, pred, top_k=5)
    assert distributed() == (ref.chosen.plan, [c.plan for c in ref.top], [c.plan for c in ref.pareto], ref.refs)
