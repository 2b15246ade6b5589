"""Searchable heads / query groups / sequence length (issue #14, opt-in): specs, the variants, the search over
their union, the plan JSON, and every consumer that builds stage signatures from a plan and its model."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError, SpecError
from memx.domain.plan import plan_from_dict, plan_model, plan_to_dict, plan_to_json, validate_plan
from memx.domain.specs import SearchSpace
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.objective import log_score, parse_weights
from memx.planner.result import search_result_to_dict
from memx.planner.search import search
from memx.planner.variants import model_variants
from memx.report.megatron import megatron_args
from memx.report.why import annotate
from memx.simulator.schedule import stage_signatures


def _pred(cluster):
    return AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


@pytest.fixture
def job(conf_root):
    return load_cluster("v100-t4-6", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)


def test_space_options_are_empty_by_default_sorted_and_bounded():
    sp = SearchSpace(name="s", global_batch=8)
    assert (sp.heads_options, sp.query_groups_options, sp.seq_len_options) == ((), (), ())
    assert SearchSpace(name="s", global_batch=8, heads_options=(64, 16, 64)).heads_options == (16, 64)
    with pytest.raises(SpecError, match="heads_options"):
        SearchSpace(name="s", global_batch=8, heads_options=(0,))
    with pytest.raises(SpecError, match="heads_options"):
        SearchSpace(name="s", global_batch=8, heads_options=(5000,))
    with pytest.raises(SpecError, match="seq_len_options"):
        SearchSpace(name="s", global_batch=8, seq_len=1024, seq_len_options=(512,))


def test_variants_skip_invalid_combinations_and_name_the_field_when_none_is_left(job):
    _, model, space = job
    assert [v.model for v in model_variants(model, space)] == [model]  # the job as given, the same object
    sp = dataclasses.replace(space, heads_options=(24, 32, 64), seq_len_options=(1024, 2048))
    got = [(v.model.heads, v.model.query_groups, v.seq_len, v.model.seq_len) for v in model_variants(model, sp)]
    # 24 does not divide hidden 4096; multi-head attention stays multi-head (query_groups = heads)
    assert got == [(32, 32, 1024, 1024), (64, 64, 1024, 1024), (32, 32, 2048, 2048), (64, 64, 2048, 2048)]
    assert model_variants(model, sp)[2].model is model
    gqa = dataclasses.replace(space, heads_options=(32,), query_groups_options=(3, 8, 64))
    assert [v.model.query_groups for v in model_variants(model, gqa)] == [8]  # 3 ∤ 32, 64 > heads
    with pytest.raises(InputError, match=r"heads_options.*\[24, 48\].*allowed heads: \[1, 2, 4"):
        model_variants(model, dataclasses.replace(space, heads_options=(24, 48)))


def test_search_over_variants_is_the_union_and_the_plan_records_the_change(job):
    cluster, model, space = job
    pred = _pred(cluster)
    parts = [search(cluster, model, dataclasses.replace(space, seq_len=s), pred, top_k=5) for s in (1024, 2048)]
    both = search(cluster, model, dataclasses.replace(space, seq_len_options=(1024, 2048)), pred, top_k=5)
    union = sorted((m.iteration_time_ms, plan_to_json(m.plan)) for r in parts for m in r.top_time)
    assert [(m.iteration_time_ms, plan_to_json(m.plan)) for m in both.top_time] == union[:len(both.top_time)]
    assert both.fastest.plan.seq_len == 1024  # the shorter sequence wins on time
    # Φ's ranking (fixed weights; the medians scale every plan alike) over the union = the parts' merged
    w = parse_weights("default")
    fixed = [search(cluster, model, dataclasses.replace(space, seq_len=s), pred, top_k=5, weights="default")
             for s in (1024, 2048)]
    union_phi = sorted((float(log_score(m.iteration_time_ms, m.max_mem_mib, m.mem_variance_mib2, w, space.epsilon_mib2)),
                        plan_to_json(m.plan)) for r in fixed for m in r.top)
    sp2 = dataclasses.replace(space, seq_len_options=(1024, 2048))
    got = search(cluster, model, sp2, pred, top_k=5, weights="default")
    assert [plan_to_json(m.plan) for m in got.top] == [k for _, k in union_phi[:5]]
    ref = search(cluster, model, sp2, pred, top_k=5, weights="default", exhaustive=True)  # the full enumeration
    assert [plan_to_json(m.plan) for m in ref.top] == [plan_to_json(m.plan) for m in got.top]
    assert ref.refs == pytest.approx(got.refs)
    assert both.space.layouts == sum(r.space.layouts for r in parts)
    assert both.space.feasible == sum(r.space.feasible for r in parts)
    # heads changed: the plan records it, its JSON round-trips, the model's value stays absent when unchanged
    r = search(cluster, model, dataclasses.replace(space, heads_options=(16,)), pred, top_k=3)
    d = plan_to_dict(r.chosen.plan)
    assert (d["heads"], d["query_groups"]) == (16, 16)
    assert plan_from_dict(d) == r.chosen.plan and plan_to_dict(plan_from_dict(d)) == d
    assert "heads" not in plan_to_dict(both.fastest.plan) and "query_groups" not in plan_to_dict(both.fastest.plan)
    validate_plan(r.chosen.plan, cluster, model)
    # the search's pick and estimate_plans agree on the variant (same signatures, same assembly)
    est = estimate_plans([r.chosen.plan], cluster, model, pred)[0]
    assert est.iteration_time_ms == pytest.approx(r.chosen.iteration_time_ms, rel=1e-4)
    obj = annotate(search_result_to_dict(r, "analytic"), model)
    assert obj["warnings"][0].startswith("the job changes: heads 32 → 16, query_groups 32 → 16; this is a different")
    assert not any("job changes" in w for w in annotate(search_result_to_dict(parts[1], "analytic"), model)["warnings"])


def test_consumers_use_the_plans_heads_and_sequence_length(job):
    cluster, model, space = job
    base = search(cluster, model, space, _pred(cluster), top_k=1).chosen.plan
    changed = dataclasses.replace(base, heads=64, query_groups=8, seq_len=1024)
    trained = plan_model(changed, model)
    assert (trained.heads, trained.query_groups, trained.seq_len, trained.hidden) == (64, 8, 1024, model.hidden)
    assert plan_model(base, model) is model
    sigs = stage_signatures(changed, model)
    assert {(s.heads, s.query_groups, s.seq_len) for s in sigs} == {(64, 8, 1024)}
    args, _ = megatron_args(changed, model, cluster)
    assert args[args.index("--num-attention-heads") + 1] == "64"
    assert args[args.index("--num-query-groups") + 1] == "8" and "--group-query-attention" in args
    assert args[args.index("--seq-length") + 1] == "1024"
    pred = _pred(cluster)
    a, b, c = estimate_plans([changed, base], cluster, model, pred)[0], *estimate_plans([base], cluster, model, pred), \
        estimate_plans([dataclasses.replace(changed, heads=None, query_groups=None)],
                       cluster, dataclasses.replace(model, heads=64, query_groups=8), pred)[0]
    assert a.iteration_time_ms == pytest.approx(c.iteration_time_ms) and a.peak_mem_mib == pytest.approx(c.peak_mem_mib)
    assert a.iteration_time_ms != pytest.approx(b.iteration_time_ms)
    with pytest.raises(InputError, match="heads"):
        validate_plan(dataclasses.replace(base, heads=24), cluster, model)


def test_variants_and_replica_groups_are_not_combined():
    import dataclasses

    import pytest

    from memx.domain.catalog import load_search
    from memx.domain.errors import InputError

    with pytest.raises(InputError, match="max_replica_groups.*must be 1 when heads_options"):
        dataclasses.replace(load_search("small"), heads_options=(16, 32), max_replica_groups=2)
