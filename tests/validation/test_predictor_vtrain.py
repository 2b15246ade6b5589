"""vTrain (MICRO 2024) ground_truth_single.csv: measured Megatron-DeepSpeed iterations on 2–8 A100s, full
recompute, 8 models (hidden 1024 / 2048 × 12–24 layers). Per model, a 3-point design is profiled on the
simulator with the vTrain-calibrated A100 traits (eager attention, docs/simulator.md), the predictor is
trained on it, and every measured configuration of that model is predicted (bench/vtrain_calibration.py
`model_estimates`, the one path bench and test share): MAPE, and ranking within the 24 groups of equal GPU
count and model. Then the same predictions calibrated on measured plans (issue #16), held out: each model
through a calibration fitted on the other seven models' measured plans only. Bounds are regression guards
around the measured figures (docs/predictor.md, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.vtrain_calibration import (
    held_out_calibrated, load_vtrain, missed_picks, model_estimates, scores, uncalibrated,
)


@pytest.fixture(scope="module")
def vtrain_models(realdata):
    return model_estimates(load_vtrain(realdata))


# ~12 s with its fixture (1,440 vTrain plans predicted by a trained model): `make test-all`; published data stays in
# the default set via tests/validation/test_simulator_vtrain.py, test_predictor_sailor.py and test_v100_published.py.
@pytest.mark.slow
def test_vtrain_a100_groups_ranked_and_predicted(vtrain_models):
    s = scores(*uncalibrated(vtrain_models))
    print(s.line("vTrain uncalibrated"))
    # measured: MAPE 9.07 %, within-group Spearman median 0.982 (min 0.958), best first 16 of 24
    assert s.n == 1440 and s.groups == 24
    assert s.mape < 0.095 and s.min_spearman > 0.95 and s.median_spearman > 0.975 and s.best_first >= 15


# ~9 s (8 held-out calibrations): `make test-all`; vTrain stays in the default set via
# test_vtrain_a100_groups_ranked_and_predicted.
@pytest.mark.slow
def test_vtrain_a100_calibrated_on_the_other_models_held_out(vtrain_models):
    """Leave one model out: no plan is scored by a calibration that saw it. With the per-transfer p2p cost d
    and per-tp stage scales the held-out MAPE falls from 9.1 % to 6.9 %; d comes out at 1–1.2 ms per transfer."""
    rows, pred, cals = held_out_calibrated(vtrain_models, per_tp=True)
    s = scores(rows, pred)
    print(s.line("vTrain leave-one-model-out calibrated"))
    # measured: MAPE 6.87 %, median Spearman 0.988 (min 0.980), best first 16 of 24
    assert s.n == 1440 and s.mape < 0.072 and s.median_spearman > 0.98 and s.min_spearman > 0.97
    assert s.best_first >= 15
    assert all(c.time_guard.accepted and 0.5 < c.p2p_per_transfer_ms < 2.5 for c in cals.values())
    base = scores(*uncalibrated(vtrain_models))
    assert s.mape < base.mape - 0.015  # the calibration, not the bound, makes the difference


@pytest.mark.slow  # ~25 s (8 held-out fits, each a grouped cross-validation over 6 settings); the residual's
# mechanics stay covered in the default set by tests/unit/test_residual.py
def test_vtrain_a100_with_the_plan_residual_held_out(vtrain_models):
    """The calibration's defaults before session 17 (a, c, o, d; plan residual, memx.learn.residual; without the
    per-layer cost e, the default since: tests/validation/test_closed_form_vtrain.py), each model through a fit on the
    other seven models' measured plans only, the residual's setting chosen by cross-validation grouped by model
    over those seven: MAPE and Spearman goals (≤ 7 % / ≥ 0.98) met; the best-first goal (≥ 20 of 24) is met
    only counting near-ties: measured-best predicted first in 19 groups (20 when written, 26e625e; the group
    that flipped, 8 GPUs h1024-L24, has its two best configurations measured 0.52 % apart), and in
    21 the pick measured within NEAR_BEST (1 %) of the group's best (bench/vtrain_calibration.py: vTrain
    publishes one time per configuration, no spread; 1 % is a stated tolerance, a third of this MAPE). Of
    the 5 missed groups 2 are such near-ties (0.93 / 0.96 %); 3 are the residual's systematic miss of tp 4 at
    hidden 2048 on 8 GPUs (predicted 7–13 % slow; regret 1.8–2.2 %). Across hidden sizes it is not met.
    Since the cycle-mean assemblies (e694111, session 9; and cycle-mean-drain, session 11) best first is 18 and
    within 1 % 20: h2048-L12 on 8 GPUs joins the tp-4 misses (regret 1.50 %); the paper's assembly keeps 19 / 20
    (docs/results.md §The 1F1B assembly, "vTrain under the three assemblies"). The test had been failing in the slow
    set since e694111."""
    rows, pred, cals = held_out_calibrated(vtrain_models, residual=True)
    s = scores(rows, pred)
    print(s.line("vTrain leave-one-model-out calibrated with the plan residual"))
    print("\n".join(missed_picks(rows, pred)))
    # measured (session 11, cycle-mean-drain): MAPE 2.95 %, median Spearman 0.9966 (min 0.992), best first 18 of 24,
    # within 1 %: 20, regret mean 0.39 % max 2.18 % (docs/benchmarks.md §vTrain residual best-first, and §The
    # gradient-norm barrier and the drained default)
    assert s.mape < 0.04 and s.median_spearman > 0.99 and s.min_spearman > 0.98 and s.best_first >= 18
    assert s.near_best >= 20 and s.regret_mean < 0.005 and s.regret_max < 0.025
    assert all(c.residual is not None and c.residual_guard.accepted and c.residual_guard.folds == 7 for c in cals.values())
    parametric = scores(*held_out_calibrated(vtrain_models)[:2])
    assert s.mape < 0.6 * parametric.mape  # the residual, not the parametric terms, makes the difference
