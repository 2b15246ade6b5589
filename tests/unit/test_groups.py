"""Plan schema 2 (memx.domain.groups): replica groups, JSON round trip, validation, joint placement."""

from __future__ import annotations

import json

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError
from memx.domain.groups import (
    GroupedPlan, ReplicaGroup, any_plan_from_dict, any_plan_from_json, any_plan_to_dict, any_plan_to_json,
    as_grouped, group_plans, place_groups, simplest, validate_any_plan,
)
from memx.domain.plan import Plan, Stage, idle_gpus, plan_from_dict, plan_to_dict

CLUSTER = "three-vendor-20"


def _two_groups(**kw) -> GroupedPlan:
    fast = ReplicaGroup(dp=1, micro_batch=2, micro_batches=24,
                        stages=(Stage(gpu="a100-80g", tp=4, layers=32),))
    slow = ReplicaGroup(dp=2, micro_batch=1, micro_batches=40,
                        stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16, recompute="selective"),
                                Stage(gpu="vendor-c-32g", tp=4, layers=16, recompute="full", recompute_layers=8)))
    base = dict(model="llama2-7b", cluster=CLUSTER, global_batch=128, seq_len=4096, groups=(fast, slow))
    return GroupedPlan(**{**base, **kw})


def test_shares_and_gpus():
    p = _two_groups()
    assert [g.samples for g in p.groups] == [48, 80]
    assert p.gpus_per_type() == {"a100-80g": 4, "vendor-b-32g": 8, "vendor-c-32g": 8}
    assert p.gpus_used == 20
    a, b = group_plans(p)
    assert (a.global_batch, a.micro_batches, a.dp) == (48, 24, 1)
    assert (b.global_batch, b.micro_batches, b.pp) == (80, 40, 2)


def test_json_round_trip_exact():
    p = _two_groups(distributed_optimizer=True, sequence_parallel=True)
    d = any_plan_to_dict(p)
    assert d["schema"] == 2 and len(d["groups"]) == 2
    assert any_plan_from_dict(json.loads(json.dumps(d))) == p
    assert any_plan_from_json(any_plan_to_json(p)) == p


def test_schema_one_is_one_group():
    cluster, model = load_cluster(CLUSTER), load_model("llama2-7b")
    v1 = Plan(model="llama2-7b", cluster=CLUSTER, global_batch=128, micro_batch=2, seq_len=4096, dp=1,
              stages=(Stage(gpu="a100-80g", tp=4, layers=10), Stage(gpu="vendor-b-32g", tp=8, layers=11),
                      Stage(gpu="vendor-c-32g", tp=8, layers=11)))
    g = as_grouped(v1)
    assert len(g.groups) == 1 and g.groups[0].samples == 128
    assert simplest(g) == v1
    assert any_plan_from_dict(plan_to_dict(v1)) == v1  # schema-1 JSON still reads as schema 1
    validate_any_plan(v1, cluster, model)
    validate_any_plan(g, cluster, model)


def test_validate_names_every_problem():
    cluster, model = load_cluster(CLUSTER), load_model("llama2-7b")
    validate_any_plan(_two_groups(), cluster, model)
    bad = _two_groups(global_batch=100)
    with pytest.raises(InputError, match="sum to 128, field 'global_batch' is 100"):
        validate_any_plan(bad, cluster, model)
    fast, slow = _two_groups().groups
    too_many = _two_groups(groups=(fast, ReplicaGroup(dp=3, micro_batch=1, micro_batches=40, stages=slow.stages)),
                           global_batch=168)
    with pytest.raises(InputError, match=r"use 12 × vendor-b-32g together, cluster three-vendor-20 has 8"):
        validate_any_plan(too_many, cluster, model)
    short = ReplicaGroup(dp=1, micro_batch=2, micro_batches=24, stages=(Stage(gpu="a100-80g", tp=4, layers=30),))
    with pytest.raises(InputError, match=r"groups\[0\].*sum to 30"):
        validate_any_plan(_two_groups(groups=(short, slow)), cluster, model)


def test_joint_placement_and_idle():
    cluster = load_cluster(CLUSTER)
    p = _two_groups()
    where = place_groups(p, cluster)
    assert where is not None and len(where) == 2
    assert idle_gpus(p, cluster) == {g.name: 0 for g in cluster.gpu_types}
    fast, slow = p.groups
    half = _two_groups(groups=(fast, ReplicaGroup(dp=1, micro_batch=1, micro_batches=80, stages=slow.stages)))
    assert idle_gpus(half, cluster)["vendor-b-32g"] == 4


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema=3), "field 'schema' is 3; allowed: 2"),
    (lambda d: d.pop("groups"), "missing field"),
    (lambda d: d.update(groups=[]), "field 'groups' must be a non-empty list"),
    (lambda d: d["groups"][1].pop("micro_batches"), r"groups\[1\]: missing field\(s\) micro_batches"),
    (lambda d: d["groups"][0].update(dp=0), r"groups\[0\]: field 'dp' must be an integer ≥ 1"),
    (lambda d: d["groups"][0].update(colour="red"), r"groups\[0\]: unknown field\(s\) colour"),
    (lambda d: d.update(micro_batch=2), r"unknown field\(s\) micro_batch in a schema-2 plan"),
    (lambda d: d["groups"][1]["stages"][0].update(recompute="most"), r"groups\[1\]: stages\[0\]: field 'recompute'"),
])
def test_bad_schema_two_json(edit, message):
    d = any_plan_to_dict(_two_groups())
    edit(d)
    with pytest.raises(InputError, match=message):
        any_plan_from_dict(d, source="p.json")


def test_schema_one_reader_refuses_schema_two_clearly():
    with pytest.raises(InputError, match="schema-2 plan"):
        plan_from_dict(any_plan_to_dict(_two_groups()))
