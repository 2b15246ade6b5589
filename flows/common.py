"""What every flow shares: the store from its URI, catalog loading, the retry policy of step tasks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prefect.cache_policies import NO_CACHE

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.pipeline.local import train_config
from memx.pipeline.store import ArtifactStore, store_from_uri
from memx.pipeline.training import TrainConfig

# Steps are content-versioned and their store writes put the manifest last, so a retried step reuses
# whatever completed: retries cover transient store/network faults (the S3 store retries each request too).
STEP_RETRIES = dict(retries=2, retry_delay_seconds=[1, 2], persist_result=False, cache_policy=NO_CACHE)
# Training registers a model version: a retry would register a second one, so it is not retried.
NO_RETRY = dict(persist_result=False, cache_policy=NO_CACHE)


def store(uri: str | None) -> ArtifactStore:
    return store_from_uri(uri)


def load_specs(cluster: str, model: str, search: str, conf: str | None):
    root = Path(conf) if conf else None
    return load_cluster(cluster, root), load_model(model, root), load_search(search, root)


def conf_path(conf: str | None) -> Path | None:
    return Path(conf) if conf else None


def config(seed: int, **changes) -> TrainConfig:
    """The runner's training configuration (memx.pipeline.local.train_config): the same versions."""
    return dataclasses.replace(train_config(seed), **changes)
