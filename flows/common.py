"""Store I/O tasks (the only tasks with retries: transient S3/network faults) and catalog loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task

from memx.pipeline.steps import StageResult

IO_RETRIES = dict(retries=3, retry_delay_seconds=[1, 2, 4], persist_result=False)


def _store(uri: str | None):
    from memx.pipeline.store import store_from_uri

    return store_from_uri(uri)


@task(**IO_RETRIES)
def stored_manifest(store_uri: str | None, stage: str, version: str) -> dict[str, Any] | None:
    st = _store(store_uri)
    return st.manifest(stage, version) if st.has_stage(stage, version) else None


@task(**IO_RETRIES)
def newest_with(store_uri: str | None, stage: str, key: str) -> tuple[str, dict[str, Any]] | None:
    """The newest complete version of `stage` whose manifest has this key (profiles: per GPU type)."""
    st = _store(store_uri)
    for ref in st.list_versions(stage):
        m = st.manifest(stage, ref.version)
        if m.get("key") == key:
            return ref.version, m
    return None


@task(**IO_RETRIES)
def save_stage(store_uri: str | None, stage: str, version: str, result: StageResult, inputs: dict[str, Any]) -> dict[str, Any]:
    st = _store(store_uri)
    st.put_stage(stage, version, tables=result.tables, files=result.files, manifest={**result.manifest, "inputs": inputs})
    return st.manifest(stage, version)


@task(**IO_RETRIES)
def load_table(store_uri: str | None, stage: str, version: str, name: str) -> pd.DataFrame:
    return _store(store_uri).get_table(stage, version, name)


@task(**IO_RETRIES)
def load_file(store_uri: str | None, stage: str, version: str, name: str) -> bytes:
    return _store(store_uri).get_file(stage, version, name)


def load_specs(cluster: str, model: str, search: str, conf: str | None):
    from memx.domain.catalog import load_cluster, load_model, load_search

    root = Path(conf) if conf else None
    return load_cluster(cluster, root), load_model(model, root), load_search(search, root)
