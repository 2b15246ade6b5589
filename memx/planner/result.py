"""A search's result and its JSON object — the `memx plan --format json` contract (README,
docs/architecture.md §Plan JSON). The pipeline's search step writes it, the CLI prints it, and
memx.report renders Markdown and tables from it, so the conversion lives here, below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memx.domain.groups import GroupedPlan, any_plan_from_dict, any_plan_to_dict
from memx.domain.specs import Weights
from memx.planner.metrics import PlanMetrics


@dataclass(frozen=True, kw_only=True)
class SpaceCount:
    layouts: int
    total: int  # layouts × layer splits × per-stage recompute choices, before pruning
    splits_total: int  # layouts × layer splits, before pruning
    evaluated: int  # splits left after the static-memory and slowdown bounds (each gets step 1)
    feasible: int  # plans with a feasible recompute assignment
    # Work done, not properties of the space (so two searches of one space compare equal):
    scored: int = field(default=0, compare=False)  # plans enumerated and assigned (the rest: discarded by bound)
    discarded: int = field(default=0, compare=False)  # evaluated − scored: discarded by bound (memx.planner.bnb)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    weights: Weights
    space: SpaceCount
    refs: tuple[float, float, float]  # medians of T, M, V over feasible plans
    refs_sample: int  # 0: the medians are exact; else the feasible plans sampled for them (memx.planner.medians)
    top: list[PlanMetrics]  # by Φ
    top_time: list[PlanMetrics]  # by iteration time
    pareto: list[PlanMetrics]
    search_s: float
    predict_s: float
    signatures: int
    epsilon_mib2: float
    # Share of the stage signatures a caching predictor (memx.learn.cache) answered from its cache in the
    # search's one table call; None for a predictor without a cache.
    cache_hit_rate: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # The pick (memx.planner.pick.apply_pick): None = the paper's, top[0].
    pick: PlanMetrics | None = None
    pick_rule: str = "phi"
    margin_floor: float = 0.10
    warnings: tuple[str, ...] = ()
    margins_high: dict = field(default_factory=dict)  # plan key → smallest margin at the upper memory bound
    # Plans whose smallest margin clears the floor, within balance_tolerance of the fastest such plan
    # (memx.planner.candidates.Keeper.safe; the widest plan when none clears it): what the rules pick from.
    safe: list[PlanMetrics] = field(default_factory=list)
    # With pick_rule phi: the plan the default rule would pick when the Φ pick is below the floor (shown beside it).
    floor_pick: PlanMetrics | None = None
    # The end of the window the front covers when SearchSpace.front_tolerance cut it (Keeper.front_cut_ms), else None.
    pareto_window_ms: float | None = None
    # With max_replica_groups > 1 and a one-group pick: the best plan with replica groups (memx.planner.replica_search).
    best_grouped: PlanMetrics | None = None

    @property
    def best(self) -> PlanMetrics:
        """The plan of least Φ (the paper's pick)."""
        return self.top[0]

    @property
    def chosen(self) -> PlanMetrics:
        """The recommended plan: the pick rule's (memx.planner.pick), else Φ's."""
        return self.pick if self.pick is not None else self.top[0]

    @property
    def fastest(self) -> PlanMetrics:
        return self.top_time[0]


def predicted(m: PlanMetrics) -> dict[str, Any]:
    """The "predicted" object of one plan (rounded as the JSON contract prints it)."""
    return {
        "iteration_time_ms": round(m.iteration_time_ms, 3),
        "peak_mem_mib": [round(x, 1) for x in m.peak_mem_mib],
        "max_mem_mib": round(m.max_mem_mib, 1),
        "mem_variance_mib2": round(m.mem_variance_mib2, 1),
        "min_margin": round(m.min_margin, 4),
        "phi": round(m.phi, 5),
    }


def _predicted_groups(q: dict[str, Any], m: PlanMetrics) -> dict[str, Any]:
    """Schema 2 adds the cross-group term and each group's share and time (docs/architecture.md §Plan JSON,
    schema 2); schema-1 entries are left exactly as they were."""
    if isinstance(m.plan, GroupedPlan):
        q["cross_group_sync_ms"] = round(m.cross_sync_ms, 3)
        q["groups"] = [{"samples": g.samples, "iteration_time_ms": round(gm.iteration_time_ms, 3)}
                       for g, gm in zip(m.plan.groups, m.groups)]
    return q


def _stage_groups(plan) -> list[int | None]:
    """Group index of every stage row (None for schema 1)."""
    if not isinstance(plan, GroupedPlan):
        return [None] * len(plan.stages)
    return [g for g, grp in enumerate(plan.groups) for _ in grp.stages]


def plan_key(plan):
    """The key of `SearchResult.margins_high` (memx.planner.pick) for a plan of either schema: the whole plan
    (job options and model changes included: plans differing only there are different)."""
    return plan


def _entry(m: PlanMetrics, high: dict | None = None) -> dict[str, Any]:
    q = _predicted_groups(predicted(m), m)
    h = (high or {}).get(plan_key(m.plan))
    if h is not None:
        q["min_margin_high"] = round(h, 4)  # at the predictor's upper memory bound
    rows = []
    for t, p, cap, g in zip(m.stage_time_ms, m.stage_peak_mib, m.capacity_mib, _stage_groups(m.plan)):
        row = {"time_ms": round(t, 3), "peak_mib": round(p, 1), "capacity_mib": cap}
        if g is not None:
            row["group"] = g
        rows.append(row)
    return {"plan": any_plan_to_dict(m.plan), "predicted": q, "stages": rows}


def search_result_to_dict(r: SearchResult, predictor_name: str) -> dict[str, Any]:
    """The `memx plan --format json` object (README: output contract)."""
    best = _entry(r.chosen, r.margins_high)
    return {
        "plan": best["plan"],
        "predicted": best["predicted"],
        "weights": {"profile": r.weights.profile, "w": list(r.weights.as_tuple())},
        "space": {"total": r.space.total, "feasible": r.space.feasible, "layouts": r.space.layouts,
                  "splits": r.space.splits_total, "evaluated": r.space.evaluated, "scored": r.space.scored,
                  "discarded_by_bound": r.space.discarded},
        "search_s": round(r.search_s, 3),
        "predictor": predictor_name,
        "references": {"time_ms": r.refs[0], "max_mem_mib": r.refs[1], "mem_variance_mib2": r.refs[2],
                       "epsilon_mib2": r.epsilon_mib2, "sample": r.refs_sample},
        "stages": best["stages"],
        "top": [_entry(c, r.margins_high) for c in r.top],
        "fastest": _entry(r.fastest, r.margins_high),
        "pareto": [_entry(c, r.margins_high) for c in r.pareto],  # (T, smallest margin, std-dev) front
        # the end of the window the front covers when the front tolerance cut it (SearchSpace.front_tolerance)
        "pareto_window": None if r.pareto_window_ms is None else {"max_iteration_time_ms": round(r.pareto_window_ms, 3)},
        "pick": {"rule": r.pick_rule, "margin_floor": r.margin_floor},
        **({"floor_pick": _entry(r.floor_pick, r.margins_high)} if r.floor_pick is not None else {}),
        **({"best_grouped": _entry(r.best_grouped, r.margins_high)} if r.best_grouped is not None else {}),
        "warnings": list(r.warnings),
    }


def metrics_from_dict(entry: dict[str, Any]) -> PlanMetrics:
    """An entry of the JSON object ({"plan", "predicted", "stages"}; the object itself is its pick's
    entry) back to PlanMetrics, at the JSON's rounding, for either plan schema (schema 2: `groups` carries
    each group's share and time only, `cross_sync_ms` the cross-group term). Search results are feasible
    by construction."""
    q, stages = entry["predicted"], entry["stages"]
    plan = any_plan_from_dict(entry["plan"])
    extra: dict[str, Any] = {}
    if isinstance(plan, GroupedPlan):
        extra["cross_sync_ms"] = q.get("cross_group_sync_ms", 0.0)
    return PlanMetrics(
        plan=plan, iteration_time_ms=q["iteration_time_ms"],
        stage_time_ms=tuple(s["time_ms"] for s in stages), stage_peak_mib=tuple(s["peak_mib"] for s in stages),
        peak_mem_mib=tuple(q["peak_mem_mib"]), capacity_mib=tuple(s["capacity_mib"] for s in stages),
        max_mem_mib=q["max_mem_mib"], mem_variance_mib2=q["mem_variance_mib2"], min_margin=q["min_margin"],
        feasible=True, phi=q["phi"], **extra)


def weights_from_dict(obj: dict[str, Any]) -> Weights:
    w = obj["weights"]["w"]
    return Weights(profile=obj["weights"]["profile"], w_time=w[0], w_mem=w[1], w_var=w[2])
