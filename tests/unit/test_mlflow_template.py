"""The migrated MLflow tracking-store template (memx.pipeline.registry; docs/benchmarks.md §Test time): a new
SQLite store starts as a copy, MLflow opens it without migrating and creates its default experiment with the
store's own artifact root; an existing store is never touched."""

from __future__ import annotations

import sqlite3
from importlib.metadata import version

import pytest

from memx.domain.io import seed_from_template, write_new_bytes
from memx.pipeline import registry


def test_write_new_bytes_never_replaces_a_file(tmp_path):
    path = tmp_path / "a" / "db"
    assert write_new_bytes(path, b"one")
    assert not write_new_bytes(path, b"two")
    assert path.read_bytes() == b"one" and sorted(p.name for p in path.parent.iterdir()) == ["db"]


def test_seed_needs_a_template_and_an_absent_database(tmp_path):
    template, db = tmp_path / "t.db", tmp_path / "x.db"
    assert not seed_from_template(db, template) and not db.exists()  # no template: MLflow migrates its own
    template.write_bytes(b"migrated")
    db.write_bytes(b"runs")
    assert not seed_from_template(db, template) and db.read_bytes() == b"runs"


def test_a_store_seeded_from_the_template_opens_without_migrating(tmp_path, monkeypatch):
    template = registry.mlflow_template()
    if not template.is_file():
        pytest.skip("no MLflow template in this environment (`make install` builds it)")
    import mlflow.store.db.utils as db_utils

    def no_migration(engine):
        raise AssertionError("a seeded store was migrated again")

    monkeypatch.setattr(db_utils, "_initialize_tables", no_migration)
    uri = f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"
    registry.setup(uri)
    with sqlite3.connect(tmp_path / "home" / "mlflow.db") as con:
        rows = dict(con.execute("select name, artifact_location from experiments"))
    assert set(rows) == {"Default", registry.EXPERIMENT}
    assert rows[registry.EXPERIMENT] == (tmp_path / "home" / "mlartifacts").as_uri()
    assert rows["Default"].endswith("/mlruns/0")  # MLflow's own default, as on an unseeded store: not the template's build folder
    assert template.name == f"mlflow-{version('mlflow')}.db"
