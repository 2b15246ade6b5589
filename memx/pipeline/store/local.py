"""The artifact store in a local folder (docs/architecture.md §Artifact store); the default is
``$MEMX_HOME/artifacts``. Every object is written to a temp name beside it and renamed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from memx.domain.io import atomic_write_bytes
from memx.pipeline.store.base import MANIFEST, NAME, ArtifactNotFound, ArtifactStore


@dataclass(frozen=True, kw_only=True)
class LocalStore(ArtifactStore):
    """A folder; objects are written atomically (memx.domain.io)."""

    root: Path

    @property
    def root_uri(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def write_object(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self._path(key), data)

    def read_object(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFound(f"{self._path(key)} not found") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def manifest_keys(self, step: str | None) -> Iterator[tuple[str, str]]:
        for path in sorted(self.root.glob(f"{step or '*'}/*/{MANIFEST}")):
            s, v = path.parent.parent.name, path.parent.name
            if NAME.fullmatch(s) and NAME.fullmatch(v):
                yield s, v

    def object_uri(self, key: str) -> str:
        return str(self._path(key))
