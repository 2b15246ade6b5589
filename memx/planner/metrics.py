"""PlanMetrics: what the planner predicts for one plan — the one type the search's candidates,
`estimate_plans`, the baselines, `--check`, `memx evaluate`, the experiments and the reports share.

A schema-2 plan (replica groups, memx.domain.groups) has one PlanMetrics too: its per-stage and
per-GPU columns are the groups' concatenated in group order, `groups` holds each group's own
metrics and `cross_sync_ms` the cross-group gradient term (memx.planner.replicas; issue #15)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memx.domain.groups import AnyPlan
from memx.domain.plan import Plan
from memx.domain.stage_dp import has_stage_dp, stage_groups
from memx.planner.schedule import MemoryStats


@dataclass(frozen=True, kw_only=True)
class PlanMetrics:
    plan: AnyPlan
    iteration_time_ms: float
    stage_time_ms: tuple[float, ...]  # per stage: one micro batch, forward + backward (schema 2: groups in order)
    stage_peak_mib: tuple[float, ...]  # per stage
    peak_mem_mib: tuple[float, ...]  # per GPU: (group,) replica-major, then stage, then tp rank
    capacity_mib: tuple[float, ...]  # per stage
    max_mem_mib: float  # M
    mem_variance_mib2: float  # V
    min_margin: float  # smallest (capacity − peak) / capacity over GPUs
    feasible: bool  # every GPU's peak ≤ capacity − reserve
    phi: float | None = None  # Φ against the search's medians; None where the plan was not scored
    groups: tuple[PlanMetrics, ...] = ()  # schema 2: each group's own metrics (plan = group_plans(p)[g])
    cross_sync_ms: float = 0.0  # schema 2: cross-group gradient synchronisation, part of iteration_time_ms
    # The smallest margin at the predictor's upper memory bound as the search computed it (issue #22: the
    # keeper's floor margin, memx.planner.candidates.Cand.floor_margin); None: not from a search with intervals.
    min_margin_high: float | None = None
    # Plain 1F1B assembled with the cycle mean (SearchSpace.pipeline_assembly, memx.planner.schedule.steady_loop_ms):
    # one p2p transfer over each stage boundary as the steady-state loops hold it (uncalibrated); () otherwise
    loop_p2p_ms: tuple[float, ...] = ()


def per_gpu_peaks(plan: Plan, stage_peak_mib: Sequence[float]) -> tuple[float, ...]:
    """Every GPU of a stage (its tp ranks, in each of the dp replicas and cp ranks) has the stage's peak. A plan
    with a per-stage dp (memx.domain.stage_dp) has no replicas: stage-major, then its dp_s · cp groups, then tp rank."""
    if has_stage_dp(plan):
        return tuple(float(stage_peak_mib[s]) for s, (st, g) in enumerate(zip(plan.stages, stage_groups(plan)))
                     for _ in range(g * st.tp))
    n_rep = plan.dp * getattr(plan, "context_parallel", 1)  # replica-major, cp ranks within (memx.domain.context_parallel)
    return tuple(float(stage_peak_mib[s]) for _ in range(n_rep) for s, st in enumerate(plan.stages)
                 for _ in range(st.tp))


def plan_metrics(plan: Plan, *, iteration_time_ms, stage_time_ms, stage_peak_mib, capacity_mib, stats: MemoryStats,
                 feasible: bool, phi: float | None = None, min_margin_high: float | None = None,
                 loop_p2p_ms=()) -> PlanMetrics:
    """One plan's metrics from its assembled arrays (scalars or one-element columns)."""
    def one(x) -> float:
        return float(np.asarray(x).reshape(-1)[0])

    return PlanMetrics(
        plan=plan, iteration_time_ms=one(iteration_time_ms), stage_time_ms=tuple(float(x) for x in stage_time_ms),
        stage_peak_mib=tuple(float(x) for x in stage_peak_mib), peak_mem_mib=per_gpu_peaks(plan, stage_peak_mib),
        capacity_mib=tuple(float(c) for c in capacity_mib), max_mem_mib=one(stats.max_mib),
        mem_variance_mib2=one(stats.variance_mib2), min_margin=one(stats.min_margin), feasible=feasible, phi=phi,
        min_margin_high=min_margin_high, loop_p2p_ms=tuple(float(x) for x in loop_p2p_ms))


def corrected_plans(predictor, metrics: list[PlanMetrics]) -> list[PlanMetrics]:
    """Plan-level scores after the predictor's plan-level correction, where it has one (`correct_plans`: a
    calibrated predictor with a plan residual, memx.learn.residual; issue #16); else `metrics` unchanged."""
    fn = getattr(predictor, "correct_plans", None)
    return list(metrics) if fn is None or not metrics else fn(list(metrics))
