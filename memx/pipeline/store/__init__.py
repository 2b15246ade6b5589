"""Versioned artifact store: one folder (or S3 prefix) per stage version, Parquet tables inside.

Layout: ``<root>/<stage>/<version>/<table>.parquet``, ``<root>/<stage>/<version>/<file>`` and
``<root>/<stage>/<version>/manifest.json``. The manifest is written last: a version is complete
iff its manifest exists, so a crash mid-stage never leaves a version that looks complete. Each
object is written whole (local: temp file + rename; S3: one PUT of the whole body), so no reader
ever sees half a table.

Backends: :class:`LocalStore` (a folder, the default ``$MEMX_HOME/artifacts``) and
``memx.pipeline.store.s3.S3Store`` (``s3://bucket/prefix``; MinIO or any S3-compatible endpoint).
:func:`s3_endpoint` is the one place the S3 endpoint comes from, for every client.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memx.domain.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
RESERVED_KEYS = ("stage", "version", "created_at", "tables", "files", "format")
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")  # stage, version, file names
_TABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_=+-]*")  # table names: no dot (".parquet" is added)


class ArtifactNotFound(InputError):
    """A stage version, table or file that is not in the store (CLI exit code 2)."""


# ---------------------------------------------------------------- endpoint: one source for all


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


# ---------------------------------------------------------------- content versions


def _canon(obj: Any) -> Any:
    """JSON fallback for the types callers put in manifests and version parts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (Path, dt.datetime, dt.date)):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays
        return obj.tolist()
    raise TypeError(f"cannot put {type(obj).__name__} into a manifest or content version")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_canon, allow_nan=True)


def content_version(*parts: Any) -> str:
    """Stable content hash naming a stage version: sha256 of the canonical JSON of `parts`, 16 hex."""
    return hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- the store API


@dataclass(frozen=True, kw_only=True)
class StageRef:
    """One complete stage version."""

    stage: str
    version: str
    created_at: str  # ISO 8601, UTC
    uri: str  # the version's folder (local path or s3:// URI)


def _check(kind: str, value: str, pattern: re.Pattern[str] = _PART) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InputError(f"invalid {kind} name {value!r}: use letters, digits and _ . = + - (no slash, no leading dot)")
    return value


