"""Same inputs, same predictor (issue #12): the tuning budget counts trials, the sampler and XGBoost are
seeded and single-threaded, so two trainings on the same stage_runs — each with a fresh MLflow SQLite
store — predict the same numbers; a wall-clock cap only stops early, with a warning naming the trials."""

from __future__ import annotations

import numpy as np
import pytest

from memx.learn.tuning import TuneBudget, tune
from memx.pipeline import registry
from memx.pipeline.training import TrainConfig, train_and_register
from memx.planner.signatures import SIGNATURE_COLUMNS


def _train(tmp, monkeypatch, scenario, name):
    cl, mo, sp, runs = scenario
    monkeypatch.setenv("MEMX_HOME", str(tmp / name))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    out = train_and_register(runs, {g.name: g for g in cl.gpu_types}, fp,
                             config=TrainConfig(seed=3, budget=TuneBudget(trials=3)),
                             tracking_uri=f"sqlite:///{tmp / name / 'mlflow.db'}")
    return out.predictor.predict(runs.loc[:, list(SIGNATURE_COLUMNS)])


@pytest.mark.slow  # ~12 s: two trainings (issue #17: `make test` under 3 min)
def test_two_trainings_on_fresh_stores_predict_identically(scenario, tmp_path, monkeypatch):
    a = _train(tmp_path, monkeypatch, scenario, "a")
    b = _train(tmp_path, monkeypatch, scenario, "b")
    assert (tmp_path / "a" / "mlflow.db").is_file() and (tmp_path / "b" / "mlflow.db").is_file()
    assert list(a.columns) == list(b.columns) and len(a) > 50
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())


def test_wall_clock_cap_stops_early_with_a_warning_naming_the_trials(scenario):
    cl, _, _, runs = scenario
    gpus = {g.name: g for g in cl.gpu_types}
    with pytest.warns(RuntimeWarning, match=r"after 1 of 50 trials"):
        res = tune(runs, runs, gpus, variant="hybrid", budget=TuneBudget(trials=50, seconds=1e-9), log_mlflow=False)
    assert len(res.trials) == 1


def test_default_budget_has_no_wall_clock_cap():
    assert TuneBudget().seconds is None and TuneBudget().trials > 0
