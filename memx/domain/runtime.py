"""What a real training process holds and achieves beyond the spec sheet: the runtime catalog.

conf/runtime/<gpu>.yaml, else conf/runtime/<vendor>.yaml, else conf/runtime/default.yaml. Every
number is an entry `{value: X, source: "..."}`: the source (vendor documentation, PyTorch / NCCL
documentation or maintainers, published measurements) sits next to the number, and a file may
`extends: <other entry>` to inherit what it does not override. The closed-form stage model
(memx.planner.cost, docs/planner.md §Runtime terms) reads these; the simulator never does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any


from memx.domain.errors import InputError
from memx.domain.io import yaml_error
from memx.domain.spec_cache import parsed_yaml, validated, validation_error

if TYPE_CHECKING:
    from pydantic import ValidationError

    from memx.domain.specs import GpuType

DEFAULT_ENTRY = "default"
_META_KEYS = ("name", "extends", "notes")
_MAX_EXTENDS = 8


@dataclass(frozen=True, kw_only=True)
class RuntimeProfile:
    """One GPU type's software stack and runtime overheads as the closed-form model uses them."""

    __pydantic_config__ = {"extra": "forbid"}  # pydantic.ConfigDict(extra="forbid"): a TypedDict, i.e. this dict

    name: str
    """Catalog entry this profile came from (after `extends`)."""
    flash_attention: bool
    """A fused attention kernel is used: the s² scores are never stored (Dao et al. 2022)."""
    sequence_parallel: bool
    """Megatron sequence parallelism: norm/dropout activations sharded over TP (Korthikanti 2022 §4.2.2)."""
    driver_reserved_mib: float
    """Memory the driver keeps out of the process's reach: nominal capacity − reported total (what
    `usable_capacity_mib` takes off the nominal memory; no predicted peak holds it)."""
    context_mib: float
    """CUDA/HIP/CANN context, loaded kernels and library workspaces, per process."""
    collective_comm_mib: float
    """Buffers of one collective communicator (a tp, dp, embedding, model-parallel or world group)."""
    p2p_comm_mib: float
    """Buffers for one pipeline neighbour (send/recv connections)."""
    allocator_overhead_fraction: float
    """Caching-allocator reserved/allocated − 1 at the peak: fragmentation and block rounding."""
    gemm_efficiency_large: float
    """Achieved fraction of the bf16 peak on large GEMMs."""
    compute_units: int
    """SMs / CUs / cores GEMM tiles are spread over (wave quantisation); 0 = no wave model."""
    gemm_tile_m: int
    """Rows of one GEMM output tile."""
    gemm_tile_n: int
    """Columns of one GEMM output tile."""
    attention_efficiency: float
    """Achieved fraction of the bf16 peak of the fused attention kernel."""
    memory_bandwidth_efficiency: float
    """Achieved fraction of the HBM bandwidth by streaming (elementwise) kernels."""
    link_efficiency: float
    """Collective bus bandwidth achieved / nominal link bandwidth (nccl-tests busbw)."""
    collective_step_ms: float
    """Latency of one ring step of a collective."""
    kernel_launch_ms: float
    """Device-side cost per kernel (launch gap and tail)."""
    host_op_ms: float
    """Host time to issue one operator in eager mode: a pass is at least ops × this."""
    p2p_latency_ms: float
    """Fixed cost of one pipeline send/recv (launch, handshake, synchronisation)."""
    tp_overlap_exposed_fraction: float | None = None
    """Issue #23: the share of the backward's asynchronous TP collectives that is not hidden behind the
    GEMM they overlap (Megatron-LM's column-parallel backward: the input-gradient all-reduce, or with sequence
    parallelism its reduce-scatter and the re-all-gather of the input, run beside the weight- / input-gradient
    GEMMs; memx.planner.runtime_terms.backward_tp_ms); conf/runtime/default.yaml sets 1.0 (every one exposed). None:
    the paper's formula (every backward TP collective blocks, the re-gather not counted)."""
    nic_efficiency: float | None = None
    """Achieved / line rate of a NIC between nodes (nccl-tests busbw across nodes ÷ NIC bandwidth): the closed
    form's inter-node hops run at this × line rate where the cluster YAML gives no `nic_efficiency` of its own
    (memx.planner.network.achieved; docs/planner.md §Network); conf/runtime/default.yaml sets 0.9. None: line
    rate, the paper's B."""


NUMBER_FIELDS = tuple(f.name for f in fields(RuntimeProfile) if f.name != "name")


