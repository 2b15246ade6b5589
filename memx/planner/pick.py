"""The pick: which of the kept candidates `memx plan` recommends (issue #12; docs/planner.md §The pick).

The search keeps exact decision sets (memx.planner.candidates.Keeper): the top-k by Φ, the top-k by
time, the Pareto front and the fastest plan whose smallest margin clears the floor. The rule chooses
among them:

* `phi` — the paper's method as published (§3.1.2): the plan of least Φ. Kept unchanged for side-by-side
  measurement; a dominated or below-floor pick only adds a warning.
* `phi-bounded` — Φ among plans within `max_time_ratio` × the fastest (the search's window), then two
  guards: plans whose smallest margin clears `margin_floor` first (if none does, the best one below it,
  with a warning), and never a plan another kept candidate beats on time and on smallest margin at once
  (dominance; ties on both do not dominate).
* `fastest-above-floor` — the fastest kept plan whose smallest margin ≥ `margin_floor` (ties: the larger
  margin); if none clears it, the plan of largest margin, with a warning.
* `balanced-phi` / `balanced-margin` (issue #22) — among the plans that clear the floor within
  (1 + `balance_tolerance`) × the fastest of them, the one of least Φ / of largest smallest margin (ties:
  the faster): balance where it costs at most the tolerance; if none clears it, as fastest-above-floor.
* `balanced-front` (issue #22, session 3; the default) — as balanced-phi, among those of these plans that
  no plan dominates on (time, smallest margin): least Φ on the (T, margin) front within the tolerance.
  Φ alone buys balance with margin (balanced-phi may take a plan another one beats on time and margin at
  once); the front keeps it from that (docs/results.md §Balance where it is free).

Every rule but `phi` respects the floor. The search keeps the safe sets exactly over the whole space
(memx.planner.candidates.Keeper.safe: the fastest plan above the floor and the balanced picks), so "no
plan clears the floor" is said only when none does; then the warning names the stage and GPU type of the
widest plan that cannot clear it. With `phi`, the plan the default rule would pick is kept beside a
below-floor pick (`Pick.floor_pick`).

Margins are the upper-memory-bound margins where the predictor gives intervals (from `peak_mem_mib_high`:
the search's own figure, PlanMetrics.min_margin_high, which its keeper and box bounds use, so the floor pick
is exact on it; for other plans memx.planner.estimate.upper_margins, the same definition), else the point
margins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memx.domain.specs import ModelArch, SearchSpace
from memx.planner.estimate import upper_margins
from memx.planner.metrics import PlanMetrics
from memx.planner.objective import phi
from memx.planner.result import SearchResult
from memx.planner.result import plan_key as result_plan_key
from memx.planner.signatures import StagePredictor

PICK_RULES = ("phi", "phi-bounded", "fastest-above-floor", "balanced-phi", "balanced-margin", "balanced-front")
FLOOR_RULES = ("fastest-above-floor", "balanced-phi", "balanced-margin", "balanced-front")  # respect the floor
FLOOR_RULE = "fastest-above-floor"  # what `phi` puts beside a below-floor pick


def front_tolerance(space: SearchSpace) -> float | None:
    """The tolerance of the kept front's window (SearchSpace.front_tolerance, Keeper.front_window_ms): None (the Φ
    window) when unset or for phi / phi-bounded, whose dominance guard reads the whole window's front; else at least
    balance_tolerance, so the front covers every plan a balanced rule may pick and every plan that dominates one."""
    if space.front_tolerance is None or space.pick_rule not in FLOOR_RULES:
        return None
    return max(space.front_tolerance, space.balance_tolerance)


@dataclass(frozen=True, kw_only=True)
class Pick:
    plan: PlanMetrics
    rule: str
    warnings: tuple[str, ...] = ()
    replaced: PlanMetrics | None = None  # the Φ pick a guard set aside (dominated or below the floor)
    floor_pick: PlanMetrics | None = None  # rule phi, pick below the floor: the best plan that clears it


def plan_key(m: PlanMetrics):
    """The key of `SearchResult.margins_high` (memx.planner.result.plan_key; either plan schema)."""
    return result_plan_key(m.plan)


def dominates(a: PlanMetrics, b: PlanMetrics, margin: Callable[[PlanMetrics], float]) -> bool:
    """a is no slower and has no smaller margin than b, and is strictly better on one of the two."""
    ta, tb, ma, mb = a.iteration_time_ms, b.iteration_time_ms, margin(a), margin(b)
    return ta <= tb and ma >= mb and (ta < tb or ma > mb)


def unique(cands: Sequence[PlanMetrics]) -> list[PlanMetrics]:
    seen: dict = {}
    for c in cands:
        seen.setdefault(plan_key(c), c)
    return list(seen.values())


def choose(by_phi: Sequence[PlanMetrics], others: Sequence[PlanMetrics], *, rule: str, margin_floor: float,
           max_time_ratio: float = 0.0, margin: Callable[[PlanMetrics], float] | None = None,
           balance_tolerance: float = 0.0) -> Pick:
    """The recommended plan. by_phi: the top by Φ (best first; within the window when max_time_ratio > 0);
    others: every other kept candidate (top by time, Pareto front, the safe sets)."""
    if rule not in PICK_RULES:
        raise ValueError(f"pick_rule {rule!r}: allowed values are {', '.join(PICK_RULES)}")
    mg = margin or (lambda m: m.min_margin)
    pool = unique([*by_phi, *others])
    fastest_t = min(c.iteration_time_ms for c in pool)
    floor_txt = f"{margin_floor:.0%}"
    clears = [c for c in pool if mg(c) >= margin_floor]
    widest = max(pool, key=lambda c: (mg(c), -c.iteration_time_ms, -c.mem_variance_mib2))
    below = "" if clears else none_clears(widest, margin_floor, mg)
    warnings: list[str] = []
    if rule in FLOOR_RULES:
        if not clears:
            return Pick(plan=widest, rule=rule, warnings=(below + "; showing the plan of largest smallest margin",))
        return Pick(plan=_safe_pick(clears, rule, mg, balance_tolerance), rule=rule)
    phi_pick = by_phi[0]
    if rule == "phi":
        beater = next((c for c in pool if dominates(c, phi_pick, mg)), None)
        if beater is not None:
            warnings.append(f"the Φ pick is dominated: another plan is faster or equal ({beater.iteration_time_ms:,.0f} "
                            f"ms) with a larger or equal smallest margin ({mg(beater):.1%}); pick_rule phi-bounded or "
                            "fastest-above-floor avoids it")
        beside = None
        if mg(phi_pick) < margin_floor:
            warnings.append(f"the pick's smallest margin {mg(phi_pick):.1%} is below the floor {floor_txt}"
                            + ("; the fastest plan that clears it is shown beside it" if clears else f"; {below}"))
            beside = _safe_pick(clears, FLOOR_RULE, mg, balance_tolerance) if clears else None
        return Pick(plan=phi_pick, rule=rule, warnings=tuple(warnings), floor_pick=beside)
    # phi-bounded: Φ order within the window, floor first, never dominated (by any kept candidate).
    window = [c for c in by_phi if max_time_ratio <= 0 or c.iteration_time_ms <= max_time_ratio * fastest_t]
    window = window or list(by_phi)
    undominated = [c for c in window if not any(dominates(o, c, mg) for o in pool)]
    # The fastest plan that clears the floor (or the largest-margin one) is never dominated: a fallback.
    fallback = (min(clears, key=lambda c: (c.iteration_time_ms, -mg(c), c.mem_variance_mib2)) if clears
                else max(pool, key=lambda c: (mg(c), -c.iteration_time_ms)))
    above = [c for c in undominated if mg(c) >= margin_floor]
    if above:
        best = above[0]
    elif clears:
        best = fallback
    else:
        best = undominated[0] if undominated else fallback
        warnings.append(below + "; showing the best one below it")
    replaced = phi_pick if plan_key(best) != plan_key(phi_pick) else None
    return Pick(plan=best, rule=rule, warnings=tuple(warnings), replaced=replaced)


def _safe_pick(clears: list[PlanMetrics], rule: str, mg: Callable[[PlanMetrics], float],
               tolerance: float) -> PlanMetrics:
    """fastest-above-floor: the fastest plan that clears the floor (ties: larger margin, smaller V); the
    balanced rules: of the plans within (1 + tolerance) × it, least Φ or largest margin (ties: the faster);
    balanced-front: least Φ of those no plan dominates on (time, margin) (a plan that dominates one of them
    clears the floor and is no slower, so it is one of them too)."""
    fastest = min(clears, key=lambda c: (c.iteration_time_ms, -mg(c), c.mem_variance_mib2))
    if rule == FLOOR_RULE:
        return fastest
    near = [c for c in clears if c.iteration_time_ms <= (1.0 + tolerance) * fastest.iteration_time_ms]
    if rule == "balanced-front":
        near = [c for c in near if not any(dominates(o, c, mg) for o in near)]
    if rule in ("balanced-phi", "balanced-front"):
        return min(near, key=lambda c: (c.phi if c.phi is not None else float("inf"), c.iteration_time_ms,
                                        c.mem_variance_mib2))
    return min(near, key=lambda c: (-mg(c), c.iteration_time_ms, c.mem_variance_mib2))


def none_clears(widest: PlanMetrics, margin_floor: float, mg: Callable[[PlanMetrics], float]) -> str:
    """The reason no plan clears the floor: the widest plan's tightest stage and its GPU type."""
    stages = getattr(widest.plan, "stages", ())
    rel = [1.0 - p / c for p, c in zip(widest.stage_peak_mib, widest.capacity_mib)]
    where = ""
    if stages and len(rel) == len(stages):
        s = min(range(len(rel)), key=rel.__getitem__)
        where = f": even the plan of largest margin leaves stage {s} ({stages[s].gpu}) {mg(widest):.1%}"
    return f"no plan clears the margin floor {margin_floor:.0%}{where}"


