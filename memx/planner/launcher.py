"""The launcher constraint of the search (`SearchSpace.launcher`, issue #24; docs/planner.md §Launcher).

`any` searches the full MemX space. `megatron` keeps what stock Megatron-LM starts: the layouts of
`memx.planner.space` are restricted there (one tp for every stage, the GPUs of one vendor), and the
recomputation is one setting for every stage — Megatron-LM applies `--recompute-granularity/-method/-num-layers`
to every pipeline rank (megatron/training/arguments.py) — so each uniform level (none, selective, full) is
searched on its own and the pick rule chooses among the kept candidates of every level (`joined`).
`flagscale` keeps what FlagScale's heterogeneous training starts: per-stage recomputation only toggles *full*
recomputation (`recompute_granularity_per_stage_micro_batch` requires `recompute_granularity: full`, FlagScale
flagscale/train/arguments.py post_validate_args), so selective is searched on every stage or on none.
Context parallelism (SearchSpace.context_parallel_options, issue #27): `megatron` searches cp > 1 only on GPUs
with fused attention, `flagscale` not at all (memx.planner.context_parallel.launcher_runs_cp, applied where the
layouts are enumerated, memx.planner.space.context_parallel_layouts).
Mixture of experts (issue #27): Megatron-LM takes one expert-parallel size for the whole job
(`--expert-model-parallel-size`), FlagScale one per process mesh, every one 1 or none ("all 1 or none 1",
pre_validate_args); both need ep to divide dp (expert tp = tp). A layout of memx.planner.space has one ep that
divides its dp, so every launcher runs it; the per-stage-dp layouts (FlagScale's) take one per mesh
(memx.planner.stage_dp_search); replica groups (schema 2) carry none (memx.planner.moe).

The opt-in per-stage-dp space (`stage_data_parallel`, memx.planner.stage_dp_search; refused with `megatron`, which
has one dp): under `flagscale` its layouts keep cp 1 (the same launcher_runs_cp rule: FlagScale's meshes may
name a cp, all equal, but its heterogeneous ParallelContext asserts cp == 1) and no interleaving (FlagScale asserts
'virtual pipeline not support now!' with heterogeneous meshes); under `any` they take every cp of
context_parallel_options (issue #27).

`launcher_gain` runs the unconstrained search beside a constrained one: what the heterogeneous plan gains
over the best plan the launcher runs (time and margin), for the report.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memx.domain.errors import InfeasibleError
from memx.domain.recompute import SEARCH_BLOCK, Recompute
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.planner.pick import unique, with_candidates
from memx.planner.replica_search import replica_search
from memx.planner.result import SearchResult, plan_key
from memx.planner.search import search
from memx.planner.stage_dp_search import with_stage_dp


def level_sets(space: SearchSpace) -> tuple[tuple[str, ...], ...]:
    """The recompute level lists searched one at a time under `space.launcher` (module docstring)."""
    levels = space.recompute_levels
    if space.launcher == "megatron":
        return tuple((lv,) for lv in levels if lv != SEARCH_BLOCK)
    if space.launcher == "flagscale" and Recompute.SELECTIVE.value in levels and len(levels) > 1:
        return (tuple(lv for lv in levels if lv != Recompute.SELECTIVE.value), (Recompute.SELECTIVE.value,))
    return (levels,)


def _margin(r: SearchResult) -> float:
    return r.margins_high.get(plan_key(r.chosen.plan), r.chosen.min_margin)


def joined(results: list[SearchResult], space: SearchSpace, model: ModelArch, predictor) -> SearchResult:
    """The level sets' searches as one result: the first with every other's kept candidates (top-k by Φ and by time,
    the front, the safe set; their Φ on the first's medians and weights, memx.planner.pick.phi_on) and the pick rule
    applied to them all, so the rule chooses across levels as it does within one. Each level keeps the safe plans
    within `balance_tolerance` of its own fastest safe plan, never faster than the union's, so the union of the kept
    sets holds every plan a floor rule can pick; Φ ranks them on one level's medians (docs/planner.md §Launcher)."""
    first, rest = results[0], results[1:]
    ms = unique([c for r in rest for c in (*r.top, *r.top_time, *r.pareto, *r.safe)])
    safe = unique([c for r in rest for c in r.safe])
    out = with_candidates(first, ms, {k: v for r in rest for k, v in r.margins_high.items()}, space, model, predictor,
                          safe=safe)
    return dataclasses.replace(out, search_s=sum(r.search_s for r in results),
                               predict_s=sum(r.predict_s for r in results),
                               signatures=sum(r.signatures for r in results))


def launcher_search(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, **kw: Any) -> SearchResult:
    """The search under `space.launcher`: `any` is `replica_search` unchanged; otherwise the best pick over
    `level_sets(space)` (InfeasibleError naming each level's reason when none has a plan). With
    `stage_data_parallel` (opt-in, issue #27) the per-stage-dp space is searched beside it under the same level
    sets and its best plan joins the candidates the pick rule chooses from (`stage_dp_option`)."""
    return stage_dp_option(_launcher_search(cluster, model, space, predictor, **kw), cluster, model, space, predictor)


def stage_dp_option(result: SearchResult, cluster: Cluster, model: ModelArch, space: SearchSpace,
                    predictor) -> SearchResult:
    """`result` unchanged, or with `stage_data_parallel` (opt-in, issue #27) the per-stage-dp space searched
    beside it under `level_sets(space)`, its best plan among the kept candidates and the pick rule applied again
    (memx.planner.stage_dp_search.with_stage_dp)."""
    if not space.stage_data_parallel:
        return result
    return with_stage_dp(result, cluster, model, space, predictor, level_sets(space))


def _launcher_search(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, **kw: Any) -> SearchResult:
    if space.launcher == "any":
        return replica_search(cluster, model, space, predictor, **kw)
    results, reasons = [], []
    for levels in level_sets(space):
        try:
            results.append(search(cluster, model, dataclasses.replace(space, recompute_levels=levels), predictor, **kw))
        except InfeasibleError as exc:
            reasons.append(f"recompute {'/'.join(levels)}: {exc}")
    if not results:
        raise InfeasibleError(f"no plan {space.launcher} can launch: " + "; ".join(reasons))
    return results[0] if len(results) == 1 else joined(results, space, model, predictor)


def launcher_gain(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, constrained: SearchResult,
                  **kw: Any) -> dict[str, Any]:
    """The unconstrained pick (launcher `any`) against `constrained`'s: both times and margins, and
    `time_ratio` = constrained / unconstrained iteration time (> 1: the heterogeneous plan is faster)."""
    free = replica_search(cluster, model, dataclasses.replace(space, launcher="any"), predictor, **kw)
    return gain_of(space.launcher, constrained, free)


def gain_of(launcher: str, constrained: SearchResult, free: SearchResult) -> dict[str, Any]:
    """`launcher_gain`'s figures from the two searches' results."""
    t_c, t_f = constrained.chosen.iteration_time_ms, free.chosen.iteration_time_ms
    return {"launcher": launcher, "time_ms": t_c, "margin": _margin(constrained),
            "unconstrained_time_ms": t_f, "unconstrained_margin": _margin(free), "time_ratio": t_c / t_f}