def _check_items(tables: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    for name in tables:
        _check("table", name, _TABLE)
    taken = {f"{t}.parquet" for t in tables} | {MANIFEST}
    for name, data in files.items():
        _check("file", name)
        if "." not in name:
            raise InputError(f"file name {name!r} needs an extension (names without one are tables)")
        if name in taken:
            raise InputError(f"file name {name!r} clashes with a table or the manifest")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputError(f"file {name!r}: expected bytes, got {type(data).__name__}")


def item_name(name: str) -> str:
    """The object name of a table (``runs`` → ``runs.parquet``) or a file (``plan.json`` as is)."""
    return name if "." in name else f"{_check('table', name, _TABLE)}.parquet"


def _manifest_doc(stage: str, version: str, extra: Mapping[str, Any], tables: Mapping[str, pd.DataFrame], files: Mapping[str, bytes]) -> dict[str, Any]:
    doc = {k: v for k, v in extra.items() if k not in RESERVED_KEYS}
    doc.update(
        stage=stage,
        version=version,
        format=MANIFEST_FORMAT,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        tables={n: {"rows": int(len(df)), "columns": [str(c) for c in df.columns]} for n, df in tables.items()},
        files={n: {"bytes": len(data)} for n, data in files.items()},
    )
    return doc


class ArtifactStore(ABC):
    """Versioned stage artifacts. Subclasses supply object I/O; the protocol lives here."""

    # -- object primitives (keys are "stage/version/name")
    @abstractmethod
    def _write_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def _write_table(self, key: str, df: pd.DataFrame) -> None: ...

    @abstractmethod
    def _read_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def _read_table(self, key: str) -> pd.DataFrame: ...

    @abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abstractmethod
    def _manifest_keys(self, stage: str | None) -> Iterator[tuple[str, str]]:
        """(stage, version) of every object named manifest.json."""

    @abstractmethod
    def _uri(self, key: str) -> str: ...

    @property
    @abstractmethod
    def root_uri(self) -> str: ...

    # -- public API
    def put_stage(
        self,
        stage: str,
        version: str,
        *,
        tables: Mapping[str, pd.DataFrame] | None = None,
        files: Mapping[str, bytes] | None = None,
        manifest: Mapping[str, Any] | None = None,
    ) -> StageRef:
        """Write tables and files, then the manifest (last). An existing complete version is kept
        as it is (same inputs → same content-hash version), and its ref is returned."""
        _check("stage", stage)
        _check("version", version)
        tables, files = dict(tables or {}), dict(files or {})
        _check_items(tables, files)
        files = {name: bytes(data) for name, data in files.items()}
        if self.has_stage(stage, version):
            return self._ref(self.manifest(stage, version))
        for name, df in tables.items():
            self._write_table(f"{stage}/{version}/{name}.parquet", df)
        for name, data in files.items():
            self._write_bytes(f"{stage}/{version}/{name}", data)
        doc = _manifest_doc(stage, version, manifest or {}, tables, files)
        self._write_bytes(f"{stage}/{version}/{MANIFEST}", (json.dumps(doc, indent=2, sort_keys=True, default=_canon) + "\n").encode())
        return self._ref(doc)

    def has_stage(self, stage: str, version: str) -> bool:
        return self._exists(f"{_check('stage', stage)}/{_check('version', version)}/{MANIFEST}")

    def manifest(self, stage: str, version: str) -> dict[str, Any]:
        key = f"{_check('stage', stage)}/{_check('version', version)}/{MANIFEST}"
        try:
            return json.loads(self._read_bytes(key))
        except ArtifactNotFound:
            raise ArtifactNotFound(f"no complete version {stage}/{version} in {self.root_uri}") from None

    def get_table(self, stage: str, version: str, name: str) -> pd.DataFrame:
        self._require(stage, version)
        return self._read_table(f"{stage}/{version}/{_check('table', name, _TABLE)}.parquet")

    def get_file(self, stage: str, version: str, name: str) -> bytes:
        self._require(stage, version)
        return self._read_bytes(f"{stage}/{version}/{_check('file', name)}")

    def list_versions(self, stage: str | None = None) -> list[StageRef]:
        """Complete versions (manifest present), newest first."""
        if stage is not None:
            _check("stage", stage)
        refs = [self._ref(self.manifest(s, v)) for s, v in self._manifest_keys(stage)]
        return sorted(refs, key=lambda r: (r.created_at, r.stage, r.version), reverse=True)

    def uri(self, stage: str, version: str, name: str | None = None) -> str:
        """URI of the version folder, of a table (``name`` without a dot) or of a file."""
        base = f"{_check('stage', stage)}/{_check('version', version)}"
        return self._uri(base if name is None else f"{base}/{item_name(name)}")

    # -- helpers
    def _require(self, stage: str, version: str) -> None:
        if not self.has_stage(stage, version):
            raise ArtifactNotFound(f"no complete version {stage}/{version} in {self.root_uri}")

    def _ref(self, doc: Mapping[str, Any]) -> StageRef:
        stage, version = doc["stage"], doc["version"]
        return StageRef(stage=stage, version=version, created_at=doc["created_at"], uri=self.uri(stage, version))


# ---------------------------------------------------------------- local folder


@dataclass(frozen=True, kw_only=True)
class LocalStore(ArtifactStore):
    """A folder; every object is written to a temp name beside it and renamed (memx.domain.io)."""

    root: Path

    @property
    def root_uri(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write_bytes(self, key: str, data: bytes) -> None:
        from memx.domain.io import atomic_write_bytes

        atomic_write_bytes(self._path(key), data)

    def _write_table(self, key: str, df: pd.DataFrame) -> None:
        from memx.domain.io import atomic_write_parquet

        atomic_write_parquet(df, self._path(key))

    def _read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFound(f"{self._path(key)} not found") from None

    def _read_table(self, key: str) -> pd.DataFrame:
        import pandas as pd

        path = self._path(key)
        if not path.is_file():
            raise ArtifactNotFound(f"{path} not found")
        return pd.read_parquet(path)

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _manifest_keys(self, stage: str | None) -> Iterator[tuple[str, str]]:
        for path in sorted(self.root.glob(f"{stage or '*'}/*/{MANIFEST}")):
            s, v = path.parent.parent.name, path.parent.name
            if _PART.fullmatch(s) and _PART.fullmatch(v):
                yield s, v

    def _uri(self, key: str) -> str:
        return str(self._path(key))


# ---------------------------------------------------------------- choosing a store


def default_store_uri() -> str:
    """``$MEMX_STORE``, else ``$MEMX_HOME/artifacts`` (``$MEMX_HOME`` defaults to ``.memx``)."""
    store = os.environ.get("MEMX_STORE", "").strip()
    if store:
        return store
    return str(Path(os.environ.get("MEMX_HOME") or ".memx") / "artifacts")


def store_from_uri(uri: str | None = None) -> ArtifactStore:
    """None → :func:`default_store_uri`; ``s3://bucket/prefix`` → S3; a path (or file://) → folder."""
    uri = (uri or "").strip() or default_store_uri()
    if uri.startswith("s3://"):
        from memx.pipeline.store.s3 import S3Store

        return S3Store.from_uri(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise InputError(f"unsupported store URI {uri!r}: use a folder path or s3://bucket/prefix")
    path = uri.removeprefix("file://")
    return LocalStore(root=Path(path).expanduser().absolute())
