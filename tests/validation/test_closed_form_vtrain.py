"""vTrain (MICRO 2024) ground_truth_single.csv with the closed form: 1,440 measured Megatron-DeepSpeed iterations on
2–8 A100s (8 GPT models, hidden 1024 / 2048, 12–24 layers, s = 1024, full recompute), each predicted by the
runtime-aware closed form with the catalog's A100 entry (eager attention, as that stack ran) — what `memx plan` uses
without a registered predictor, and `memx plan --measured RUNS` calibrates (issue #23: per real source, the closed
form before and after calibration). Nothing here is fitted to this file but the held-out calibrations, and no plan is
scored by a calibration that saw it (bench/vtrain_calibration.py `--predictor analytic`, the one path bench and test
share). Bounds are regression guards around the measured figures (docs/results.md §The closed form on vTrain
single-node)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.vtrain_calibration import held_out_calibrated, load_vtrain, model_estimates, scores, uncalibrated


@pytest.fixture(scope="module")
def closed_form_models(realdata):
    return model_estimates(load_vtrain(realdata), "analytic")


def test_closed_form_on_vtrain_is_too_fast_where_per_gpu_work_is_small(closed_form_models):
    """Uncalibrated: MAPE 26.9 %, too fast everywhere and most where each GPU's work is smallest (median
    predicted / measured 0.88 at tp 1 down to 0.46 at tp 8; hidden 2048 at tp 1 is within 3 %): these models'
    layers are host- and latency-bound, which the catalog's per-operator terms undercount. Ranking suffers with
    it: the measured best is predicted first in 5 of 24 groups."""
    rows, pred = uncalibrated(closed_form_models)
    s = scores(rows, pred)
    print(s.line("vTrain, closed form uncalibrated"))
    ratio = rows.assign(r=pred / rows.time_ms.to_numpy()).groupby("tp").r.median()
    print("median predicted / measured by tp:", ratio.round(3).to_dict())
    assert s.n == 1440 and s.groups == 24
    assert 0.22 < s.mape < 0.31 and s.median_spearman > 0.9
    assert list(ratio.index) == [1, 2, 4, 8] and np.all(np.diff(ratio.to_numpy()) < 0)  # worse as tp grows
    assert ratio[1] > 0.8 and ratio[8] < 0.55


# ~90 s (twice 8 held-out fits, each with the plan residual's grouped cross-validation): `make test-all`; the closed
# form on this source stays in the default set via the uncalibrated test above.
@pytest.mark.slow
def test_closed_form_calibrated_on_the_other_models_held_out(closed_form_models):
    """The library's default calibration (a, c, o, d, the cost per layer and micro batch e, and the plan residual)
    fitted on the other seven models' measured plans: MAPE 26.9 → 1.7 %, measured best first 5 → 22 of 24, the pick's
    regret 10.4 → 0.1 % on average. Without e (the default before session 17): 3.1 %, 17 of 24, 1.2 %; the parametric
    terms without e reach 18.8 %, with it 8.4 %."""
    rows, pred, cals = held_out_calibrated(closed_form_models, residual=True, per_layer=True)
    s = scores(rows, pred)
    print(s.line("vTrain, closed form calibrated held out"))
    base = scores(*uncalibrated(closed_form_models))
    assert s.mape < 0.025 and s.median_spearman > 0.995 and s.best_first >= 20 and s.regret_mean < 0.005
    assert s.best_first > base.best_first + 12 and s.regret_mean < 0.05 * base.regret_mean
    assert all(c.time_guard.accepted and c.residual is not None and 1.0 < c.layer_overhead_ms < 3.0 for c in cals.values())
    without = scores(*held_out_calibrated(closed_form_models, residual=True, per_layer=False)[:2])
    assert s.mape < 0.7 * without.mape and s.best_first > without.best_first  # e, not the residual, makes the step
