"""Load catalogs (conf/gpus, clusters, models, search) by name or path into specs.

The YAML is validated at this edge by pydantic against the spec types themselves
(`memx.domain.specs`: their annotations carry the constraints, their `__post_init__` the cross-field
checks); every error names the file, every offending field and the allowed values, and is raised as
one `InputError` (exit code 2). See docs/architecture.md §Catalogs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar


from memx.domain.errors import InputError, SpecError, short_repr
from memx.domain.home import home_path
from memx.domain.io import path_kind, yaml_error
from memx.domain.spec_cache import parsed_yaml, validated, validation_error
from memx.domain.specs import MAX_CLUSTER_GPUS, Cluster, GpuType, ModelArch, SearchSpace

if TYPE_CHECKING:
    from pydantic import ValidationError

T = TypeVar("T")

KINDS = ("gpus", "clusters", "models", "search")
MAX_CATALOG_BYTES = 16 * 2**20  # one catalog file; a 65,536-GPU cluster is ~0.5 MiB of YAML


def packaged_conf_root() -> Path:
    """The conf/ folder shipped beside the package."""
    return Path(__file__).resolve().parents[2] / "conf"


def default_conf_root() -> Path:
    """`$MEMX_CONF`, else the conf/ folder shipped beside the package."""
    env = os.environ.get("MEMX_CONF")
    if env:
        return Path(env)
    return packaged_conf_root()


def catalog_roots(conf_root: Path | None = None) -> list[Path]:
    """The catalog folders an entry is looked up in, first match wins: the user's folder (`conf_root`,
    else $MEMX_CONF), then $MEMX_HOME/conf (where `memx cluster add-node` writes changed clusters), then the
    packaged conf/. A user folder that does not exist is bad input (InputError)."""
    user = Path(conf_root) if conf_root is not None else (Path(os.environ["MEMX_CONF"]) if os.environ.get("MEMX_CONF") else None)
    if user is not None and not user.is_dir():
        raise InputError(f"catalog folder {user} (--conf or $MEMX_CONF): no such folder")
    roots: list[Path] = []
    for root in (user, home_path("conf"), packaged_conf_root()):
        if root is not None and root.is_dir() and all(root.resolve() != r.resolve() for r in roots):
            roots.append(root)
    return roots


def entry_sources(kind: str, conf_root: Path | None = None) -> dict[str, Path]:
    """{name: the folder its entry comes from} over the layered catalog folders (the first one wins)."""
    found: dict[str, Path] = {}
    for root in catalog_roots(conf_root):
        folder = root / kind
        if folder.is_dir():
            for p in sorted(folder.glob("*.yaml")):
                found.setdefault(p.stem, folder)
    return dict(sorted(found.items()))


_NOT_GIVEN = object()


def _line(loc: str, msg: str, got: Any = _NOT_GIVEN) -> str:
    return f"field '{loc}': {msg}" + ("" if got is _NOT_GIVEN else f"; got {short_repr(got)}")


def _message(error: dict[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    return error["msg"] + (f" (allowed: {ctx['expected']})" if "expected" in ctx else "")


def _error_lines(err: ValidationError, spec_type: type | None = None) -> dict[str, str]:
    """One line per offending field: pydantic's field errors and the spec's own SpecError problems; an
    unknown top-level field lists the fields `spec_type` has."""
    errors = err.errors()
    lines: dict[str, str] = {}
    for e in errors:
        loc = ".".join(str(p) for p in e["loc"])
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):  # the spec's own checks, raised while it was built
            for field, what, value in cause.problems:
                where = f"{loc}.{field}" if loc else field
                lines[where] = _line(where, what, value)
        elif e["type"] == "too_short" and any(len(x["loc"]) > len(e["loc"]) and x["loc"][:len(e["loc"])] == e["loc"]
                                              for x in errors):
            continue  # its items were rejected, each on its own line: the list itself is not short
        elif e["type"] == "unexpected_keyword_argument" and len(e["loc"]) == 1 and dataclasses.is_dataclass(spec_type):
            allowed = ", ".join(f.name for f in dataclasses.fields(spec_type) if f.init)
            lines.setdefault(loc, _line(loc, f"unknown field; allowed: {allowed}"))
        else:
            lines.setdefault(loc or "(top level)", _line(loc or "(top level)", _message(e), e.get("input")))
    return lines


def known_names(kind: str, conf_root: Path | None = None) -> list[str]:
    return list(entry_sources(kind, conf_root))


def _is_file(path: Path, kind: str) -> bool:
    return path_kind(path, kind.rstrip("s")) == "file"


def resolve(kind: str, name_or_path: str | Path, conf_root: Path | None = None) -> Path:
    """A catalog entry by path to a YAML file, or by name: KIND/NAME.yaml in the first of `catalog_roots`
    that has it (the user's folder over $MEMX_HOME/conf over the packaged conf/)."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or _is_file(candidate, kind):
        if not _is_file(candidate, kind):
            raise InputError(f"{candidate}: no such {kind[:-1] if kind != 'search' else 'search'} file")
        return candidate
    roots = catalog_roots(conf_root)
    for root in roots:
        path = root / kind / f"{name_or_path}.yaml"
        if _is_file(path, kind):
            return path
    names = ", ".join(known_names(kind, conf_root)) or "(none)"
    raise InputError(f"unknown {kind.rstrip('s')} {short_repr(str(name_or_path))} in "
                     f"{', '.join(str(r / kind) for r in roots)}; known: {names}")


def read_text(path: Path, *, limit: int = MAX_CATALOG_BYTES) -> str:
    """A UTF-8 text file, as bad input (naming the file) when it is too big, unreadable or binary."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise InputError(f"{path}: {size} bytes; a catalog file holds at most {limit}")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                         "catalog files are UTF-8 YAML") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        data = parsed_yaml(text)
    except yaml_error() as exc:
        raise InputError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate_entry(spec_type: type[T], data: dict[str, Any], path: Path, *,
                   problems: dict[str, str] | None = None) -> T:
    """Validate a YAML mapping against a spec type; one InputError naming the file and every bad field.

    The `notes:` key is allowed everywhere (free text, not part of the spec). `problems` (field →
    message) are found by the caller (e.g. unknown GPU names) and reported with pydantic's. A mapping validated
    before by the same code comes from the cache (memx.domain.spec_cache)."""
    data = dict(data)
    notes = data.pop("notes", None)
    lines = {k: _line(k, v) for k, v in (problems or {}).items()}
    if notes is not None and not isinstance(notes, str):
        lines["notes"] = _line("notes", "must be text", notes)
    try:
        spec = validated(spec_type, data)
    except validation_error() as exc:
        for loc, line in _error_lines(exc, spec_type).items():
            lines.setdefault(loc, line)
    if len(lines) == 1:
        raise InputError(f"{path}: invalid catalog entry: {next(iter(lines.values()))}")
    if lines:
        raise InputError("\n".join([f"{path}: invalid catalog entry", *(f"  {line}" for line in lines.values())]))
    return spec


def parse_yaml(spec_type: type[T], path: Path) -> T:
    """Read a YAML mapping and validate it against a spec type (`validate_entry`)."""
    return validate_entry(spec_type, _read_yaml(path), path)


def load_gpu(name_or_path: str | Path, conf_root: Path | None = None) -> GpuType:
    return parse_yaml(GpuType, resolve("gpus", name_or_path, conf_root))


def _resolve_gpus(data: dict[str, Any], conf_root: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """`nodes[i].gpu` names → GpuType (loaded once each); problems keyed `nodes.i.gpu`."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        return data, {}
    gpus: dict[str, GpuType] = {}
    problems: dict[str, str] = {}
    resolved = []
    for i, node in enumerate(nodes):
        name = node.get("gpu") if isinstance(node, dict) else None
        if isinstance(name, str):
            try:
                gpus[name] = gpus[name] if name in gpus else load_gpu(name, conf_root)
                node = {**node, "gpu": gpus[name]}
            except InputError as exc:
                problems[f"nodes.{i}.gpu"] = str(exc)
        resolved.append(node)
    return {**data, "nodes": resolved}, problems


def _take_repeats(data: dict[str, Any]) -> tuple[dict[str, Any], list[int], dict[str, str]]:
    """The cluster mapping without the node entries' `repeat:` keys, each entry's repeat count (1 when not
    given) and the problems keyed `nodes.i.repeat`. `repeat: N` stands for N identical node entries."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        return data, [], {}
    counts, problems, stripped = [], {}, []
    for i, node in enumerate(nodes):
        r = node.get("repeat", 1) if isinstance(node, dict) else 1
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_CLUSTER_GPUS:
            problems[f"nodes.{i}.repeat"] = (f"must be a whole number of nodes from 1 to {MAX_CLUSTER_GPUS}; "
                                             f"got {short_repr(r)}")
            r = 1
        counts.append(r)
        stripped.append({k: v for k, v in node.items() if k != "repeat"} if isinstance(node, dict) else node)
    return {**data, "nodes": stripped}, counts, problems


def load_cluster(name_or_path: str | Path, conf_root: Path | None = None) -> Cluster:
    """A cluster entry; node entries with `repeat: N` stand for N identical nodes, in place (the entries are
    validated once each, so a bad field names the entry as written in the file)."""
    path = resolve("clusters", name_or_path, conf_root)
    data, repeats, problems = _take_repeats(_read_yaml(path))
    data, gpu_problems = _resolve_gpus(data, conf_root)
    cluster = validate_entry(Cluster, data, path, problems={**problems, **gpu_problems})
    if all(r == 1 for r in repeats):
        return cluster
    total = sum(n.count * r for n, r in zip(cluster.nodes, repeats))
    if total > MAX_CLUSTER_GPUS:  # checked before the nodes are expanded
        raise InputError(f"{path}: invalid catalog entry: field 'nodes': hold at most {MAX_CLUSTER_GPUS} GPUs in all "
                         f"(counting each entry's repeat); got {total} GPUs")
    return dataclasses.replace(cluster, nodes=tuple(n for n, r in zip(cluster.nodes, repeats) for _ in range(r)))


def load_model(name_or_path: str | Path, conf_root: Path | None = None) -> ModelArch:
    return parse_yaml(ModelArch, resolve("models", name_or_path, conf_root))


def load_search(name_or_path: str | Path, conf_root: Path | None = None) -> SearchSpace:
    return parse_yaml(SearchSpace, resolve("search", name_or_path, conf_root))
