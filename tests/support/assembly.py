"""A small search scored again through estimate_plans, under one pipeline assembly (tests of the 1F1B assemblies:
tests/unit/test_pipeline_assembly.py, tests/unit/test_drain_assembly.py)."""

from __future__ import annotations

import dataclasses


def searched_and_estimated(assembly: str):
    """(cluster, model, predictor, the search's pick, the pick through estimate_plans, 24 drawn plans): three-vendor-20
    / llama2-7b, the closed form without runtime terms, a small default space (tp 1–2, micro batch 2, pp 2–4)."""
    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.estimate import estimate_plans
    from memx.planner.search import search
    from memx.simulator import draw_plans

    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    space = dataclasses.replace(load_search("default"), tp_options=(1, 2), micro_batch_options=(2,), max_pp=4,
                                min_pp=2, pipeline_assembly=assembly)
    chosen = search(cluster, model, space, pred).chosen
    (again,) = estimate_plans([chosen.plan], cluster, model, pred, pipeline_assembly=assembly)
    return cluster, model, pred, chosen, again, draw_plans(cluster, model, load_search("default"), n=24, seed=7)
