"""Plan calibration from measured plans (issue #16): identity without plans, recovers planted
corrections, and cuts the closed form's error on held-out plans of the virtual cluster; the
leave-one-out guard keeps it only where it helps; the search and estimate_plans score through one
calibrated assembly, and on the three-vendor setting the calibrated search picks a faster plan whose
predicted time is right."""

from __future__ import annotations

import dataclasses
import json
import random

import pandas as pd

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError, NothingUsable
from memx.domain.groups import any_plan_to_dict, as_grouped
from memx.domain.plan import plan_from_dict
from memx.learn import fit_predictor
from memx.learn.calibration import (PlanCalibration, calibrated_estimates, calibrated_times, calibration_from_dict,
    fit_from_config_runs, fit_from_estimates, fit_plan_calibration)
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.schedule import blocking_transfers
from memx.planner.search import search
from memx.simulator import draw_plans, measure_stages, sample_plans, simulate_plan, stage_signatures


# The default search narrowed (tp ≤ 2, micro batch ≤ 2, pp ≤ 4): the same claim, a fifth of the search time.
NARROW = dataclasses.replace(load_search("default"), tp_options=(1, 2), micro_batch_options=(1, 2), max_pp=4)

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
    # schema-2 rows (replica groups) are left out: the same calibration with them added, none with only them
    plans = [plan_from_dict(json.loads(p)) for p in runs["plan"]]
    assert any(p.dp > 1 for p in plans)
    as_two = runs.assign(plan=[json.dumps(any_plan_to_dict(_two_groups(p))) for p in plans])
    split = as_two[[p.dp > 1 for p in plans]]
    assert fit_from_config_runs(pd.concat([runs, split], ignore_index=True), cluster, model, pred) == cal
    # a one-group schema-2 plan is its schema-1 plan: the same calibration
    assert fit_from_config_runs(runs.assign(plan=[json.dumps(any_plan_to_dict(as_grouped(p))) for p in plans]),
                                cluster, model, pred) == cal
    with pytest.raises(NothingUsable, match="schema-2 plan"):
        fit_from_config_runs(split, cluster, model, pred)


