"""S3 backend of the artifact store (docs/architecture.md §Artifact store): boto3 for objects and
listing (tables are Parquet bytes, memx.pipeline.store.base); the one source of the S3 endpoint
(:func:`s3_endpoint`) with the client factories that use it.

Atomicity: every object is one PUT of its whole body (a table is serialised to Parquet in memory
first), and S3 makes an object visible only once its PUT completes; the manifest goes last.
Transient errors (connection refused/reset, timeouts, 5xx, throttling) are retried with bounded
exponential backoff (memx.pipeline.store.base.Retry); the clients' own retries are switched off so
the bound is this module's. boto3 and pyarrow.fs are imported inside functions: optional, heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from memx.domain.errors import InputError
from memx.pipeline.store.base import MANIFEST, NAME, ArtifactNotFound, ArtifactStore, Retry

__all__ = ["Retry", "S3Store", "is_transient", "s3_client", "s3_endpoint", "s3_env", "s3_filesystem",
           "s3_storage_options", "split_s3_uri"]


def s3_endpoint() -> str | None:
    """The S3 endpoint URL for boto3, pyarrow, pandas, MLflow and Prefect alike.

    ``MEMX_S3_ENDPOINT_URL``, else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else None
    (real AWS). pyarrow ignores the AWS variables, so always pass this value explicitly.
    """
    for var in ("MEMX_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        value = os.environ.get(var, "").strip()
        if value:
            return value.rstrip("/")
    return None


def s3_env(endpoint: str | None = None) -> dict[str, str]:
    """Environment variables that point MLflow (server or client), boto3 and Prefect's S3 blocks
    at the same endpoint; empty for real AWS. Merge into a subprocess's env."""
    endpoint = endpoint or s3_endpoint()
    if not endpoint:
        return {}
    return {"MEMX_S3_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "MLFLOW_S3_ENDPOINT_URL": endpoint}


def s3_storage_options(endpoint: str | None = None) -> dict[str, Any]:
    """``storage_options`` for ``pandas.read_parquet("s3://...")`` (needs s3fs) with the same endpoint."""
    endpoint = endpoint or s3_endpoint()
    return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}


_TRANSIENT_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "RequestTimeTooSkewed"}
_TRANSIENT_ARROW = re.compile(r"NETWORK_CONNECTION|curlCode|SERVICE_UNAVAILABLE|SLOW_DOWN|INTERNAL_FAILURE|REQUEST_TIMEOUT|THROTTLING|HTTP status 5\d\d")


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: connection problems, timeouts, 5xx and throttling."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, (BotoConnectionError, HTTPClientError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or exc.response.get("Error", {}).get("Code") in _TRANSIENT_CODES
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
        return bool(_TRANSIENT_ARROW.search(str(exc)))  # pyarrow reports S3 errors as OSError
    return False


def _region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def s3_client(endpoint: str | None = None, *, max_attempts: int = 3) -> Any:
    """A boto3 S3 client on :func:`memx.pipeline.store.s3_endpoint` (or `endpoint`)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"total_max_attempts": max_attempts, "mode": "standard"}, connect_timeout=5, read_timeout=60)
    return boto3.client("s3", endpoint_url=endpoint or s3_endpoint(), region_name=_region(), config=config)


def s3_filesystem(endpoint: str | None = None, *, max_attempts: int = 3) -> Any:
    """A ``pyarrow.fs.S3FileSystem`` on the same endpoint (pyarrow ignores AWS_ENDPOINT_URL_S3)."""
    from pyarrow import fs as pafs

    kwargs: dict[str, Any] = {"retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=max_attempts), "connect_timeout": 5, "request_timeout": 60}
    endpoint = endpoint or s3_endpoint()
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs.update(endpoint_override=parts.netloc, scheme=parts.scheme or "https")
    if _region():
        kwargs["region"] = _region()
    return pafs.S3FileSystem(**kwargs)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` → ("bucket", "a/b")."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise InputError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix)")
    return parts.netloc, parts.path.strip("/")


@dataclass(frozen=True, kw_only=True)
class S3Store(ArtifactStore):
    """Step versions under ``s3://bucket/prefix``."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = field(default_factory=s3_endpoint)
    retry: Retry = field(default_factory=Retry)

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3Store:
        bucket, prefix = split_s3_uri(uri)
        return cls(bucket=bucket, prefix=prefix, **kwargs)

    @property
    def root_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    @cached_property
    def _client(self) -> Any:
        return s3_client(self.endpoint, max_attempts=1)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def object_uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def write_object(self, key: str, data: bytes) -> None:
        self.retry.call(lambda: self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data), transient=is_transient)

    def read_object(self, key: str) -> bytes:
        def get() -> bytes:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

        try:
            return self.retry.call(get, transient=is_transient)
        except self._client.exceptions.NoSuchKey:
            raise ArtifactNotFound(f"{self.object_uri(key)} not found") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.retry.call(lambda: self._client.head_object(Bucket=self.bucket, Key=self._key(key)), transient=is_transient)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise
        return True

    def _list_keys(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            return [obj["Key"] for page in pages for obj in page.get("Contents", ())]

        return self.retry.call(listing, transient=is_transient)

    def manifest_keys(self, step: str | None) -> Iterator[tuple[str, str]]:
        base = self._key("")
        for key in self._list_keys(base + (f"{step}/" if step else "")):
            parts = key[len(base):].split("/")
            if len(parts) == 3 and parts[2] == MANIFEST and NAME.fullmatch(parts[0]) and NAME.fullmatch(parts[1]):
                yield parts[0], parts[1]