BUBBLE_WARN = 0.25  # pipeline bubble share above which the output warns (issue #22)


def bubble_warning(m: PlanMetrics) -> str | None:
    """A warning when the pick's 1F1B bubble, (p − 1) / (m + p − 1) of the iteration for p stages and m micro
    batches per replica (Narayanan et al. 2021, §2.2), exceeds BUBBLE_WARN, with the micro-batch count
    m ≥ 3 (p − 1) that brings it to 25 %; None otherwise (and for schema-2 plans, each group has its own m)."""
    plan = m.plan
    if not hasattr(plan, "stages") or not hasattr(plan, "micro_batches"):
        return None
    pp, mb = len(plan.stages), plan.micro_batches
    bubble = (pp - 1) / (mb + pp - 1)
    if bubble <= BUBBLE_WARN:
        return None
    need = 3 * (pp - 1)
    return (f"pipeline bubble ≈ {bubble:.0%} of the iteration ({pp} stages, {mb} micro batches per replica): "
            f"{need} or more micro batches bring it to ≤ {BUBBLE_WARN:.0%} (global batch ≥ "
            f"{need * plan.dp * plan.micro_batch:,} at dp {plan.dp}, micro batch {plan.micro_batch})")


def pareto_margin(cands: Sequence[PlanMetrics], margin: Callable[[PlanMetrics], float] | None = None
                  ) -> list[PlanMetrics]:
    """The (time, smallest margin, memory std-dev) front of the candidates, by time: no other candidate is
    no slower, no tighter and no more variable while strictly better in one."""
    mg = margin or (lambda m: m.min_margin)
    pool = unique(cands)

    def beats(a: PlanMetrics, b: PlanMetrics) -> bool:
        le = (a.iteration_time_ms <= b.iteration_time_ms and mg(a) >= mg(b)
              and a.mem_variance_mib2 <= b.mem_variance_mib2)
        return le and (a.iteration_time_ms < b.iteration_time_ms or mg(a) > mg(b)
                       or a.mem_variance_mib2 < b.mem_variance_mib2)

    return sorted((c for c in pool if not any(beats(o, c) for o in pool)),
                  key=lambda c: (c.iteration_time_ms, -mg(c), c.mem_variance_mib2))


