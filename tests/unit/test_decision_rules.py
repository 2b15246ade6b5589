"""bench/decision_rules.py (issue #22): the candidate pick rules on a hand-built population, and the
decision-quality judge of a world measured for the picks only (bench/decision_quality.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from memx.domain.catalog import load_search
from memx.domain.specs import Weights
from memx.planner.pick import choose
from tests.unit.test_pick import cand

W = Weights(profile="default", w_time=0.5, w_mem=0.25, w_var=0.25)


def population():
    """Four safe plans within 2 % of the fastest: a is fastest, b as fast within 1 % and wider, c is what a
    dominates on (time, margin), d is wider than b and slower than the window."""
    pool = [cand(1, 10_000, 0.20, 0.50), cand(2, 10_080, 0.30, 0.40), cand(3, 10_150, 0.19, 0.30),
            cand(4, 10_500, 0.45, 0.20)]
    high = np.array([1.10, 1.02, 1.00, 1.00])  # a's upper-bound time 11,000 ms, b's 10,282 ms
    return {"pool": pool, "time_factor": {"low": np.full(4, 0.99), "high": high}, "info": {"weights": W}}


def test_candidates_follow_the_planner_and_the_intervals():
    from bench.decision_rules import candidates

    sp = load_search("default")
    d = population()
    picks = candidates(d, sp)
    want = choose(d["pool"][:1], d["pool"][1:], rule="balanced-front", margin_floor=sp.margin_floor,
                  balance_tolerance=sp.balance_tolerance).plan
    assert d["pool"][picks["balanced-front"]] is want is d["pool"][1]  # least Φ on the front (c is dominated)
    assert picks["fastest-above-floor"] == 0 and picks["balanced-margin"] == 1
    assert picks["front: least T_high"] == 1  # a's upper bound 11,000 ms > b's 10,282 ms
    # with the intervals, a no longer sets c aside (a's upper bound is not below c's lower bound): least Φ is c
    assert picks["interval front: least Φ"] == 2


def test_upper_bound_margins_decide_the_floor():
    from bench.decision_rules import candidates

    sp = load_search("default")
    d = population()
    d["pool"][1] = dataclasses.replace(d["pool"][1], min_margin_high=0.05)  # b below the floor at its upper bound
    assert candidates(d, sp)["balanced-front"] != 1


def test_judge_of_a_world_measured_for_the_picks_only():
    from bench.decision_quality import _cell, judge

    x = np.array([[100.0, 0.3, 1.0, 1.0], [np.nan, np.nan, np.nan, np.nan], [101.0, 0.2, 1.0, 1.0]])
    full = judge(x, 2, 0.1, 0.02, W, 1.0)
    assert full["ratio"] == 1.01 and full["dominated"] and full["rank"] == 2
    alone = judge(x, 2, 0.1, 0.02, W, 1.0, alone=True)
    assert np.isnan(alone["ratio"]) and not alone["dominated"] and _cell(alone) == "20.0% (picks only)"
