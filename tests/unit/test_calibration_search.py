"""A plan calibration inside the search (issue #16): the leave-one-out guard keeps it only where it
helps, the search and estimate_plans score through one calibrated assembly, and on the virtual
cluster's three-vendor setting the calibrated search picks a faster plan whose predicted time is right."""

from __future__ import annotations

import random

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.learn import fit_predictor
from memx.learn.calibration import PlanCalibration, calibration_from_dict, fit_plan_calibration
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.search import search
from memx.simulator import draw_plans, measure_stages, simulate_plan, stage_signatures


@pytest.fixture(scope="module")
def setting():
    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    flat = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    plans = draw_plans(cluster, model, load_search("default"), n=160, seed=7)
    runs = [simulate_plan(p, cluster, model, seed=700_021 + i) for i, p in enumerate(plans)]
    ran = [(p, r) for p, r in zip(plans, runs) if not r.oom]
    return cluster, model, flat, ran[30:50], ran[50:]


def _fit(setting, pred, **kw) -> PlanCalibration:
    cluster, model, _, measured, _ = setting
    return fit_plan_calibration([p for p, _ in measured], [r.iteration_time_ms for _, r in measured],
                                [r.peak_mem_mib for _, r in measured], cluster, model, pred, **kw)


def test_guard_accepts_on_the_flat_closed_form(setting):
    cal = _fit(setting, setting[2])
    assert len(setting[3]) == 20
    assert cal.time_guard.folds == 20 and cal.time_guard.accepted and cal.mem_guard.accepted
    assert cal.time_guard.base_mape > 0.3 and cal.time_guard.cv_mape < 0.5 * cal.time_guard.base_mape
    assert cal.plans_timed == 20 and not cal.is_identity
    assert "calibrated on 20 measured plans" in cal.summary()
    assert calibration_from_dict(cal.to_dict()) == cal


def test_guard_rejects_on_an_accurate_learned_predictor(setting):
    cluster, model, _, _, rest = setting
    sigs = list({str(d): d for d in (s.to_dict() for p, _ in rest for s in stage_signatures(p, model))}.values())
    learned = fit_predictor(measure_stages(random.Random(7).sample(sigs, min(60, len(sigs))), seed=7, gpus=cluster),
                            {g.name: g for g in cluster.gpu_types}, seed=7)
    raw, cal = _fit(setting, learned, guard=False), _fit(setting, learned)
    assert not raw.is_identity  # unguarded, the fit moves ...
    assert cal.time_guard.base_mape < 0.05  # ... on a predictor already within 5 %,
    assert not cal.time_guard.accepted and cal.time_guard.cv_mape >= cal.time_guard.base_mape  # which LOO exposes
    assert cal.time_scale == {} and cal.comm_scale == 1.0 and cal.overhead_ms == 0.0
    assert not cal.mem_guard.accepted and cal.is_identity and cal.wrap(learned) is learned
    assert "time: kept uncalibrated" in cal.summary()


def test_search_uses_the_calibrated_assembly_and_picks_better(setting):
    cluster, model, flat, _, _ = setting
    space = load_search("default")
    cal = _fit(setting, flat)
    assert cal.overhead_ms != 0.0 and cal.comm_scale != 1.0
    plain, calibrated = search(cluster, model, space, flat).chosen, search(cluster, model, space, cal.wrap(flat)).chosen
    # One path: the search's calibrated T (c and o included) is what estimate_plans gives the pick.
    again = estimate_plans([calibrated.plan], cluster, model, cal.wrap(flat))[0]
    assert calibrated.iteration_time_ms == pytest.approx(again.iteration_time_ms, rel=1e-5)
    assert calibrated.plan != plain.plan
    t_plain = simulate_plan(plain.plan, cluster, model, seed=1).iteration_time_ms
    t_cal = simulate_plan(calibrated.plan, cluster, model, seed=1).iteration_time_ms
    assert t_cal < 0.9 * t_plain  # measured on the virtual cluster: the calibrated pick is faster
    assert abs(calibrated.iteration_time_ms / t_cal - 1) < 0.5 * abs(plain.iteration_time_ms / t_plain - 1)


def test_identity_assembly_changes_nothing(setting):
    cluster, model, flat, measured, _ = setting
    plans = [p for p, _ in measured[:5]]
    planted = PlanCalibration(comm_scale=2.0, overhead_ms=250.0)
    base = estimate_plans(plans, cluster, model, flat)
    assert PlanCalibration().wrap(flat) is flat
    moved = estimate_plans(plans, cluster, model, planted.wrap(flat))
    for b, m in zip(base, moved):
        s = (b.plan.micro_batches - 1) * max(b.stage_time_ms) + sum(b.stage_time_ms)
        assert m.iteration_time_ms == pytest.approx(s + 2.0 * (b.iteration_time_ms - s) + 250.0, rel=1e-9)
