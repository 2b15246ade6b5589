"""The artifact store's API (docs/architecture.md §Artifact store): one folder (or S3 prefix) per step
version, Parquet tables and files inside, the manifest written last.

Layout: ``<root>/<step>/<version>/<table>.parquet``, ``<root>/<step>/<version>/<file>`` and
``<root>/<step>/<version>/manifest.json``. A version is complete iff its manifest exists, so a crash
mid-step never leaves a version that looks complete. Each object is written whole (local: temp file +
rename; S3: one PUT of the whole body), so no reader ever sees half a table. Backends supply the
object primitives (bytes in, bytes out): memx.pipeline.store.local.LocalStore,
memx.pipeline.store.s3.S3Store; tables are serialised to Parquet here.

Integrity (issue #11): the manifest (format 2) records the sha256 of every part, and every read checks
it. A version whose manifest does not parse, or one of whose parts is missing or fails its check, is
*absent*: ``has_step`` says no, ``list_versions`` skips it, a warning names it, and the step that
needs it recomputes and overwrites it. Manifests of format 1 (before the hashes) are read unchecked.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
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
MANIFEST_FORMAT = 2  # 2: sha256 per part (issue #11)
RESERVED_KEYS = ("stage", "step", "version", "created_at", "tables", "files", "format")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")  # step, version, file names
TABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_=+-]*")  # table names: no dot (".parquet" is added)


log = logging.getLogger(__name__)


class ArtifactNotFound(InputError):
    """A step version, table or file that is not in the store (CLI exit code 2)."""


class CorruptArtifact(ArtifactNotFound):
    """A manifest that does not parse, or a part that fails its sha256 check: the version is absent."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """A table as Parquet bytes (serialised whole before anything is written)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


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
                  files: Mapping[str, bytes], table_bytes: Mapping[str, bytes]) -> dict[str, Any]:
    doc = {k: v for k, v in extra.items() if k not in RESERVED_KEYS}
    doc.update(
        step=step,
        version=version,
        format=MANIFEST_FORMAT,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        tables={n: {"rows": int(len(df)), "columns": [str(c) for c in df.columns], "sha256": sha256(table_bytes[n])}
                for n, df in tables.items()},
        files={n: {"bytes": len(data), "sha256": sha256(data)} for n, data in files.items()},
    )
    return doc