def runtime_folder(conf_root: Path | None = None) -> Path:
    """conf_root/runtime, else the conf/runtime folder shipped beside the package."""
    return (conf_root or Path(__file__).resolve().parents[2] / "conf") / "runtime"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = parsed_yaml(path.read_text())
    except yaml_error() as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _entries(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """{field: value} from {field: {value, source}}; every number must name its source."""
    out = {}
    for key, entry in data.items():
        if key in _META_KEYS:
            continue
        if not (isinstance(entry, dict) and set(entry) == {"value", "source"} and str(entry["source"]).strip()):
            raise InputError(f"{path}: field '{key}' must be {{value: ..., source: \"...\"}} with a non-empty "
                             f"source; got {entry!r}. Allowed fields: {', '.join(NUMBER_FIELDS)}")
        out[key] = entry["value"]
    return out


def _merged(folder: Path, name: str) -> tuple[dict[str, Any], Path, dict[str, Path]]:
    """The entry's fields after following `extends` (child wins); the path of the entry itself; the file each field
    came from."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    current: str | None = name
    while current is not None:
        path = folder / f"{current}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml"))) or "(none)"
            raise InputError(f"{chain[-1][0] if chain else folder}: field 'extends': no runtime entry "
                             f"'{current}'; allowed: {known}")
        data = _read(path)
        chain.append((path, data))
        current = data.get("extends")
        if len(chain) > _MAX_EXTENDS:
            raise InputError(f"{path}: field 'extends': chain longer than {_MAX_EXTENDS} (a cycle?)")
    values: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for path, data in reversed(chain):
        got = _entries(path, data)
        values.update(got)
        origin.update(dict.fromkeys(got, path))
    return values, chain[0][0], origin


def _format(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid runtime entry"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        allowed = f" (allowed fields: {', '.join(NUMBER_FIELDS)})" if e["type"] == "unexpected_keyword_argument" else ""
        lines.append(f"  field '{loc}': {e['msg']}{allowed}; got {e.get('input')!r}")
    return "\n".join(lines)


def _check_ranges(path: Path, p: RuntimeProfile, origin: dict[str, Path]) -> None:
    bad = [f.name for f in fields(p) if f.name.endswith(("efficiency", "_large")) and getattr(p, f.name) is not None
           and not 0 < getattr(p, f.name) <= 1]
    bad += [f.name for f in fields(p) if isinstance(getattr(p, f.name), (int, float))
            and not isinstance(getattr(p, f.name), bool) and getattr(p, f.name) < 0]
    if bad:
        path = origin.get(sorted(bad)[0], path)  # the file that gives the value (an `extends` parent, maybe)
        raise InputError(f"{path}: field(s) {', '.join(sorted(set(bad)))} out of range: efficiencies must be in "
                         "(0, 1], sizes, counts and times ≥ 0")


@functools.lru_cache(maxsize=256)
def _load_entry(name: str, folder: str) -> RuntimeProfile:
    values, path, origin = _merged(Path(folder), name)
    try:
        profile = validated(RuntimeProfile, {"name": name, **values})  # cached: memx.domain.spec_cache
    except validation_error() as exc:
        raise InputError(_format(path, exc)) from exc
    _check_ranges(path, profile, origin)
    return profile


def load_runtime(gpu_name: str, vendor: str | None = None, conf_root: Path | None = None) -> RuntimeProfile:
    """The runtime profile of a GPU: conf/runtime/<gpu>.yaml, else <vendor>.yaml, else default.yaml."""
    folder = runtime_folder(conf_root)
    for name in (gpu_name, vendor, DEFAULT_ENTRY):
        if name and (folder / f"{name}.yaml").is_file():
            return _load_entry(name, str(folder.resolve()))
    raise InputError(f"no runtime entry for GPU '{gpu_name}' (vendor {vendor!r}) and no {folder / 'default.yaml'}")


def load_runtime_file(path: Path) -> RuntimeProfile:
    """A runtime entry by path (its `extends` resolved in the same folder)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such runtime file")
    return _load_entry(path.stem, str(path.parent.resolve()))


def usable_capacity_mib(gpu: GpuType, profile: RuntimeProfile | None = None) -> float:
    """The memory a training process on `gpu` can hold, MiB: the nominal memory of the GPU catalog less the
    driver reserve, i.e. the CUDA/HIP-reported total capacity (PyTorch's "total capacity" figures, cited per
    entry in conf/runtime) — what every measured peak (torch.cuda statistics, a process's total) is out of,
    so peaks, feasibility and margins compare like with like (docs/planner.md §Runtime terms).

    `profile`: the GPU's runtime profile; None (every planner path): the runtime catalog's entry of the GPU
    type (its name, else its vendor, else default.yaml: `load_runtime`), so the closed form, the learned model
    and the baselines — whatever their own profiles — are all held to the capacity of the same hardware."""
    reserve = (profile.driver_reserved_mib if profile is not None
               else _catalog_reserve_mib(gpu.name, gpu.vendor))
    return gpu.memory_mib - reserve


@functools.lru_cache(maxsize=256)
def _catalog_reserve_mib(gpu_name: str, vendor: str) -> float:
    """The packaged runtime catalog's driver reserve of a GPU type (looked up once per type: a search builds a
    pipeline per layout)."""
    return load_runtime(gpu_name, vendor).driver_reserved_mib
