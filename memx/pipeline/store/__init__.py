"""Versioned artifact store (docs/architecture.md §Artifact store): one folder (or S3 prefix) per step
version, Parquet tables inside, the manifest written last.

- memx.pipeline.store.base: the Store API (ArtifactStore, StepRef, ArtifactNotFound, Retry);
- memx.pipeline.store.local: LocalStore (a folder; the default ``$MEMX_HOME/artifacts``);
- memx.pipeline.store.s3: S3Store (``s3://bucket/prefix``; MinIO or any S3-compatible endpoint) and
  :func:`s3_endpoint`, the one place the S3 endpoint comes from, for every client.
"""

from __future__ import annotations

import os
from pathlib import Path

from memx.domain.errors import InputError
from memx.domain.home import home_path
from memx.pipeline.store.base import MANIFEST, ArtifactNotFound, ArtifactStore, CorruptArtifact, Retry, StepRef, item_name
from memx.pipeline.store.local import LocalStore
from memx.pipeline.store.s3 import S3Store, s3_endpoint, s3_env, s3_storage_options

__all__ = ["MANIFEST", "ArtifactNotFound", "ArtifactStore", "LocalStore", "Retry", "S3Store", "StepRef", "default_store_uri",
           "CorruptArtifact", "item_name", "s3_endpoint", "s3_env", "s3_storage_options", "store_from_uri"]


def default_store_uri() -> str:
    """``$MEMX_STORE``, else ``$MEMX_HOME/artifacts`` (docs/architecture.md §Local state)."""
    store = os.environ.get("MEMX_STORE", "").strip()
    return store or str(home_path("artifacts"))


def store_from_uri(uri: str | None = None) -> ArtifactStore:
    """None → :func:`default_store_uri`; ``s3://bucket/prefix`` → S3; a path (or file://) → folder."""
    uri = (uri or "").strip() or default_store_uri()
    if uri.startswith("s3://"):
        return S3Store.from_uri(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise InputError(f"unsupported store URI {uri!r}: use a folder path or s3://bucket/prefix")
    # "~" is expanded only when the user wrote it in the URI
    return LocalStore(root=Path(uri.removeprefix("file://")).expanduser().absolute())
