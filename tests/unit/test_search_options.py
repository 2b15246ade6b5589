"""Search options of issue #14: the distributed optimizer, sequence parallelism and GPU subsets."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.plan import idle_gpus
from memx.planner.cost import AnalyticStageModel, static_bytes_per_param
from memx.planner.predictions import static_bound
from memx.planner.search import search
from memx.planner.space import enumerate_layouts
from memx.planner.tables import StageContext


def _pred(cluster):
    return AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


def test_70b_on_32gb_gpus_needs_the_distributed_optimizer(conf_root):
    cluster, model = load_cluster("vendor-b-128", conf_root), load_model("llama2-70b", conf_root)
    space = load_search("default", conf_root)
    with pytest.raises(InfeasibleError, match="no layer split"):
        search(cluster, model, dataclasses.replace(space, distributed_optimizer=(False,)), _pred(cluster))
    r = search(cluster, model, dataclasses.replace(space, distributed_optimizer=(True,)), _pred(cluster), top_k=2)
    best = r.top[0]
    assert r.space.feasible > 0
    assert best.plan.distributed_optimizer and best.plan.dp > 1
    assert best.plan.sequence_parallel  # the default space: sequence parallelism on at tp > 1
    assert max(best.stage_peak_mib) <= 32 * 1024 - 1024  # capacity − 1 GiB reserve


def test_static_bound_counts_the_sharded_optimizer_state(conf_root):
    model = load_model("llama2-70b", conf_root)
    plain = StageContext(gpu="g", tp=4, micro_batch=1, first=False, last=False, inflight=1)
    do = dataclasses.replace(plain, distributed_optimizer=True, dp=4)
    limit = 31.0 * 1024
    # A llama2-70b layer: attention 2·8192² + 2·8192·1024 + MLP 3·8192·28672 + norms ≈ 855.6 M params,
    # 213.9 M per rank at tp 4. 18 B/param: 3,672 MiB a layer, 31,744 / 3,672 → 8 layers;
    # 6 + 12/4 = 9 B/param: 1,836 MiB a layer → 17 layers.
    assert float(static_bytes_per_param(True, 4)) == 9.0
    n_plain, n_do = static_bound(plain, model, limit, 80), static_bound(do, model, limit, 80)
    assert (n_plain, n_do) == (8, 17)


def test_both_settings_searched_and_no_duplicate_layouts(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    space = dataclasses.replace(load_search("small", conf_root), distributed_optimizer=(False, True),
                                sequence_parallel=(False, True))
    layouts = enumerate_layouts(cluster, model, space)
    keys = [(lay.stage_gpus, lay.stage_tp, lay.dp, lay.micro_batch, lay.distributed_optimizer, lay.sequence_parallel)
            for lay in layouts]
    assert len(keys) == len(set(keys))
    assert not any(lay.distributed_optimizer for lay in layouts if lay.dp == 1)
    assert not any(lay.sequence_parallel for lay in layouts if max(lay.stage_tp) == 1)
    assert {(lay.distributed_optimizer, lay.sequence_parallel) for lay in layouts} == {
        (False, False), (False, True), (True, False), (True, True)}
    off = dataclasses.replace(space, distributed_optimizer=(False,), sequence_parallel=(False,))
    assert len(enumerate_layouts(cluster, model, off)) < len(layouts)


# ~5 s: `make test-all`; use_all_gpus: false stays in the default set via the exactness property tests
# (tests/unit/test_search_exact.py draws it).
@pytest.mark.slow
def test_a_plan_may_leave_the_slow_gpus_idle(conf_root):
    """docs/results.md §A plan that leaves GPUs idle: gpt-neo-2.7b on 8 A100 + 8 T4."""
    cluster, model = load_cluster("a100-t4-16", conf_root), load_model("gpt-neo-2.7b", conf_root)
    space = load_search("default", conf_root)
    every = search(cluster, model, space, _pred(cluster))
    subset = search(cluster, model, dataclasses.replace(space, use_all_gpus=False), _pred(cluster))
    assert every.top_time[0].plan.idle_gpus is None and not any(idle_gpus(every.top_time[0].plan, cluster).values())
    fastest = subset.top_time[0]
    assert fastest.iteration_time_ms < every.top_time[0].iteration_time_ms
    assert dict(fastest.plan.idle_gpus) == {"t4-16g": 8} == {k: v for k, v in idle_gpus(fastest.plan, cluster).items() if v}
