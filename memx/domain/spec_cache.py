"""Validated catalog entries, cached under `$MEMX_HOME/cache/specs/` (docs/architecture.md §Local state).

Validating a catalog mapping builds a pydantic TypeAdapter per spec type, and the first one a process
builds makes pydantic scan every installed distribution's entry points for plugins: together ≈ 0.1 CPU s of
an analytic `memx plan` (docs/benchmarks.md §Issue #26: plan CPU fixed costs (session 3)). A validated
spec is a function of its type, the mapping and the code alone, so it is kept: one file per entry, named
by `stable_hash(type, mapping, code_version())` — a changed file (another mapping), another MemX (the
sources of memx.domain, which define and check every spec), pydantic or Python gives another name. A file
is a pickle of the spec; one that cannot be read or does not unpickle into that very type (truncated,
foreign, from a removed class) is ignored and the mapping validated again. The cache is local state like
the MLflow database beside it: MemX reads it as it reads its own `$MEMX_HOME`.

Entries are written by `flush`, which the CLI's root group calls when a command succeeds (so bad input still
writes nothing), each to a temporary name and then renamed (memx.domain.io.atomic_write_bytes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memx.domain.errors import InputError
from memx.domain.hashing import stable_hash
from memx.domain.home import home_path
from memx.domain.io import atomic_write_bytes, load_yaml

if TYPE_CHECKING:
    from pydantic import TypeAdapter

T = TypeVar("T")

_PENDING: dict[Path, bytes] = {}  # validated in this process, written by flush()


def cache_folder() -> Path:
    return home_path("cache", "specs")  # parsed catalog texts beside it, in cache/yaml (parsed_yaml)


@functools.cache
def adapter(spec_type: type[T]) -> TypeAdapter[T]:
    """The one pydantic TypeAdapter of a spec type (built on first use: pydantic only where a mapping is validated)."""
    from pydantic import TypeAdapter

    return TypeAdapter(spec_type)


def validation_error() -> type[Exception]:
    """pydantic's ValidationError, imported when an `except` clause meets an exception (`except
    validation_error() as exc:` evaluates it then): a cached entry needs no pydantic at all."""
    from pydantic import ValidationError

    return ValidationError


@functools.cache
def code_version() -> str:
    """A hash of the code a validated spec depends on: memx/domain/*.py, pydantic's version (its
    `pydantic/version.py`, which states it: read, not imported, so a cache hit loads no pydantic) and Python's."""
    h = hashlib.sha256(f"{sys.version_info[:3]} pydantic ".encode() + _pydantic_version_file())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _pydantic_version_file() -> bytes:
    return _package_file("pydantic", "version.py")


def _package_file(package: str, name: str) -> bytes:
    spec = importlib.util.find_spec(package)  # finds the package without running it
    return (Path(next(iter(spec.submodule_search_locations))) / name).read_bytes()


def parsed_yaml(text: str) -> Any:
    """`memx.domain.io.load_yaml(text)`, from the cache when the same text was parsed before by the same code
    and PyYAML (its `yaml/__init__.py`, which states its version: read, not imported): a cached plan imports
    no PyYAML (≈ 0.02 CPU s, issue #26 session 4). A YAMLError propagates (nothing is cached then); written
    by `flush` like the specs."""
    h = hashlib.sha256(f"{code_version()} yaml ".encode() + _yaml_version_file() + b"\0" + text.encode())
    path = home_path("cache", "yaml") / f"{h.hexdigest()[:32]}.pickle"
    try:
        return pickle.loads(path.read_bytes())  # noqa: S301 - MemX's own local state (module docstring)
    except Exception:  # noqa: BLE001 - missing or unreadable: parse
        pass
    data = load_yaml(text)
    _PENDING[path] = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    return data


@functools.cache
def _yaml_version_file() -> bytes:
    return _package_file("yaml", "__init__.py")


def _plain(x: Any) -> bool:
    """True when canonical JSON keeps every distinction validation can see: str keys only (JSON would merge
    1 and "1"), JSON scalars, lists, mappings and dataclass specs (already validated)."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (str, int, float)) or (dataclasses.is_dataclass(x) and not isinstance(x, type))


def _read(path: Path, spec_type: type[T]) -> T | None:
    try:
        spec = pickle.loads(path.read_bytes())  # noqa: S301 - MemX's own local state (module docstring)
    except Exception:  # noqa: BLE001 - missing, unreadable or not a pickle of today's classes: validate again
        return None
    return spec if type(spec) is spec_type else None


def validated(spec_type: type[T], data: dict[str, Any]) -> T:
    """`adapter(spec_type).validate_python(data)`, from the cache when this mapping was validated before by
    the same code; pydantic's ValidationError propagates as it would (nothing is cached then)."""
    if not _plain(data):
        return adapter(spec_type).validate_python(data)
    path = cache_folder() / f"{stable_hash(f'{spec_type.__module__}.{spec_type.__qualname__}', data, code_version())}.pickle"
    spec = _read(path, spec_type)
    if spec is None:
        spec = adapter(spec_type).validate_python(data)
        _PENDING[path] = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    return spec


def flush() -> int:
    """Write the entries validated since the last flush; returns how many were written. A folder that cannot
    be written is skipped (the cache only saves time)."""
    written = 0
    while _PENDING:
        path, blob = _PENDING.popitem()
        try:
            atomic_write_bytes(path, blob)
            written += 1
        except (OSError, InputError):
            pass
    return written


def discard() -> None:
    """Forget the entries not yet written (a failed command)."""
    _PENDING.clear()
