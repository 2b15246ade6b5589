"""The per-stage-dp search is exact (issue #27; memx.planner.stage_dp_search, docs/planner.md §Data parallel per
stage): on small mixed clusters its floor-then-fastest plan equals a full enumeration of the same space — every
layout, every layer split and every recompute option per stage, each plan scored by `estimate_plans` (the given-plan
closed form, memx.planner.stage_dp) — with the closed form and with an interval predictor (the floor on the
upper-bound margin). The default set runs a few seeded spaces; the slow test runs more. Extended to the dims that
combine with a per-stage dp (issue #27): context parallelism (context_parallel_options [1, 2]) and tied embeddings
(the first ↔ last stage all-reduce along FlagScale's pipeline paths, memx.domain.stage_dp.embedding_groups), and a
mixture-of-experts model at ep 1, 2 and 4 (sessions 14–15; its first layer dense, a shared expert:
memx.planner.stage_dp). Under the paper's assembly the ε-constraint walk alone is exact; under the cycle-mean
assemblies (the default cycle-mean-drain) the walk's plan is the incumbent of memx.planner.exact_split's
branch-and-bound (session 16): MoE spaces, whose larger tails made the walk alone miss on seeds 4 and 20 (by 2.3 % and
1.7 %), are exact too."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from memx.domain.catalog import load_gpu, load_model, load_search
from memx.domain.specs import Cluster, Node
from memx.planner.estimate import estimate_plans, upper_margins
from memx.planner.stage_dp_search import _recompute, floor_then_fastest, layouts
from memx.planner.tables import stage_options
from tests.unit.test_pick_exact import predictor_for

PAIRS = (("h100-80g", "mi300x-192g"), ("a100-40g", "l40s-48g"), ("v100-16g", "a100-80g"), ("a100-80g", "v100-32g"))


MOE = dict(num_experts=8, moe_router_topk=2, moe_ffn_hidden=1408, moe_shared_expert_ffn_hidden=2816,
           moe_first_dense_layers=1)


def _space(seed: int, new_dims: bool = False, moe: bool = False, assembly: str | None = None):
    rng = np.random.default_rng(seed)
    pair = PAIRS[seed % len(PAIRS)]
    nodes = tuple(Node(gpu=load_gpu(name), count=int(rng.choice((2, 4)))) for name in pair)
    cluster = Cluster(name="mixed", inter_node_bandwidth_gbps=float(rng.choice((12.0, 50.0))), nodes=nodes)
    model = dataclasses.replace(load_model("llama-6l"), layers=int(rng.integers(3, 6)),
                                hidden=int(rng.choice((4096, 8192))), heads=32, query_groups=8,
                                seq_len=int(rng.choice((2048, 4096))), tied_embeddings=new_dims, **(MOE if moe else {}))
    levels = ("none", "selective", "full") if seed % 2 else ("none", "full", "block")
    space = dataclasses.replace(load_search("small"), global_batch=int(rng.choice((8, 16))), tp_options=(1, 2),
                                micro_batch_options=(1, 2), recompute_levels=levels, max_pp=3,
                                margin_floor=float(rng.choice((0.1, 0.3, 0.5, 0.7))), stage_data_parallel=True,
                                context_parallel_options=(1, 2) if new_dims else (1,),
                                expert_parallel_options=(1, 2, 4) if moe else (1,))
    return cluster, model, space if assembly is None else dataclasses.replace(space, pipeline_assembly=assembly)


def _every_plan(cluster, model, space):
    for probe in layouts(cluster, model, space):
        for cuts in itertools.combinations(range(1, model.layers), probe.pp - 1):
            split = [b - a for a, b in zip((0, *cuts), (*cuts, model.layers))]
            for codes in itertools.product(*(stage_options(n, space.recompute_levels) for n in split)):
                stages = tuple(dataclasses.replace(st, layers=n, **_recompute(c, n))
                               for st, n, c in zip(probe.stages, split, codes))
                yield dataclasses.replace(probe, stages=stages)


def _enumerated(cluster, model, space, predictor):
    """(time, clears) of the best plan by full enumeration: feasible, clears the floor first, then fastest."""
    est = [e for e in estimate_plans(list(_every_plan(cluster, model, space)), cluster, model, predictor,
                                     reserve_gib=space.reserve_gib, pipeline_assembly=space.pipeline_assembly)
           if e.feasible]
    best = None
    for e, h in zip(est, upper_margins(est, model, predictor)):
        key = (not (e.min_margin if h is None else h) >= space.margin_floor, e.iteration_time_ms)
        best = key if best is None or key < best else best
    return best


def _outcome(seed: int, kind: str, new_dims: bool = False, moe: bool = False, assembly: str | None = None):
    """None (no plan either way), or (the search's plan, its key, the enumeration's key)."""
    cluster, model, space = _space(seed, new_dims, moe, assembly)
    predictor = predictor_for(cluster, kind)
    want = _enumerated(cluster, model, space, predictor)
    plan, _ = floor_then_fastest(cluster, model, space, predictor, (space.recompute_levels,))
    if want is None:
        assert plan is None
        return None
    e = estimate_plans([plan], cluster, model, predictor, reserve_gib=space.reserve_gib,
                       pipeline_assembly=space.pipeline_assembly)[0]
    h = upper_margins([e], model, predictor)[0]
    assert e.feasible
    return (not (e.min_margin if h is None else h) >= space.margin_floor, e.iteration_time_ms), want


def _check(seed: int, kind: str, new_dims: bool = False, moe: bool = False, assembly: str | None = None) -> bool:
    out = _outcome(seed, kind, new_dims, moe, assembly)
    if out is None:
        return False
    got, want = out
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-9), (seed, kind, got, want)
    return True


@pytest.mark.parametrize(("seed", "kind", "new_dims", "moe", "assembly"), [
    (0, "point", False, False, None), (14, "interval", False, False, None), (2, "point", True, False, None),
    (4, "point", False, True, None)])  # MoE, drained: the walk alone missed this seed by 2.3 % (session 14)
def test_per_stage_dp_pick_equals_full_enumeration(seed, kind, new_dims, moe, assembly):
    assert _check(seed, kind, new_dims, moe, assembly)


@pytest.mark.slow
def test_per_stage_dp_pick_equals_full_enumeration_on_many_spaces():
    kinds = ("point", "interval", "interval-nan")
    found = [_check(seed, kind, new_dims, moe, assembly) for seed in range(24) for kind in kinds
             for new_dims, moe, assembly in ((False, False, None), (True, False, None))]
    found += [_check(seed, kind, moe=True, assembly="paper") for seed in range(12) for kind in kinds]
    assert sum(found) >= len(found) // 2  # most spaces have a plan: the comparison is not vacuous
    # MoE under the default drained assembly (the walk alone missed seeds 4 and 20) and under the cycle mean alone
    found += [_check(seed, "point", moe=True) for seed in range(24)]
    found += [_check(seed, "point", moe=True, assembly="cycle-mean") for seed in range(12)]
    assert sum(found) >= len(found) // 2