class ArtifactStore(ABC):
    """Versioned step artifacts. Subclasses supply object I/O; the protocol lives here."""

    # -- object primitives (keys are "step/version/name")
    @abstractmethod
    def write_object(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def read_object(self, key: str) -> bytes: ...

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
                 files: Mapping[str, bytes] | None = None, manifest: Mapping[str, Any] | None = None,
                 replace: bool = False) -> StepRef:
        """Write tables and files, then the manifest (last). An existing intact version is kept as it
        is (same inputs → same content-hash version), and its ref is returned; `replace` rewrites it
        (a version whose content failed a caller's own check, e.g. an invalid stored plan)."""
        check_name("step", step)
        check_name("version", version)
        tables, files = dict(tables or {}), dict(files or {})
        _check_items(tables, files)
        files = {name: bytes(data) for name, data in files.items()}
        if not replace and self.has_step(step, version):
            return self._ref(self.manifest(step, version))
        table_bytes = {name: parquet_bytes(df) for name, df in tables.items()}
        for name, data in table_bytes.items():
            self.write_object(f"{step}/{version}/{name}.parquet", data)
        for name, data in files.items():
            self.write_object(f"{step}/{version}/{name}", data)
        doc = _manifest_doc(step, version, manifest or {}, tables, files, table_bytes)
        text = json.dumps(json.loads(canonical_json(doc)), indent=2, sort_keys=True) + "\n"
        self.write_object(f"{step}/{version}/{MANIFEST}", text.encode())
        return self._ref(doc)

    def has_step(self, step: str, version: str) -> bool:
        """Whether a complete, intact version is stored: its manifest parses and every part passes its
        check. A version that fails is absent (a warning names it), so its step computes it again."""
        try:
            doc = self.manifest(step, version)
            for name in [*doc.get("tables", {}), *doc.get("files", {})]:
                self._part(step, version, name, doc)
        except CorruptArtifact as exc:
            log.warning("memx: %s; %s/%s is treated as absent and computed again", exc, step, version)
            return False
        except ArtifactNotFound:
            return False
        return True

    def manifest(self, step: str, version: str) -> dict[str, Any]:
        """The parsed manifest; ArtifactNotFound when there is none, CorruptArtifact when it does not parse."""
        key = f"{check_name('step', step)}/{check_name('version', version)}/{MANIFEST}"
        try:
            doc = json.loads(self.read_object(key))
        except ArtifactNotFound:
            raise ArtifactNotFound(f"no complete version {step}/{version} in {self.root_uri}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptArtifact(f"manifest of {step}/{version} in {self.root_uri} does not parse ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("version"), str) or "created_at" not in doc:
            raise CorruptArtifact(f"manifest of {step}/{version} in {self.root_uri} is not a manifest")
        return doc

    def _part(self, step: str, version: str, name: str, doc: Mapping[str, Any]) -> bytes:
        """The bytes of a table (name without a dot) or file, checked against the manifest's sha256."""
        obj = item_name(name)
        kind = "files" if "." in name else "tables"
        entry = doc.get(kind, {}).get(name)
        if entry is None:
            raise ArtifactNotFound(f"{step}/{version} has no {kind[:-1]} {name!r} in {self.root_uri}")
        try:
            data = self.read_object(f"{step}/{version}/{obj}")
        except ArtifactNotFound:
            raise CorruptArtifact(f"{step}/{version}/{obj} is listed in its manifest but missing") from None
        want = entry.get("sha256") if isinstance(entry, dict) else None
        if want is not None and sha256(data) != want:
            raise CorruptArtifact(f"{step}/{version}/{obj} fails its sha256 check (expected {str(want)[:12]}…, "
                                  f"got {sha256(data)[:12]}…)")
        return data

    def get_table(self, step: str, version: str, name: str) -> pd.DataFrame:
        import pandas as pd  # heavy: only when a table is read

        data = self._part(step, version, check_name("table", name, TABLE), self._doc(step, version))
        return pd.read_parquet(io.BytesIO(data))

    def get_file(self, step: str, version: str, name: str) -> bytes:
        return self._part(step, version, check_name("file", name), self._doc(step, version))

    def list_versions(self, step: str | None = None) -> list[StepRef]:
        """Complete versions (manifest present), newest first."""
        if step is not None:
            check_name("step", step)
        refs = []
        for s, v in self.manifest_keys(step):
            try:
                refs.append(self._ref(self.manifest(s, v)))
            except CorruptArtifact as exc:
                log.warning("memx: %s; %s/%s is treated as absent", exc, s, v)
        return sorted(refs, key=lambda r: (r.created_at, r.step, r.version), reverse=True)

    def uri(self, step: str, version: str, name: str | None = None) -> str:
        """URI of the version folder, of a table (``name`` without a dot) or of a file."""
        base = f"{check_name('step', step)}/{check_name('version', version)}"
        return self.object_uri(base if name is None else f"{base}/{item_name(name)}")

    # -- helpers
    def _doc(self, step: str, version: str) -> dict[str, Any]:
        if not self.exists(f"{check_name('step', step)}/{check_name('version', version)}/{MANIFEST}"):
            raise ArtifactNotFound(f"no complete version {step}/{version} in {self.root_uri}")
        return self.manifest(step, version)

    def _ref(self, doc: Mapping[str, Any]) -> StepRef:
        step, version = doc.get("step") or doc["stage"], doc["version"]  # "stage": manifests before issue #10
        return StepRef(step=step, version=version, created_at=doc["created_at"], uri=self.uri(step, version))
