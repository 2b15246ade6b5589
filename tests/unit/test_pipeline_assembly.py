"""The 1F1B assembly's steady state (issues #22, #27): `pipeline_assembly: cycle-mean` (memx.planner.schedule
.steady_period_ms, the maximum cycle mean of the schedule's timed event graph) against the deterministic
event-driven 1F1B of the virtual cluster (memx.simulator.schedule.run_1f1b, no noise), and against the paper's
formula (§3.1.2), which stays available exactly as published."""

from __future__ import annotations

import numpy as np
import pytest

from memx.planner.schedule import (
    AssemblyCalibration,
    Pipeline,
    assemble_columns,
    assembly_of,
    iteration_time_ms,
    steady_loop_ms,
    steady_period_ms,
)
from memx.simulator.schedule import run_1f1b

FWD = 1.0 / 3.0  # forward share of a stage's fwd + bwd


def _simulated_ms(t: np.ndarray, p2p: np.ndarray, m: int) -> float:
    fin, _ = run_1f1b([[x * FWD] * m for x in t], [[x * (1 - FWD)] * m for x in t], list(p2p))
    return max(fin)


def _assembled_ms(t: np.ndarray, p2p: np.ndarray, m: int, cycle_mean: bool) -> float:
    loop = (2 * p2p)[:, None] if cycle_mean else None
    return float(iteration_time_ms(t[:, None], m, 2 * p2p.sum(), np.zeros((len(t), 1)), loop)[0])


def test_two_adjacent_bottlenecks_run_at_the_cycle_mean_not_the_slowest_stage():
    """Two adjacent stages of 210 and 212 ms with 4 ms of p2p between them: the simulator's iteration grows by
    (210 + 212 + 2·4) / 2 = 215 ms per micro batch, which the cycle-mean assembly has and the paper's (212) misses."""
    t, p2p = np.array([100.0, 210.0, 212.0, 100.0]), np.array([1.0, 4.0, 1.0])
    sim_slope = (_simulated_ms(t, p2p, 64) - _simulated_ms(t, p2p, 32)) / 32
    assert sim_slope == pytest.approx(215.0, abs=1e-9)
    for cycle_mean, slope in ((True, 215.0), (False, 212.0)):
        got = (_assembled_ms(t, p2p, 64, cycle_mean) - _assembled_ms(t, p2p, 32, cycle_mean)) / 32
        assert got == pytest.approx(slope, abs=1e-9)
    # at m = 64 the cycle mean's error is its fill/drain overestimate only; the paper's grows with m
    sim = _simulated_ms(t, p2p, 64)
    assert abs(_assembled_ms(t, p2p, 64, True) / sim - 1) < abs(_assembled_ms(t, p2p, 64, False) / sim - 1)


def test_uniform_stages_without_p2p_equal_the_paper_bit_for_bit():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        t = np.repeat(rng.uniform(50, 300, (1, 7)).astype(dtype), 6, axis=0)  # 6 equal stages, 7 plans
        assert np.array_equal(steady_period_ms(t, np.zeros((5, 1), dtype=dtype)), t.max(axis=0))
    t = np.full((4, 1), 200.0)
    same = _assembled_ms(t[:, 0], np.zeros(3), 16, True)
    assert same == _assembled_ms(t[:, 0], np.zeros(3), 16, False)
    assert same == pytest.approx(_simulated_ms(t[:, 0], np.zeros(3), 16), rel=1e-12)  # the simulator's fwd/bwd split


def test_the_cycle_mean_is_never_below_the_slowest_stage():
    """So the paper's T is a lower bound of the cycle mean's: the branch-and-bound's bounds stay valid."""
    rng = np.random.default_rng(1)
    t, loop = rng.uniform(1, 300, (6, 500)).astype(np.float32), rng.uniform(0, 40, (5, 500)).astype(np.float32)
    assert np.all(steady_period_ms(t, loop) >= t.max(axis=0))


