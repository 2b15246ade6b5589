"""The artifact store's API (docs/architecture.md §Artifact store): one folder (or S3 prefix) per step
version, Parquet tables and files inside, the manifest written last.

Layout: ``<root>/<step>/<version>/<table>.parquet``, ``<root>/<step>/<version>/<file>`` and
``<root>/<step>/<version>/manifest.json``. A version is complete iff its manifest exists, so a crash
mid-step never leaves a version that looks complete. Each object is written whole (local: temp file +
rename; S3: one PUT of the whole body), so no reader ever sees half a table. Backends supply the
object primitives: memx.pipeline.store.local.LocalStore, memx.pipeline.store.s3.S3Store.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from memx.domain.errors import InputError
from memx.domain.hashing import canonical_json

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
RESERVED_KEYS = ("stage", "step", "version", "created_at", "tables", "files", "format")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")  # step, version, file names
TABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_=+-]*")  # table names: no dot (".parquet" is added)


class ArtifactNotFound(InputError):
    """A step version, table or file that is not in the store (CLI exit code 2)."""


@dataclass(frozen=True, kw_only=True)
class StepRef:
    """One complete step version."""

    step: str
    version: str
    created_at: str  # ISO 8601, UTC
    uri: str  # the version's folder (local path or s3:// URI)

    @property
    def stage(self) -> str:
        """Old name of `step`, read by memx.cli.artifacts until it moves to `step`."""
        return self.step


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Bounded exponential backoff: `attempts` tries, sleeping base_s·2^i (at most max_s) between."""

    attempts: int = 7
    base_s: float = 0.1
    max_s: float = 2.0

    def call(self, fn: Callable[[], T], *, transient: Callable[[BaseException], bool]) -> T:
        """`fn()`, retried while it raises errors `transient` accepts."""
        for i in range(self.attempts):
            try:
                return fn()
            except Exception as exc:
                if i + 1 >= self.attempts or not transient(exc):
                    raise
                time.sleep(min(self.max_s, self.base_s * 2**i))
        raise AssertionError("unreachable")  # pragma: no cover


def check_name(kind: str, value: str, pattern: re.Pattern[str] = NAME) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InputError(f"invalid {kind} name {value!r}: use letters, digits and _ . = + - (no slash, no leading dot)")
    return value


def _check_items(tables: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    for name in tables:
        check_name("table", name, TABLE)
    taken = {f"{t}.parquet" for t in tables} | {MANIFEST}
    for name, data in files.items():
        check_name("file", name)
        if "." not in name:
            raise InputError(f"file name {name!r} needs an extension (names without one are tables)")
        if name in taken:
            raise InputError(f"file name {name!r} clashes with a table or the manifest")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputError(f"file {name!r}: expected bytes, got {type(data).__name__}")


def item_name(name: str) -> str:
    """The object name of a table (``runs`` → ``runs.parquet``) or a file (``plan.json`` as is)."""
    return name if "." in name else f"{check_name('table', name, TABLE)}.parquet"


def _manifest_doc(step: str, version: str, extra: Mapping[str, Any], tables: Mapping[str, pd.DataFrame],
                  files: Mapping[str, bytes]) -> dict[str, Any]:
    doc = {k: v for k, v in extra.items() if k not in RESERVED_KEYS}
    doc.update(
        step=step,
        version=version,
        format=MANIFEST_FORMAT,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        tables={n: {"rows": int(len(df)), "columns": [str(c) for c in df.columns]} for n, df in tables.items()},
        files={n: {"bytes": len(data)} for n, data in files.items()},
    )
    return doc


class ArtifactStore(ABC):
    """Versioned step artifacts. Subclasses supply object I/O; the protocol lives here."""

    # -- object primitives (keys are "step/version/name")
    @abstractmethod
    def write_object(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def write_table(self, key: str, df: pd.DataFrame) -> None: ...

    @abstractmethod
    def read_object(self, key: str) -> bytes: ...

    @abstractmethod
    def read_table(self, key: str) -> pd.DataFrame: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def manifest_keys(self, step: str | None) -> Iterator[tuple[str, str]]:
        """(step, version) of every object named manifest.json."""

    @abstractmethod
    def object_uri(self, key: str) -> str: ...

    @property
    @abstractmethod
    def root_uri(self) -> str: ...

    # -- public API
    def put_step(self, step: str, version: str, *, tables: Mapping[str, pd.DataFrame] | None = None,
                 files: Mapping[str, bytes] | None = None, manifest: Mapping[str, Any] | None = None) -> StepRef:
        """Write tables and files, then the manifest (last). An existing complete version is kept
        as it is (same inputs → same content-hash version), and its ref is returned."""
        check_name("step", step)
        check_name("version", version)
        tables, files = dict(tables or {}), dict(files or {})
        _check_items(tables, files)
        files = {name: bytes(data) for name, data in files.items()}
        if self.has_step(step, version):
            return self._ref(self.manifest(step, version))
        for name, df in tables.items():
            self.write_table(f"{step}/{version}/{name}.parquet", df)
        for name, data in files.items():
            self.write_object(f"{step}/{version}/{name}", data)
        doc = _manifest_doc(step, version, manifest or {}, tables, files)
        text = json.dumps(json.loads(canonical_json(doc)), indent=2, sort_keys=True) + "\n"
        self.write_object(f"{step}/{version}/{MANIFEST}", text.encode())
        return self._ref(doc)

    def has_step(self, step: str, version: str) -> bool:
        return self.exists(f"{check_name('step', step)}/{check_name('version', version)}/{MANIFEST}")

    def manifest(self, step: str, version: str) -> dict[str, Any]:
        key = f"{check_name('step', step)}/{check_name('version', version)}/{MANIFEST}"
        try:
            return json.loads(self.read_object(key))
        except ArtifactNotFound:
            raise ArtifactNotFound(f"no complete version {step}/{version} in {self.root_uri}") from None

    def get_table(self, step: str, version: str, name: str) -> pd.DataFrame:
        self._require(step, version)
        return self.read_table(f"{step}/{version}/{check_name('table', name, TABLE)}.parquet")

    def get_file(self, step: str, version: str, name: str) -> bytes:
        self._require(step, version)
        return self.read_object(f"{step}/{version}/{check_name('file', name)}")

    def list_versions(self, step: str | None = None) -> list[StepRef]:
        """Complete versions (manifest present), newest first."""
        if step is not None:
            check_name("step", step)
        refs = [self._ref(self.manifest(s, v)) for s, v in self.manifest_keys(step)]
        return sorted(refs, key=lambda r: (r.created_at, r.step, r.version), reverse=True)

    def uri(self, step: str, version: str, name: str | None = None) -> str:
        """URI of the version folder, of a table (``name`` without a dot) or of a file."""
        base = f"{check_name('step', step)}/{check_name('version', version)}"
        return self.object_uri(base if name is None else f"{base}/{item_name(name)}")

    # -- helpers
    def _require(self, step: str, version: str) -> None:
        if not self.has_step(step, version):
            raise ArtifactNotFound(f"no complete version {step}/{version} in {self.root_uri}")

    def _ref(self, doc: Mapping[str, Any]) -> StepRef:
        step, version = doc.get("step") or doc["stage"], doc["version"]  # "stage": manifests before issue #10
        return StepRef(step=step, version=version, created_at=doc["created_at"], uri=self.uri(step, version))