def apply_pick(r: SearchResult, space: SearchSpace, model: ModelArch, predictor: StagePredictor) -> SearchResult:
    """The search's result with the pick of `space.pick_rule`, the (T, margin, V) front of the kept
    candidates, upper-bound margins where the predictor gives intervals, and the pick's warnings."""
    kept = unique([*r.top, *r.top_time, *r.pareto, *r.safe])
    high = {plan_key(c): c.min_margin_high for c in kept if c.min_margin_high is not None}  # the keeper's
    # then those the result already carries (a grouped or per-stage-dp candidate's, with_candidate)
    high |= {k: r.margins_high[k] for k in map(plan_key, kept) if k in r.margins_high and k not in high}
    rest = [c for c in kept if plan_key(c) not in high]
    high |= {plan_key(c): h for c, h in zip(rest, upper_margins(rest, model, predictor)) if h is not None}

    def mg(m: PlanMetrics) -> float:
        return high.get(plan_key(m), m.min_margin)

    chosen = choose(r.top, [*r.top_time, *r.pareto, *r.safe], rule=space.pick_rule,
                    margin_floor=space.margin_floor, max_time_ratio=space.max_time_ratio, margin=mg,
                    balance_tolerance=space.balance_tolerance)
    return dataclasses.replace(r, pick=chosen.plan, pick_rule=chosen.rule, margin_floor=space.margin_floor,
                               warnings=chosen.warnings + tuple(w for w in [bubble_warning(chosen.plan)] if w),
                               margins_high=high, floor_pick=chosen.floor_pick,
                               pareto=pareto_margin(in_front_window(r, kept), mg))