def test_a_column_scores_the_same_in_any_batch_and_on_either_path():
    """assemble_columns (many layouts: the search's StackedTables) and Pipeline.assemble (one layout:
    LayoutTables, estimate_plans) give bit-identical T for a column, whatever else the batch holds."""
    rng = np.random.default_rng(2)
    f32 = np.float32
    pp, n = 4, 9
    t, mib, tail = (rng.uniform(10, 300, (pp, n)).astype(f32) for _ in range(3))
    p2p = np.array([0.7, 3.4, 12.0])
    pipe = Pipeline(micro_batches=8, p2p_total_ms=float(2 * p2p.sum()), gpu_weight=np.ones(pp),
                    capacity_mib=np.full(pp, 8e4), memory_bandwidth_gbps=np.full(pp, 2e3), dp=1, dp_gbps=np.ones(pp),
                    boundary_p2p_ms=p2p, assembly=AssemblyCalibration(pipeline_assembly="cycle-mean", comm_scale=1.3))
    one, _ = pipe.assemble(t, mib, tail)
    w, inv = np.full((pp, n), 0.25, dtype=f32), np.full((pp, n), 1 / 8e4, dtype=f32)
    cols = dict(micro_batches=np.full(n, 8, dtype=f32), virtual_stages=np.ones(n, dtype=f32),
                fixed_ms=np.full(n, pipe.fixed_ms, dtype=f32), w=w, inv_cap=inv)
    many, _ = assemble_columns(t, mib, tail, loop_ms=np.repeat(pipe.loop_ms(f32), n, axis=1), **cols)
    assert np.array_equal(one, many)
    sub = [3, 0]
    part, _ = assemble_columns(t[:, sub], mib[:, sub], tail[:, sub], loop_ms=np.repeat(pipe.loop_ms(f32), 2, axis=1),
                               **{k: v[..., sub] for k, v in cols.items()})
    assert np.array_equal(part, many[sub])
    paper, _ = Pipeline(**{**pipe.__dict__, "assembly": AssemblyCalibration(comm_scale=1.3, pipeline_assembly="paper")}).assemble(
        t, mib, tail)
    assert np.all(one >= paper) and np.any(one > paper)


def test_the_option_travels_with_the_assembly_and_stays_off_for_interleaved():
    cal = AssemblyCalibration(comm_scale=2.0, pipeline_assembly="paper")

    class Calibrated:
        assembly = cal

    got = assembly_of(Calibrated(), "cycle-mean")
    assert got.comm_scale == 2.0 and got.pipeline_assembly == "cycle-mean"
    assert assembly_of(Calibrated()) is cal
    with pytest.raises(ValueError, match="allowed: paper, cycle-mean"):
        assembly_of(Calibrated(), "dag")
    assert steady_loop_ms(cal, np.ones(3)) is None
    assert np.array_equal(steady_loop_ms(got, np.array([1.0, 2.0])), [[4.0], [8.0]])  # 2·c·p2p
    inter = Pipeline(micro_batches=8, p2p_total_ms=0.0, gpu_weight=np.ones(2), capacity_mib=np.ones(2),
                     memory_bandwidth_gbps=np.ones(2), dp=1, dp_gbps=np.ones(2), virtual_stages=2,
                     boundary_p2p_ms=np.ones(1), assembly=got)
    assert inter.loop_ms() is None


def test_search_estimate_and_calibration_assemble_alike():
    """A cycle-mean search's pick scores the same through estimate_plans (what `memx inspect` / `--check`
    report); the calibration's fit assembles as the estimates it fits (calibrated_times = calibrated_estimates)."""
    from memx.learn.calibration import PlanCalibration, calibrated_estimates, calibrated_times
    from memx.planner.estimate import estimate_plans
    from tests.support.assembly import searched_and_estimated

    cluster, model, pred, chosen, again, plans = searched_and_estimated("cycle-mean")
    assert chosen.iteration_time_ms == pytest.approx(again.iteration_time_ms, rel=1e-5)
    assert again.loop_p2p_ms and len(again.loop_p2p_ms) == chosen.plan.pp - 1
    planted = PlanCalibration(comm_scale=1.4, overhead_ms=30.0, p2p_per_transfer_ms=2.0, time_scale={"h100-80g": 1.3},
                              pipeline_assembly="cycle-mean")
    base = estimate_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly="cycle-mean")
    truth = calibrated_estimates(plans, cluster, model, pred, planted)
    assert calibrated_times(base, planted) == pytest.approx([e.iteration_time_ms for e in truth], rel=1e-9)
    paper = estimate_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly="paper")
    assert all(c.iteration_time_ms >= p.iteration_time_ms for c, p in zip(base, paper))
    # `memx inspect`, `--check` and `memx evaluate` estimate through estimate_any_plans with the space's assembly
    from memx.planner.replicas import estimate_any_plans

    for rule, want in (("paper", paper), ("cycle-mean", base)):
        got = estimate_any_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly=rule)
        assert [g.iteration_time_ms for g in got] == [w.iteration_time_ms for w in want]
    assert any(c.iteration_time_ms > p.iteration_time_ms for c, p in zip(base, paper))
