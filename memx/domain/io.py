"""Atomic file output: write to a temporary name in the same folder, then rename.

Nothing is ever half-written: a crash leaves either the old file or the new one. Files get the
permissions an ordinary `open()` would give (0666 less the umask, e.g. 0644), or 0777 less the umask
for executables (`executable=True`, e.g. megatron.sh) — not mkstemp's private 0600. Also:
`path_kind`, which turns a path the OS refuses (too long, NUL byte) into bad input naming it; `load_yaml`,
the one YAML reader of the catalogs.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memx.domain.errors import InputError, short_repr

if TYPE_CHECKING:
    import pandas as pd


def yaml_error() -> type[Exception]:
    """PyYAML's YAMLError, imported when an `except` clause meets an exception (`except yaml_error() as exc:`
    evaluates it then): a cached catalog text needs no PyYAML (memx.domain.spec_cache.parsed_yaml)."""
    import yaml

    return yaml.YAMLError


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, parsed by libyaml (PyYAML's CSafeLoader: the same safe constructors and
    resolvers in C, several times faster: a plan reads a dozen catalog files) where PyYAML was built with it;
    a document it rejects is parsed again by the pure-Python loader, so a YAML error reads the same."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.load(text, Loader=fast)  # noqa: S506 - CSafeLoader is the safe loader
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def path_kind(path: str | Path, what: str) -> Literal["file", "dir", "missing", "other"]:
    """What is at `path`; InputError naming `what` and the path when the OS refuses the name itself
    (longer than its limits, a NUL byte) or cannot look (permissions)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"{what} {short_repr(str(path))}: not a usable path: {why}") from None
    return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"


def _tmp_beside(path: Path, executable: bool = False) -> Path:
    """A temporary file beside `path` (its folder created); a path that cannot hold a file (a file on the
    way, a folder at `path`, no permission) is bad input naming it, before anything is written."""
    for parent in path.parents:
        if path_kind(parent, "output") in ("file", "other"):
            raise InputError(f"output {path}: {parent} exists and is not a folder")
    if path_kind(path, "output") == "dir":
        raise InputError(f"output {path}: is a folder; expected a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"output {path}: cannot create its folder: {exc.strerror or exc}") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, (0o777 if executable else 0o666) & ~_umask())
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: str | Path, data: bytes, *, executable: bool = False) -> Path:
    path = Path(path)
    tmp = _tmp_beside(path, executable)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_new_bytes(path: str | Path, data: bytes) -> bool:
    """Create `path` holding `data` unless it exists: written to a temporary name, then hard-linked to `path`
    (a link never replaces a file, so a process that created `path` meanwhile keeps it); True when written."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        tmp.write_bytes(data)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def db_template(package: str) -> Path:
    """Where `make install` keeps an empty database migrated by this environment's `package` (prefect, mlflow:
    memx.cli.orchestration.build_prefect_template, memx.pipeline.registry.build_mlflow_template), named by the
    package's version so another version never reads it."""
    from importlib.metadata import version

    return Path(sys.prefix) / "share" / "memx" / f"{package}-{version(package)}.db"


def seed_from_template(db: Path, template: Path) -> bool:
    """A database that does not exist yet starts as a copy of its migrated template, when there is one (a first
    run skips the package's schema migrations); an existing database is never touched."""
    return template.is_file() and not db.exists() and write_new_bytes(db, template.read_bytes())


def atomic_write_text(path: str | Path, text: str, *, executable: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), executable=executable)


def atomic_write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