def in_front_window(r: SearchResult, kept: list[PlanMetrics]) -> list[PlanMetrics]:
    """The kept plans the reported front is drawn from: the search's front and, of the others, those inside the
    window it covers (SearchResult.pareto_window_ms; all of them without one)."""
    w = r.pareto_window_ms
    return kept if w is None else unique([*r.pareto, *(c for c in kept if c.iteration_time_ms <= w)])


def with_candidate(r: SearchResult, m: PlanMetrics, margin_high: float, space: SearchSpace, model: ModelArch,
                   predictor: StagePredictor) -> SearchResult:
    """`r` with one more kept candidate `m` — the best plan of a space the batched search does not cover (replica
    groups, a data-parallel degree per stage), its smallest margin at the upper bound `margin_high` — and the pick
    rule applied again to them all (`with_candidates`)."""
    return with_candidates(r, [m], {plan_key(m): margin_high}, space, model, predictor)


def with_candidates(r: SearchResult, ms: list[PlanMetrics], margins_high: dict, space: SearchSpace, model: ModelArch,
                    predictor: StagePredictor, *, safe: list[PlanMetrics] | None = None) -> SearchResult:
    """`r` with more kept candidates `ms` from other searches (their Φ on `r`'s medians, `phi_on`; upper-bound
    margins by plan key in `margins_high`): every one of them kept (`apply_pick` reduces the kept plans to their
    front), in the top-k by Φ and by time where they rank, in the safe set (`safe` when given: those of `ms` another
    search found safe; else all of `ms`), and the pick rule applied again to them all (`apply_pick`): the pick obeys
    the configured rule whichever space it comes from and is never a plan another kept plan dominates."""
    ms = [phi_on(m, r, space) for m in ms]
    on_r = {plan_key(m): m for m in ms}
    safe = ms if safe is None else [on_r.get(plan_key(m), m) for m in safe]
    k, k_time = max(len(r.top), 1), max(len(r.top_time), 1)
    merged = dataclasses.replace(
        r, top=unique(sorted([*r.top, *ms], key=lambda c: c.phi if c.phi is not None else float("inf")))[:k],
        top_time=unique(sorted([*r.top_time, *ms], key=lambda c: c.iteration_time_ms))[:k_time],
        pareto=unique([*r.pareto, *ms]), safe=unique([*r.safe, *safe]), margins_high={**r.margins_high, **margins_high})
    return apply_pick(merged, space, model, predictor)


def phi_on(m: PlanMetrics, r: SearchResult, space: SearchSpace) -> PlanMetrics:
    """`m` with its Φ on `r`'s medians and weights (paper §3.1.2): a plan from another space ranked on the same scale
    as `r`'s plans."""
    return dataclasses.replace(m, phi=float(phi(m.iteration_time_ms, m.max_mem_mib, m.mem_variance_mib2, refs=r.refs,
                                                weights=r.weights, epsilon_mib2=space.epsilon_mib2)))
