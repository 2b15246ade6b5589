"""Plan calibration from measured plans (issue #16): identity without plans, recovers planted
corrections, and cuts the closed form's error on held-out plans of the virtual cluster."""

from __future__ import annotations

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.learn.calibration import PlanCalibration, calibrated_estimates, fit_plan_calibration, fit_from_config_runs
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.simulator import draw_plans, sample_plans, simulate_plan


@pytest.fixture(scope="module")
def setting():
    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    plans = draw_plans(cluster, model, load_search("default"), n=160, seed=7)
    runs = [simulate_plan(p, cluster, model, seed=700_021 + i) for i, p in enumerate(plans)]
    ran = [(p, r) for p, r in zip(plans, runs) if not r.oom]
    return cluster, model, pred, ran


def test_no_plans_is_identity(setting):
    cluster, model, pred, ran = setting
    cal = fit_plan_calibration([], [], [], cluster, model, pred)
    assert cal.is_identity and cal == PlanCalibration()
    plans = [p for p, _ in ran[:5]]
    base = estimate_plans(plans, cluster, model, pred)
    same = calibrated_estimates(plans, cluster, model, pred, cal)
    assert [e.iteration_time_ms for e in same] == [e.iteration_time_ms for e in base]
    assert [e.peak_mem_mib for e in same] == [e.peak_mem_mib for e in base]


def test_recovers_planted_corrections(setting):
    cluster, model, pred, ran = setting
    plans = [p for p, _ in ran[:30]]
    types = sorted({st.gpu for p in plans for st in p.stages})
    planted = PlanCalibration(time_scale={g: 1.0 + 0.3 * i for i, g in enumerate(types)}, comm_scale=1.5,
                              overhead_ms=400.0, mem_scale={g: 1.2 for g in types},
                              mem_offset_mib={g: 300.0 for g in types})
    truth = calibrated_estimates(plans, cluster, model, pred, planted)
    cal = fit_plan_calibration(plans, [e.iteration_time_ms for e in truth], [e.peak_mem_mib for e in truth],
                          cluster, model, pred, time_ridge=1e-6, mem_ridge=1e-6, guard=False)
    for g in types:
        assert cal.time_scale[g] == pytest.approx(planted.time_scale[g], rel=0.05)
        assert cal.mem_scale[g] == pytest.approx(1.2, rel=0.02)
        assert cal.mem_offset_mib[g] == pytest.approx(300.0, abs=30.0)
    assert cal.overhead_ms == pytest.approx(400.0, rel=0.25)
    assert cal.plans_timed == 30 and cal.plans_with_peaks == 30


def test_ridge_keeps_few_plans_near_identity(setting):
    cluster, model, pred, ran = setting
    plans = [p for p, _ in ran[:1]]
    est = estimate_plans(plans, cluster, model, pred)
    cal = fit_plan_calibration(plans, [3.0 * est[0].iteration_time_ms], [None], cluster, model, pred, guard=False)
    a = list(cal.time_scale.values())
    assert a
    assert all(1.0 < x < 3.0 for x in a)  # pulled toward the measurement, held back by the prior
    assert cal.mem_scale == {} and cal.plans_with_peaks == 0
    guarded = fit_plan_calibration(plans, [3.0 * est[0].iteration_time_ms], [None], cluster, model, pred)
    assert guarded.is_identity and guarded.time_guard.folds == 0  # one plan: nothing to cross-validate on


def test_twenty_plans_halve_the_held_out_error(setting):
    cluster, model, pred, ran = setting
    test, pool = ran[:30], ran[30:50]
    assert len(pool) == 20

    def mape(cal):
        est = calibrated_estimates([p for p, _ in test], cluster, model, pred, cal)
        return np.mean([abs(e.iteration_time_ms - r.iteration_time_ms) / r.iteration_time_ms
                        for e, (_, r) in zip(est, test)])

    cal = fit_plan_calibration([p for p, _ in pool], [r.iteration_time_ms for _, r in pool],
                          [r.peak_mem_mib for _, r in pool], cluster, model, pred)
    before, after = mape(PlanCalibration()), mape(cal)
    assert before > 0.3  # the flat closed form is far off on three vendors
    assert after < 0.5 * before


def test_fit_from_config_runs_and_bad_columns():
    cluster, model = load_cluster("v100-t4-6"), load_model("llama-6l")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    runs = sample_plans(cluster, model, load_search("default"), n=12, seed=3)
    cal = fit_from_config_runs(runs, cluster, model, pred)
    assert cal.plans_timed == int((~runs["oom"].astype(bool)).sum()) > 0
    assert set(cal.time_scale) <= {g.name for g in cluster.gpu_types}
    with pytest.raises(InputError, match="iteration_time_ms"):
        fit_from_config_runs(runs.drop(columns=["iteration_time_ms"]), cluster, model, pred)
