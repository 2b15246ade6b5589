"""The pick (memx.planner.pick): dominance and the margin floor on hand-built candidates, and the
search's JSON carrying the rule, the warnings and the (T, margin, V) front."""

from __future__ import annotations

import pytest

from memx.domain.plan import Plan, Stage
from memx.planner.metrics import PlanMetrics
from memx.planner.pick import choose, dominates, pareto_margin


def cand(i: int, t: float, margin: float, phi: float, var: float = 1.0e6) -> PlanMetrics:
    """A plan distinguished by its layer split (i); 40 GiB capacity; peak from the margin."""
    plan = Plan(model="m", cluster="c", global_batch=8, micro_batch=1, seq_len=128, dp=1,
                stages=(Stage(gpu="g", tp=1, layers=i), Stage(gpu="g", tp=1, layers=20 - i)))
    cap = 40960.0
    peak = cap * (1 - margin)
    return PlanMetrics(plan=plan, iteration_time_ms=t, stage_time_ms=(t / 2, t / 2), stage_peak_mib=(peak, peak),
                       peak_mem_mib=(peak, peak), capacity_mib=(cap, cap), max_mem_mib=peak, mem_variance_mib2=var,
                       min_margin=margin, feasible=True, phi=phi)


# The case (a100+h20, llama2-13b): Φ picks 31.6 s at 2.7 % over 30.6 s at 31 %.
PHI_PICK = cand(1, 31_600, 0.027, 0.90)
FASTEST = cand(2, 30_600, 0.31, 0.95)
SLOW_SAFE = cand(3, 40_000, 0.45, 0.97)


def test_dominates_needs_strictly_better_on_one():
    assert dominates(FASTEST, PHI_PICK, lambda m: m.min_margin)
    assert not dominates(PHI_PICK, FASTEST, lambda m: m.min_margin)
    twin = cand(4, 30_600, 0.31, 0.99)
    assert not dominates(twin, FASTEST, lambda m: m.min_margin)  # equal on both: no dominance


def test_paper_phi_keeps_a_dominated_pick_but_warns():
    p = choose([PHI_PICK, FASTEST, SLOW_SAFE], [FASTEST], rule="phi", margin_floor=0.10)
    assert p.plan is PHI_PICK
    assert any("dominated" in w for w in p.warnings) and any("below the floor 10%" in w for w in p.warnings)


def test_phi_bounded_never_picks_a_dominated_plan():
    p = choose([PHI_PICK, FASTEST, SLOW_SAFE], [], rule="phi-bounded", margin_floor=0.0)
    assert p.plan is FASTEST and p.replaced is PHI_PICK and p.warnings == ()


def test_phi_bounded_takes_the_best_phi_above_the_floor():
    a = cand(5, 30_000, 0.05, 0.80)  # best Φ, fastest, but below the floor and dominated by nothing
    b = cand(6, 31_000, 0.20, 0.85)
    c = cand(7, 32_000, 0.30, 0.95)
    p = choose([a, b, c], [], rule="phi-bounded", margin_floor=0.10)
    assert p.plan is b and p.warnings == ()
    # the same with the floor off: Φ's own choice, which nothing dominates
    assert choose([a, b, c], [], rule="phi-bounded", margin_floor=0.0).plan is a


def test_phi_bounded_respects_the_time_window():
    a = cand(5, 30_000, 0.12, 0.95)
    b = cand(6, 40_000, 0.40, 0.50)  # 1.33 × the fastest: outside a 1.25 window
    assert choose([b, a], [], rule="phi-bounded", margin_floor=0.10, max_time_ratio=1.25).plan is a


def test_fastest_above_floor():
    a = cand(5, 30_000, 0.05, 0.80)
    b = cand(6, 31_000, 0.11, 0.85)
    c = cand(7, 31_000, 0.15, 0.95)  # ties b on time with a larger margin
    assert choose([a], [b, c], rule="fastest-above-floor", margin_floor=0.10).plan is c


@pytest.mark.parametrize("rule", ["phi", "phi-bounded", "fastest-above-floor"])
def test_no_plan_clears_the_floor_says_so(rule):
    a, b = cand(5, 30_000, 0.03, 0.80), cand(6, 31_000, 0.06, 0.85)
    p = choose([a, b], [], rule=rule, margin_floor=0.10)
    assert any("10%" in w for w in p.warnings)
    assert p.plan is (b if rule == "fastest-above-floor" else a)  # largest margin / best Φ below the floor


def test_upper_bound_margins_decide_the_floor():
    a, b = cand(5, 30_000, 0.12, 0.80), cand(6, 31_000, 0.30, 0.85)
    high = {a.plan.stages: 0.08, b.plan.stages: 0.25}
    p = choose([a, b], [], rule="fastest-above-floor", margin_floor=0.10, margin=lambda m: high[m.plan.stages])
    assert p.plan is b


def test_balanced_front_takes_least_phi_among_undominated_plans_within_the_tolerance():
    a = cand(5, 30_000, 0.30, 0.90)  # the fastest plan above the floor
    b = cand(6, 30_300, 0.20, 0.80)  # least Φ within 2 %, but a is faster and roomier: dominated
    c = cand(7, 30_500, 0.35, 0.85)  # least Φ on the (time, margin) front within 2 %
    e = cand(8, 30_550, 0.50, 0.95)  # the largest margin within 2 %
    d = cand(9, 31_000, 0.40, 0.70)  # least Φ overall, 3.3 % slower: outside the tolerance
    kw = dict(margin_floor=0.10, balance_tolerance=0.02)
    picks = {r: choose([d, b, c, a, e], [], rule=r, **kw).plan
             for r in ("fastest-above-floor", "balanced-phi", "balanced-margin", "balanced-front")}
    assert picks == {"fastest-above-floor": a, "balanced-phi": b, "balanced-margin": e, "balanced-front": c}
    # below the floor b and c drop out; nothing clears it: as every floor rule, the widest plan with a warning
    assert choose([d, b, c, a, e], [], rule="balanced-front", margin_floor=0.36, balance_tolerance=0.02).plan is e
    none = choose([a, b], [], rule="balanced-front", margin_floor=0.6)
    assert none.plan is a and "no plan clears the margin floor 60%" in none.warnings[0]


def test_unknown_rule():
    with pytest.raises(ValueError, match="allowed values"):
        choose([FASTEST], [], rule="best", margin_floor=0.1)


def test_pareto_on_time_margin_and_variance():
    low_var = cand(8, 35_000, 0.20, 1.0, var=1.0)  # slower and tighter than SLOW_SAFE? no: faster, tighter, steadier
    front = pareto_margin([PHI_PICK, FASTEST, SLOW_SAFE, low_var])
    assert [c.iteration_time_ms for c in front] == [30_600, 35_000, 40_000]  # PHI_PICK is dominated by FASTEST
