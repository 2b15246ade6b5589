"""`pipeline_assembly: cycle-mean-drain` (issue #27, memx.planner.drain): each stage's tail from its own last
backward, T = (m − 1)·c* + Σ t + fixed + max_s (tail_s − D_s), D_s = Σ_{s'<s} (2/3·t_{s'} + p2p_{s'})."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memx.planner.drain import drained_tail_ms, drained_tail_py
from memx.planner.schedule import AssemblyCalibration, assemble_columns, iteration_time_ms
from memx.simulator.schedule import run_1f1b


def test_hand_computed_three_stages():
    """t = 30, 60, 90 ms, p2p 2 and 3 ms (loop 2·p2p = 4, 6), tails 10, 50, 100: D = 0, 20 + 2, 22 + 40 + 3 =
    0, 22, 65; max(10, 50 − 22, 100 − 65) = 35 against max tail 100, so T drops by 65 ms."""
    t, tail, loop = np.array([[30.0], [60.0], [90.0]]), np.array([[10.0], [50.0], [100.0]]), np.array([[4.0], [6.0]])
    assert drained_tail_ms(t, tail, loop)[0] == 35.0
    assert drained_tail_py([30.0, 60.0, 90.0], [10.0, 50.0, 100.0], loop) == 35.0
    cm = iteration_time_ms(t, 4, 5.0, tail, loop)[0]
    dr = iteration_time_ms(t, 4, 5.0, tail, loop, drain=True)[0]
    assert cm - dr == 65.0


def test_equals_cycle_mean_at_one_stage():
    t, tail = np.array([[40.0, 7.0]]), np.array([[3.0, 9.0]])
    assert np.array_equal(iteration_time_ms(t, 8, 1.0, tail, None, drain=True), iteration_time_ms(t, 8, 1.0, tail))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda pp: st.tuples(
    st.lists(st.floats(0.0, 500.0), min_size=pp, max_size=pp), st.lists(st.floats(0.0, 500.0), min_size=pp, max_size=pp),
    st.lists(st.floats(0.0, 20.0), min_size=pp - 1, max_size=pp - 1), st.integers(1, 16))))
def test_never_above_cycle_mean_and_at_least_stage_0s_tail(case):
    t, tail, p2p, m = case
    T, tl = np.array(t)[:, None], np.array(tail)[:, None]
    loop = 2.0 * np.array(p2p).reshape(-1, 1) if p2p else None
    dr = iteration_time_ms(T, m, 2.0, tl, loop, drain=True)[0]
    assert dr <= iteration_time_ms(T, m, 2.0, tl, loop)[0]
    assert drained_tail_ms(T, tl, loop)[0] >= tail[0]
    assert np.isclose(drained_tail_ms(T, tl, loop)[0], drained_tail_py(t, tail, loop))


def test_matches_the_event_driven_1f1b_with_each_stage_reducing_at_its_own_end():
    """The virtual cluster's 1F1B (forward : backward = 1 : 2, no noise) with each stage's tail after its own
    last backward (memx.simulator.schedule.simulate_plan) ends closer to the drained assembly than to the cycle
    mean's (the closed form's fill / drain stays approximate: within 2 % here, the cycle mean 10 % above)."""
    t, p2p, tail = np.array([50.0, 80.0, 60.0, 70.0]), np.array([3.0, 1.0, 2.0]), np.array([20.0, 90.0, 150.0, 200.0])
    m = 16
    fin, _ = run_1f1b([[x / 3] * m for x in t], [[x * 2 / 3] * m for x in t], list(p2p))
    sim = max(f + tl for f, tl in zip(fin, tail))
    got = iteration_time_ms(t[:, None], m, float(2 * p2p.sum()), tail[:, None], 2 * p2p[:, None], drain=True)[0]
    cm = iteration_time_ms(t[:, None], m, float(2 * p2p.sum()), tail[:, None], 2 * p2p[:, None])[0]
    assert abs(got - sim) / sim < 0.02 and abs(got - sim) < abs(cm - sim)


def test_assemble_columns_drains_only_the_flagged_plain_columns():
    t = np.array([[30.0, 30.0, 30.0], [60.0, 60.0, 60.0]], dtype=np.float32)
    tail = np.array([[1.0, 1.0, 1.0], [80.0, 80.0, 80.0]], dtype=np.float32)
    kw = dict(micro_batches=np.float32([4, 4, 4]), virtual_stages=np.float32([1, 1, 2]), fixed_ms=np.float32([0, 0, 0]),
              w=np.full((2, 3), 0.5, np.float32), inv_cap=np.ones((2, 3), np.float32), loop_ms=np.zeros((1, 3), np.float32))
    base, _ = assemble_columns(t, t, tail, **kw)
    got, _ = assemble_columns(t, t, tail, drain=np.array([True, False, True]), **kw)
    assert got[0] == base[0] - 20.0 and got[1] == base[1] and got[2] == base[2]
    assert AssemblyCalibration(pipeline_assembly="cycle-mean-drain").pipeline_assembly == "cycle-mean-drain"


def test_a_drained_search_pick_scores_the_same_through_estimate_plans():
    """The search's pick under cycle-mean-drain scores as estimate_plans / estimate_any_plans (what `memx inspect`,
    `--check` and `memx evaluate` use) score it, and no drawn plan scores above its cycle-mean estimate."""
    import pytest

    from memx.planner.estimate import estimate_plans
    from memx.planner.replicas import estimate_any_plans
    from tests.support.assembly import searched_and_estimated

    cluster, model, pred, chosen, again, plans = searched_and_estimated("cycle-mean-drain")
    assert chosen.iteration_time_ms == pytest.approx(again.iteration_time_ms, rel=1e-5)
    drained = estimate_any_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly="cycle-mean-drain")
    base = estimate_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly="cycle-mean")
    assert all(d.iteration_time_ms <= c.iteration_time_ms for d, c in zip(drained, base))
    assert any(d.iteration_time_ms < c.iteration_time_ms for d, c in zip(drained, base))