def _two_groups(plan):
    """`plan` with its dp replicas split into two schema-2 replica groups (one group when dp is 1)."""
    one = as_grouped(plan)
    g = one.groups[0]
    if g.dp == 1:
        return one
    return dataclasses.replace(one, groups=(dataclasses.replace(g, dp=g.dp // 2),
                                            dataclasses.replace(g, dp=g.dp - g.dp // 2)))


def _fit(setting, pred, **kw) -> PlanCalibration:
    cluster, model, _, ran = setting
    measured = ran[30:50]
    return fit_plan_calibration([p for p, _ in measured], [r.iteration_time_ms for _, r in measured],
                                [r.peak_mem_mib for _, r in measured], cluster, model, pred, **kw)


def test_guard_accepts_on_the_flat_closed_form(setting):
    cal = _fit(setting, setting[2])
    assert cal.time_guard.folds == 20 and cal.time_guard.accepted and cal.mem_guard.accepted
    assert cal.time_guard.base_mape > 0.3 and cal.time_guard.cv_mape < 0.5 * cal.time_guard.base_mape
    assert cal.plans_timed == 20 and not cal.is_identity
    assert "calibrated on 20 measured plans" in cal.summary()
    assert calibration_from_dict(cal.to_dict()) == cal


def test_guard_rejects_on_an_accurate_learned_predictor(setting):
    cluster, model, _, ran = setting
    sigs = list({str(d): d for d in (s.to_dict() for p, _ in ran[50:] for s in stage_signatures(p, model))}.values())
    learned = fit_predictor(measure_stages(random.Random(7).sample(sigs, min(60, len(sigs))), seed=7, gpus=cluster),
                            {g.name: g for g in cluster.gpu_types}, seed=7)
    raw, cal = _fit(setting, learned, guard=False), _fit(setting, learned)
    assert not raw.is_identity  # unguarded, the fit moves ...
    assert cal.time_guard.base_mape < 0.05  # ... on a predictor already within 5 %,
    assert not cal.time_guard.accepted and cal.time_guard.cv_mape > 0.9 * cal.time_guard.base_mape  # LOO says so
    assert cal.time_scale == {} and cal.comm_scale == 1.0 and cal.overhead_ms == 0.0
    assert not cal.mem_guard.accepted and cal.is_identity and cal.wrap(learned) is learned
    assert "time: kept uncalibrated" in cal.summary()


@pytest.mark.slow  # 7 s; search and estimate through a calibration stay in the default set via test_search_and_estimate_share_the_per_transfer_cost (make test under 3 min)
def test_search_uses_the_calibrated_assembly_and_picks_better(setting):
    cluster, model, flat, _ = setting
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
    # and its predicted time is closer to its measured one: 13.0 % against 21.9 % (session 11). The bound was 0.5 ×
    # when the default pick rule was phi; the floor rules pick another plan (bisected to bccfac9, the balanced-margin
    # default: 15.3 % against 21.6 % there), and the test had been failing in the slow set since
    assert abs(calibrated.iteration_time_ms / t_cal - 1) < 0.7 * abs(plain.iteration_time_ms / t_plain - 1)


def test_identity_assembly_changes_nothing(setting):
    cluster, model, flat, ran = setting
    plans = [p for p, _ in ran[30:35]]
    planted = PlanCalibration(comm_scale=2.0, overhead_ms=250.0)
    base = estimate_plans(plans, cluster, model, flat)
    assert PlanCalibration().wrap(flat) is flat
    moved = estimate_plans(plans, cluster, model, planted.wrap(flat))
    for b, m in zip(base, moved):
        s = (b.plan.micro_batches - 1) * max(b.stage_time_ms) + sum(b.stage_time_ms)
        assert m.iteration_time_ms == pytest.approx(s + 2.0 * (b.iteration_time_ms - s) + 250.0, rel=1e-9)


def test_blocking_transfers_count_the_1f1b_critical_path():
    assert blocking_transfers(1, 16) == 0  # no pipeline, no p2p
    assert blocking_transfers(2, 1) == 2  # one micro batch: its activation and its gradient
    assert blocking_transfers(4, 8) == 2 * 3 + 2 * 7


def test_per_transfer_cost_and_tp_scales_through_the_one_assembly(setting):
    cluster, model, flat, ran = setting
    plans = [p for p, _ in ran[30:40]]
    assert {p.pp for p in plans} != {1}
    planted = PlanCalibration(p2p_per_transfer_ms=3.0, tp_time_scale={1: 1.25, 2: 0.8}, overhead_ms=50.0)
    base = estimate_plans(plans, cluster, model, flat)
    moved = estimate_plans(plans, cluster, model, planted.wrap(flat))
    for b, m in zip(base, moved):
        k = np.asarray([planted.tp_time_scale.get(st.tp, 1.0) for st in b.plan.stages])
        t, s0 = np.asarray(b.stage_time_ms) * k, (b.plan.micro_batches - 1) * max(b.stage_time_ms) + sum(b.stage_time_ms)
        want = ((b.plan.micro_batches - 1) * t.max() + t.sum() + (b.iteration_time_ms - s0) + 50.0
                + 3.0 * blocking_transfers(b.plan.pp, b.plan.micro_batches))
        assert m.iteration_time_ms == pytest.approx(want, rel=1e-6)
    # from the uncalibrated estimates (plans of several models, bench/vtrain_calibration.py): the same numbers
    assert calibrated_times(base, planted) == pytest.approx([m.iteration_time_ms for m in moved], rel=1e-6)
    assert calibration_from_dict(planted.to_dict()) == planted
    old = {k: v for k, v in planted.to_dict().items() if k not in ("p2p_per_transfer_ms", "tp_time_scale")}
    assert calibration_from_dict(old) == PlanCalibration(overhead_ms=50.0)  # files written before these terms


def test_recovers_a_planted_per_transfer_cost_and_tp_scales(setting):
    cluster, model, flat, ran = setting
    plans = [p for p, _ in ran[:40]]
    tps = sorted({st.tp for p in plans for st in p.stages})
    assert len(tps) > 1
    planted = PlanCalibration(p2p_per_transfer_ms=4.0, tp_time_scale={t: 1.0 + 0.1 * i for i, t in enumerate(tps)})
    truth = calibrated_estimates(plans, cluster, model, flat, planted)
    est = estimate_plans(plans, cluster, model, flat, reserve_gib=0.0)
    cal = fit_from_estimates(est, [e.iteration_time_ms for e in truth], time_ridge=1e-8, guard=False, per_tp=True)
    assert cal.p2p_per_transfer_ms == pytest.approx(4.0, rel=0.1)
    got = calibrated_times(est, cal)
    assert got == pytest.approx([e.iteration_time_ms for e in truth], rel=0.01)
    plain = fit_from_estimates(est, [e.iteration_time_ms for e in truth], time_ridge=1e-8, guard=False)
    assert plain.tp_time_scale == {}  # per-tp scales only when asked for
    assert cal.mem_guard is None and "memory: not calibrated" in fit_from_estimates(est[:5], [1e3] * 5).summary()


def test_recovers_a_planted_per_layer_cost_and_the_estimate_carries_it(setting):
    """e (ms per layer and micro batch on every stage, memx.learn.time_fit): planted, fitted back from the plans'
    times; the wrapped predictor's estimate (what the search scores) equals the fit's own T'; `per_layer=False` keeps
    it at 0."""
    cluster, model, flat, ran = setting
    plans = [p for p, _ in ran[:40]]
    planted = PlanCalibration(layer_overhead_ms=0.8, time_scale={g.name: 1.1 for g in cluster.gpu_types})
    truth = calibrated_estimates(plans, cluster, model, flat, planted)
    est = estimate_plans(plans, cluster, model, flat, reserve_gib=0.0)
    for p, t, e in zip(plans, truth, est):  # every stage pays 0.8 ms per layer, and 1.1 × its time
        want = [1.1 * s + 0.8 * st.layers for s, st in zip(e.stage_time_ms, p.stages)]
        assert list(t.stage_time_ms) == pytest.approx(want, rel=1e-6)
    y = [e.iteration_time_ms for e in truth]
    cal = fit_from_estimates(est, y, time_ridge=1e-8, guard=False, residual=False)  # per_layer: the default
    assert cal.layer_overhead_ms == pytest.approx(0.8, rel=0.1)
    assert calibrated_times(est, cal) == pytest.approx(y, rel=0.01)
    again = calibrated_estimates(plans[:5], cluster, model, flat, cal)
    assert [e.iteration_time_ms for e in again] == pytest.approx(list(calibrated_times(est[:5], cal)), rel=1e-5)
    assert fit_from_estimates(est, y, time_ridge=1e-8, guard=False, residual=False, per_layer=False).layer_overhead_ms == 0.0
    assert calibration_from_dict(cal.to_dict()) == cal
    chosen = search(cluster, model, NARROW, planted.wrap(flat)).chosen  # the search scores stages with e·L_s too
    (scored,) = estimate_plans([chosen.plan], cluster, model, planted.wrap(flat))
    assert chosen.iteration_time_ms == pytest.approx(scored.iteration_time_ms, rel=1e-5)


def test_search_and_estimate_share_the_per_transfer_cost(setting):
    cluster, model, flat, _ = setting
    planted = PlanCalibration(p2p_per_transfer_ms=5.0, tp_time_scale={1: 1.2})
    chosen = search(cluster, model, NARROW, planted.wrap(flat)).chosen
    again = estimate_plans([chosen.plan], cluster, model, planted.wrap(flat))[0]
    plain = estimate_plans([chosen.plan], cluster, model, flat)[0]
    assert chosen.iteration_time_ms == pytest.approx(again.iteration_time_ms, rel=1e-5)
    assert chosen.plan.pp > 1 and again.iteration_time_ms >= plain.iteration_time_ms + 5.0 * blocking_transfers(
        chosen.plan.pp, chosen.plan.micro_batches) - 1e-6


def test_train_measured_promotes_a_version_whose_calibration_beats_the_champions(monkeypatch):
    """Issue #25: `memx train --measured` compares the new version's calibrated plan time error with the
    champion's, calibrated on the same measured plans, and promotes when it is lower."""
    import memx.pipeline.local as local
    from memx.learn.guard import Guard

    def cal(cv: float, base: float = 0.5) -> PlanCalibration:
        return PlanCalibration(time_scale={"g": 1.1}, plans_timed=8, time_guard=Guard(base_mape=base, cv_mape=cv, folds=4))

    assert cal(0.1).time_error() == 0.1 and cal(0.49).time_error() == 0.5  # a refused part: the uncalibrated error
    assert PlanCalibration().time_error() is None
    champion_fit, promoted = {}, []
    monkeypatch.setattr(local, "champion_ref", lambda fp, uri=None: {"model_version": 1})
    monkeypatch.setattr(local.registry, "load_version", lambda v: f"predictor v{v}")
    monkeypatch.setattr(local, "fit_from_config_runs", lambda runs, cl, mo, pred, **kw: champion_fit[pred])
    monkeypatch.setattr(local.registry, "promote", lambda v, fp: promoted.append((v, fp)))
    champion_fit["predictor v1"] = cal(0.2)
    said = local.promote_if_calibrated_better(2, cal(0.1), "fp", None, None, None)
    assert promoted == [(2, "fp")] and "promoted version 2" in said and "10.0% < version 1's 20.0%" in said
    said = local.promote_if_calibrated_better(3, cal(0.3), "fp", None, None, None)
    assert promoted == [(2, "fp")] and "champion stays version 1" in said
    assert local.promote_if_calibrated_better(1, cal(0.1), "fp", None, None, None) is None  # already champion
