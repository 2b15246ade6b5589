"""The one hash family (docs/architecture.md §Versions and fingerprints).

Every content version, fingerprint, cache key and signature key is `stable_hash` of canonical JSON:
sorted keys, no whitespace, known non-JSON types converted by `_canon`. Same inputs, same hash, on every machine.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
from pathlib import Path
from typing import Any

HASH_CHARS = 16  # 64 bits of sha256: collisions are negligible for the number of artifacts a store holds


def _canon(obj: Any) -> Any:
    """JSON fallback for the types callers put in manifests, versions and keys."""
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
    raise TypeError(f"cannot hash or store a {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace; dataclasses, enums, paths, dates, sets and numpy
    values are converted (`_canon`); anything else is a TypeError, never a silent `str()`."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_canon, allow_nan=True)


def stable_hash(*parts: Any, chars: int = HASH_CHARS) -> str:
    """sha256 of the canonical JSON of `parts`, as `chars` hex digits."""
    return hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).hexdigest()[:chars]


def bytes_hash(data: bytes, chars: int = 64) -> str:
    """sha256 of raw bytes (artifact parts, model files), full length by default."""
    return hashlib.sha256(data).hexdigest()[:chars]
