"""Plan residual (memx.learn.residual, issue #16): learns a planted plan-level effect the parametric calibration
cannot express and cuts the held-out error; is not fitted below MIN_RESIDUAL_PLANS plans and not kept on
noise; survives calibration.json; the search, estimate_plans and calibrated_times score through it alike.
The accuracy claims on real measurements are in tests/validation/test_predictor_vtrain.py."""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.learn.calibration import calibrated_times, calibration_from_dict, fit_from_estimates
from memx.learn.residual import FEATURES, MIN_RESIDUAL_PLANS, features
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.search import search
from memx.simulator import draw_plans


def planted(e) -> float:
    """A plan-level effect no a_g, b_tp, c, o or d expresses: data parallelism with 64 or more micro batches runs
    30 % slower, pipelines of 7 or more stages 15 % faster."""
    p = e.plan
    return e.iteration_time_ms * (1.3 if p.dp >= 2 and p.micro_batches >= 64 else 1.0) * (0.85 if p.pp >= 7 else 1.0)


# The default search narrowed (tp ≤ 2, micro batch ≤ 2, two recompute levels; pp up to 8 so the planted
# effect of pp ≥ 7 is reachable): the same claim in a fraction of the search time.
NARROW = dataclasses.replace(load_search("default"), tp_options=(1, 2), micro_batch_options=(1, 2),
                             recompute_levels=("none", "full"))

@pytest.fixture(scope="module")
def setting():
    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    flat = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    plans = draw_plans(cluster, model, load_search("default"), n=240, seed=11)
    est = estimate_plans(plans, cluster, model, flat, reserve_gib=0.0)
    return cluster, model, flat, est


def mape(pred, truth) -> float:
    return float(np.mean(np.abs(np.asarray(pred) - truth) / truth))


def test_learns_a_planted_plan_effect_held_out(setting):
    _, _, _, est = setting
    truth = np.asarray([planted(e) for e in est])
    assert 0.1 < np.mean(truth != [e.iteration_time_ms for e in est]) < 0.9  # the effect touches some plans
    fit, test = slice(0, 160), slice(160, None)
    parametric = fit_from_estimates(est[fit], truth[fit], residual=False)
    both = fit_from_estimates(est[fit], truth[fit])
    assert parametric.residual is None and both.residual is not None and both.residual_guard.accepted
    assert both.residual.plans == 160 and both.residual_guard.folds == 5 and "plan residual kept" in both.summary()
    before, after = mape(calibrated_times(est[test], parametric), truth[test]), mape(calibrated_times(est[test], both), truth[test])
    assert before > 0.05 and after < 0.5 * before


# ~7 s (two guarded fits): `make test-all`; the residual's guard stays in the default set via
# test_learns_a_planted_plan_effect_held_out (kept when it helps held out).
@pytest.mark.slow
def test_not_fitted_below_the_minimum_and_not_kept_on_noise(setting):
    _, _, _, est = setting
    truth = np.asarray([planted(e) for e in est])
    few = fit_from_estimates(est[:MIN_RESIDUAL_PLANS - 1], truth[:MIN_RESIDUAL_PLANS - 1])
    assert few.residual is None
    noise = np.random.default_rng(3).lognormal(0.0, 0.05, len(est))  # nothing a plan's shape predicts
    cal = fit_from_estimates(est[:160], np.asarray([e.iteration_time_ms for e in est[:160]]) * noise[:160])
    assert cal.residual is None and not cal.residual_guard.accepted and "plan residual not kept" in cal.summary()
    assert calibration_from_dict(cal.to_dict()) == cal  # the verdict is stored with the calibration
    assert few.residual_guard is None  # nothing was fitted below the minimum
    raw = fit_from_estimates(est[:160], np.asarray([e.iteration_time_ms for e in est[:160]]) * noise[:160], guard=False)
    assert raw.residual is not None and not raw.residual_guard.accepted  # without the guard it is taken as it is


def test_round_trip_and_bad_residuals(setting):
    _, _, _, est = setting
    truth = np.asarray([planted(e) for e in est])
    cal = fit_from_estimates(est[:120], truth[:120])
    again = calibration_from_dict(cal.to_dict())
    assert again == cal and calibrated_times(est[120:], again) == pytest.approx(calibrated_times(est[120:], cal), rel=1e-12)
    doc = cal.to_dict()
    for bad in ({**doc["residual"], "features": list(FEATURES[:-1])}, {**doc["residual"], "booster_ubj_base64": "%%%"},
                {k: v for k, v in doc["residual"].items() if k != "max_depth"}):
        with pytest.raises(InputError, match="residual"):
            calibration_from_dict({**doc, "residual": bad})
    assert base64.b64decode(doc["residual"]["booster_ubj_base64"])[:1] == b"{"  # UBJ: data, not a pickle


def test_features_are_defined_for_any_plan(setting):
    _, _, _, est = setting
    X = features([e.plan for e in est], [e.stage_time_ms for e in est], np.asarray([e.iteration_time_ms for e in est]))
    assert X.shape == (len(est), len(FEATURES)) and np.isfinite(X).all()


def test_search_estimate_and_calibrated_times_share_the_residual(setting):
    cluster, model, flat, est = setting
    truth = np.asarray([planted(e) for e in est])
    cal = fit_from_estimates(est[:160], truth[:160])
    assert cal.residual is not None and not cal.is_identity
    wrapped = cal.wrap(flat)
    again = estimate_plans([e.plan for e in est[160:]], cluster, model, wrapped, reserve_gib=0.0)
    assert [a.iteration_time_ms for a in again] == pytest.approx(calibrated_times(est[160:], cal), rel=1e-6)
    r = search(cluster, model, NARROW, wrapped)
    check = estimate_plans([r.chosen.plan], cluster, model, wrapped)[0]
    assert r.chosen.iteration_time_ms == pytest.approx(check.iteration_time_ms, rel=1e-5)
    times = [c.iteration_time_ms for c in r.top_time]
    assert times == sorted(times)  # re-ranked after the residual
    without = estimate_plans([c.plan for c in r.top_time], cluster, model, dataclasses.replace(cal, residual=None).wrap(flat))
    moved = [abs(c.iteration_time_ms / w.iteration_time_ms - 1) for c, w in zip(r.top_time, without)]
    assert max(moved) > 0.05  # the residual re-scored kept candidates
