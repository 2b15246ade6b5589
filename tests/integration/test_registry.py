"""Real MLflow (SQLite file in a temp dir, real registry — no mocks): log, register with fingerprint
tags, load back, champion moves only when a new version is better on the same held-out rows."""

from __future__ import annotations

import pytest
import numpy as np
from typer.testing import CliRunner

from memx.pipeline import registry
from memx.cli.app import app as memx_app
from memx.learn.model import XgbParams
from memx.learn.tuning import TuneBudget
from memx.planner.signatures import SIGNATURE_COLUMNS
from memx.pipeline.training import TrainConfig, train_and_register


def test_tracking_uri_defaults_to_sqlite_under_memx_home(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert registry.tracking_uri() == f"sqlite:///{(tmp_path / 'memx-home').resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert registry.tracking_uri() == "sqlite:///elsewhere.db"
    assert registry.tracking_uri("sqlite:///arg.db") == "sqlite:///arg.db"


def test_register_load_and_champion_rule(scenario, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cl, mo, sp, runs = scenario
    gpus = {g.name: g for g in cl.gpu_types}
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    cfg = TrainConfig(budget=TuneBudget(trials=2, seconds=10))
    first = train_and_register(runs, gpus, fp, config=cfg)
    assert first.version == 1 and first.promoted
    mv = registry.champion(fp.fingerprint)
    assert int(mv.version) == 1
    for tag in ("gpu_types", "model_fingerprint", "global_batch", "fingerprint", "data_version", "held_out"):
        assert mv.tags[tag], tag
    assert mv.tags["fingerprint"] == fp.fingerprint and mv.tags["gpu_types"] == "vendor-x-32g,vendor-y-64g"
    # the trials were nested runs of the training run, with params and validation metrics
    children = mlflow.search_runs(filter_string=f"tags.mlflow.parentRunId = '{first.run_id}'")
    assert len(children) == 2 and "metrics.val_time_mape" in children and "params.max_depth" in children
    # the loaded version predicts exactly what was trained
    back = registry.load_version(1)
    sigs = runs[runs["status"] == "ok"].loc[:, list(SIGNATURE_COLUMNS)].head(20)
    assert np.allclose(back.predict(sigs).to_numpy(), first.predictor.predict(sigs).to_numpy())
    assert back.version == mv.tags["predictor_version"]
    # a deliberately weak model (one shallow round) on the same data and held-out rows: registered, not champion
    weak_cfg = TrainConfig(budget=TuneBudget(trials=1, seconds=5))
    monkeypatch.setattr("memx.pipeline.training.XgbParams", lambda: XgbParams(n_rounds=1, max_depth=1, learning_rate=0.01))
    monkeypatch.setattr("memx.pipeline.training.VARIANTS", ("hybrid",))
    monkeypatch.setattr("memx.pipeline.training.TREE_VARIANTS", ("hybrid",))
    monkeypatch.setattr("memx.learn.tuning.suggest", lambda trial: XgbParams(n_rounds=1, max_depth=1, learning_rate=0.01))
    weak = train_and_register(runs, gpus, fp, config=weak_cfg)
    assert weak.version == 2 and not weak.promoted
    assert int(registry.champion(fp.fingerprint).version) == 1
    table = registry.list_versions()
    assert list(table["version"]) == [1, 2] and "time_mape" in table and table.loc[0, "aliases"].startswith("champion")


# ~5 s (two trainings): `make test-all`; the registry stays in the default set via
# test_register_load_and_champion_rule.
@pytest.mark.slow
def test_models_cli_lists_and_compares(scenario, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cl, mo, sp, runs = scenario
    train_and_register(runs, {g.name: g for g in cl.gpu_types}, registry.fingerprint(cl, mo, sp.global_batch),
                       config=TrainConfig(budget=TuneBudget(trials=1, seconds=5)))
    app = memx_app
    cli = CliRunner()
    out = cli.invoke(app, ["models", "list"])
    assert out.exit_code == 0 and "champion" in out.output and "time_mape" in out.output
    out = cli.invoke(app, ["models", "compare", "1"])
    assert out.exit_code == 0 and "fingerprint" in out.output and "mem_mape" in out.output
    bad = cli.invoke(app, ["models", "compare", "7"])
    assert bad.exit_code == 2 and "not registered" in bad.output
