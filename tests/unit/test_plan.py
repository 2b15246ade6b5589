"""Plan JSON round-trips exactly (docs/architecture.md §Plan JSON) and invalid plans name every offending field."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError
from memx.domain.plan import (
    SEARCH_BLOCK, Plan, Recompute, Stage, place_plan, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json,
    stage_to_dict, validate_plan,
)

DOC_EXAMPLE = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 128, "micro_batch": 2,
                  "seq_len": 4096, "dp": 2,
                  "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none"},
                             {"gpu": "vendor-b-32g", "tp": 4, "layers": 10, "recompute": "full"},
                             {"gpu": "vendor-c-32g", "tp": 4, "layers": 10, "recompute": "full", "recompute_layers": 6}]}


def test_design_example_round_trips_and_validates(conf_root):
    plan = plan_from_dict(DOC_EXAMPLE)
    assert plan_to_dict(plan) == DOC_EXAMPLE
    assert plan.pp == 3 and plan.micro_batches == 32 and plan.gpus_used == 20
    validate_plan(plan, load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root))


def test_stage_recompute_is_the_enum_and_json_keeps_plain_strings():
    st_ = Stage(gpu="a100-80g", tp=2, layers=4, recompute="full", recompute_layers=2)
    assert st_.recompute is Recompute.FULL and st_.recompute == "full" and st_.recomputed_layers == 2
    assert type(stage_to_dict(st_)["recompute"]) is str
    with pytest.raises(ValueError):
        Stage(gpu="a100-80g", tp=2, layers=4, recompute=SEARCH_BLOCK)  # a search option, not a stage's


stage_st = st.builds(
    lambda gpu, tp, layers, rc, rl: Stage(gpu=gpu, tp=tp, layers=layers, recompute=rc,
                                          recompute_layers=(min(rl, layers) if rc == "full" and rl is not None else None)),
    st.sampled_from(["a100-80g", "vendor-b-32g", "h20-96g"]), st.sampled_from([1, 2, 4, 8]), st.integers(1, 80),
    st.sampled_from(["none", "selective", "full"]), st.one_of(st.none(), st.integers(0, 80)))


@settings(max_examples=200, deadline=None)
@given(stages=st.lists(stage_st, min_size=1, max_size=8), dp=st.integers(1, 8), mb=st.integers(1, 8))
def test_round_trip_property(stages, dp, mb):
    plan = Plan(model="m", cluster="c", global_batch=dp * mb * 3, micro_batch=mb, seq_len=2048, dp=dp, stages=tuple(stages))
    assert plan_from_json(plan_to_json(plan)) == plan
    assert json.loads(plan_to_json(plan)) == plan_to_dict(plan)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("dp"), "dp"),
    (lambda d: d.update(micro_batch=0), "micro_batch"),
    (lambda d: d["stages"][1].update(recompute="half"), "recompute"),
    (lambda d: d["stages"][0].update(recompute_layers=3), "recompute_layers"),
    (lambda d: d["stages"][0].update(color="red"), "color"),
    (lambda d: d.update(stages=[]), "stages"),
])
def test_structural_errors_name_the_field(mutate, field):
    d = json.loads(json.dumps(DOC_EXAMPLE))
    mutate(d)
    with pytest.raises(InputError, match=field):
        plan_from_dict(d)


def test_validation_names_every_problem(conf_root):
    d = json.loads(json.dumps(DOC_EXAMPLE))
    d["global_batch"] = 130  # not divisible by dp × micro_batch = 4
    d["stages"][0]["layers"] = 11  # layers sum to 31
    d["stages"][1]["tp"] = 3  # does not divide 32 heads
    d["stages"][2]["gpu"] = "h100-80g"  # not in the cluster
    with pytest.raises(InputError) as e:
        validate_plan(plan_from_dict(d), load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root))
    msg = str(e.value)
    for needle in ("global_batch", "sum to 31", "stages[1].tp", "stages[2].gpu", "h100-80g"):
        assert needle in msg


def test_too_many_gpus_is_rejected(conf_root):
    d = json.loads(json.dumps(DOC_EXAMPLE))
    d["dp"] = 4
    d["global_batch"] = 128
    with pytest.raises(InputError, match="cluster three-vendor-20 has"):
        validate_plan(plan_from_dict(d), load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root))


def test_placement_keeps_tp_groups_inside_nodes(conf_root):
    cluster = load_cluster("three-vendor-20", conf_root)
    plan = plan_from_dict(DOC_EXAMPLE)
    where = place_plan(plan, cluster)
    assert where == [[0, 1, 2], [0, 1, 2]]
    bad = Plan(model="llama2-7b", cluster="three-vendor-20", global_batch=8, micro_batch=1, seq_len=4096, dp=1,
               stages=(Stage(gpu="a100-80g", tp=8, layers=32),))
    assert place_plan(bad, cluster) is None
