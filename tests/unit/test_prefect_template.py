"""The migrated Prefect database template (memx.cli.orchestration; docs/benchmarks.md §First make plan): a fresh
MemX Prefect home gets a copy, an existing database or a Prefect home the user chose is never touched."""

from __future__ import annotations

import pytest

from memx.cli import orchestration


@pytest.fixture()
def template(tmp_path, monkeypatch):
    path = tmp_path / "share" / "prefect-x.db"
    path.parent.mkdir()
    path.write_bytes(b"migrated")
    monkeypatch.setattr(orchestration, "prefect_template", lambda: path)
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    return path


def test_a_fresh_memx_home_gets_the_template(template, tmp_path, monkeypatch):
    home = tmp_path / "home" / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    home.mkdir(parents=True)
    orchestration._seed_prefect_db()
    assert (home / "prefect.db").read_bytes() == b"migrated"
    assert [p.name for p in home.iterdir()] == ["prefect.db"]  # no temporary file left


def test_an_existing_database_or_a_users_prefect_home_is_left_alone(template, tmp_path, monkeypatch):
    home = tmp_path / "home" / "prefect"
    home.mkdir(parents=True)
    (home / "prefect.db").write_bytes(b"runs")
    monkeypatch.setenv("PREFECT_HOME", str(home))
    orchestration._seed_prefect_db()
    assert (home / "prefect.db").read_bytes() == b"runs"
    mine = tmp_path / "mine"
    monkeypatch.setenv("PREFECT_HOME", str(mine))  # not $MEMX_HOME/prefect: the user's own Prefect
    orchestration._seed_prefect_db()
    assert not mine.exists()
    (home / "prefect.db").unlink()
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://127.0.0.1/prefect")
    orchestration._seed_prefect_db()
    assert not (home / "prefect.db").exists()


def test_the_template_is_named_by_the_environments_prefect(monkeypatch):
    from importlib.metadata import version

    assert orchestration.prefect_template().name == f"prefect-{version('prefect')}.db"
