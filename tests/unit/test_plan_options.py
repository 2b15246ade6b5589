"""Plan JSON job options (issue #14): distributed optimizer, sequence parallelism, the GPUs a plan leaves idle.

Older plan files (without the fields) load as false / false / not recorded and re-serialise unchanged;
the fields round-trip; validate_plan accepts plans using a subset of the cluster and rejects more."""

import json

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError
from memx.domain.plan import idle_gpus, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json, validate_plan, with_idle_gpus

OLD = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 128, "micro_batch": 2, "seq_len": 4096, "dp": 2,
       "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none"},
                  {"gpu": "vendor-b-32g", "tp": 4, "layers": 10, "recompute": "full"},
                  {"gpu": "vendor-c-32g", "tp": 4, "layers": 10, "recompute": "full", "recompute_layers": 6}]}


@pytest.fixture(scope="module")
def tv():
    return load_cluster("three-vendor-20"), load_model("llama2-7b")


def test_an_older_plan_file_loads_with_the_defaults_and_reserialises_unchanged():
    text = json.dumps(OLD, separators=(", ", ": "))
    plan = plan_from_json(text)
    assert (plan.distributed_optimizer, plan.sequence_parallel, plan.idle_gpus) == (False, False, None)
    assert plan_to_json(plan) == text


@pytest.mark.parametrize("extra", [{"distributed_optimizer": True}, {"sequence_parallel": True},
                                   {"distributed_optimizer": True, "sequence_parallel": True},
                                   {"idle_gpus": {"vendor-c-32g": 8}}, {"idle_gpus": {}}])
def test_options_round_trip_and_are_written_only_when_set(extra):
    data = {**OLD, **extra}
    plan = plan_from_dict(data)
    assert plan_to_dict(plan) == data and plan_from_json(plan_to_json(plan)) == plan
    assert "distributed_optimizer" not in plan_to_dict(plan_from_dict({**OLD, "distributed_optimizer": False}))


@pytest.mark.parametrize("field, value", [("distributed_optimizer", "true"), ("sequence_parallel", 1),
                                          ("idle_gpus", ["a100-80g"]), ("idle_gpus", {"a100-80g": -1})])
def test_bad_option_values_name_the_field(field, value):
    with pytest.raises(InputError, match=field):
        plan_from_dict({**OLD, field: value})


def test_plans_may_leave_gpus_idle_but_not_use_more(tv):
    cluster, model = tv
    subset = plan_from_dict({**OLD, "dp": 1, "global_batch": 64})  # 10 of the 20 GPUs
    validate_plan(subset, cluster, model)
    assert idle_gpus(subset, cluster) == {"a100-80g": 2, "vendor-b-32g": 4, "vendor-c-32g": 4}
    assert idle_gpus(plan_from_dict(OLD), cluster) == {"a100-80g": 0, "vendor-b-32g": 0, "vendor-c-32g": 0}
    too_many = plan_from_dict({**OLD, "dp": 4})
    with pytest.raises(InputError, match="cluster three-vendor-20 has"):
        validate_plan(too_many, cluster, model)


def test_the_idle_record_is_checked_against_the_cluster(tv):
    cluster, model = tv
    subset = with_idle_gpus(plan_from_dict({**OLD, "dp": 1, "global_batch": 64}), cluster)
    assert plan_to_dict(subset)["idle_gpus"] == {"a100-80g": 2, "vendor-b-32g": 4, "vendor-c-32g": 4}
    validate_plan(plan_from_json(plan_to_json(subset)), cluster, model)
    validate_plan(with_idle_gpus(plan_from_dict(OLD), cluster), cluster, model)  # {} = none idle
    for wrong in ({"a100-80g": 1}, {"t4-16g": 2}):
        with pytest.raises(InputError, match="idle_gpus"):
            validate_plan(plan_from_dict({**OLD, "idle_gpus": wrong}), cluster, model)


def test_sequence_parallel_at_tp_1_is_valid_and_a_no_op(tv):
    cluster, model = tv
    tp1 = {**OLD, "dp": 1, "global_batch": 64, "sequence_parallel": True,
           "stages": [{**s, "tp": 1} for s in OLD["stages"]]}
    validate_plan(plan_from_dict(tp1), cluster, model)  # Megatron-LM disables SP when tp = 1; so do we
    validate_plan(plan_from_dict({**OLD, "distributed_optimizer": True, "dp": 1, "global_batch": 64}), cluster, model)
