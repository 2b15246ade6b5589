"""Sampling plans from the plan space and measuring them to config_runs records."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.plan import plan_from_json, validate_plan
from memx.simulator import CONFIG_RUN_COLUMNS, draw_plans, sample_plans


@pytest.fixture(scope="module")
def space():
    return load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")


def test_drawn_plans_are_valid_and_use_all_gpus(space):
    cluster, model, search = space
    plans = draw_plans(cluster, model, search, n=80, seed=5)
    assert len(plans) == 80 and len({json.dumps(p.__repr__()) for p in plans}) == 80
    for p in plans:
        validate_plan(p, cluster, model)
        assert p.gpus_per_type() == {g.name: cluster.gpu_count(g.name) for g in cluster.gpu_types}
        gpus = [s.gpu for s in p.stages]
        assert len(set(gpus)) == sum(1 for i, g in enumerate(gpus) if i == 0 or gpus[i - 1] != g)  # contiguous
        assert search.min_pp <= p.pp <= search.max_pp and all(s.layers >= 1 for s in p.stages)
    assert {s.recompute for p in plans for s in p.stages} == {"none", "selective", "full"}
    assert any(s.recompute_layers is not None for p in plans for s in p.stages)
    assert len({tuple(s.gpu for s in p.stages) for p in plans}) > 1  # type order varies


def test_without_use_all_gpus_plans_may_use_fewer(space):
    cluster, model, search = space
    plans = draw_plans(cluster, model, dataclasses.replace(search, use_all_gpus=False), n=40, seed=1)
    assert any(p.gpus_used < cluster.total_gpus for p in plans)


def test_sample_plans_records(space):
    df = sample_plans(*space, n=40, seed=11)
    assert list(df.columns) == list(CONFIG_RUN_COLUMNS) and len(df) == 40
    assert df.oom.any() and (~df.oom).any()
    assert df.loc[df.oom, "iteration_time_ms"].isna().all()
    assert df.loc[df.oom, "peak_mem_mib"].isna().all()
    ok = df[~df.oom].iloc[0]
    assert len(ok.peak_mem_mib) == plan_from_json(ok.plan).gpus_used
    again = sample_plans(*space, n=40, seed=11)
    assert df.drop(columns="measured_at").equals(again.drop(columns="measured_at"))
