"""Per-GPU-type traits beyond the spec sheet: the simulator's own catalog (conf/simulator/*.yaml).

A spec sheet gives peak FLOPS, memory and link bandwidth. What a training step actually achieves on
a part depends on more: how close large GEMMs get to peak and how fast that falls for small ones,
whether the software stack has fused (flash) attention, how well memory-bound kernels use the
bandwidth, what the framework and allocator keep, how well links are used, kernel launch cost,
how much recomputation costs there, and how noisy a measurement is. These numbers live here, one
YAML per GPU name, with `default.yaml` for GPUs that have none. They are simulator inputs only:
the planner never reads them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

from annotated_types import Ge, Interval, Le

from memx.domain.catalog import catalog_roots, parse_yaml
from memx.domain.errors import InputError, short_repr
from memx.domain.specs import MAX_GPU_MEMORY_MIB, MAX_LATENCY_MS, GpuName, GpuType, gpu_name_problem
from memx.domain.validation import check_spec

DEFAULT_TRAITS = "default"
MAX_HALF_EFFICIENCY_GFLOP = 1.0e6  # a GEMM of 1 PFLOP; real half-efficiency sizes are 1–100 GFLOP
MAX_RECOMPUTE_PENALTY = 100.0  # a recomputed forward at most 100× its first forward (real: ~1)
Fraction = Annotated[float, Interval(gt=0, le=1)]  # an achieved share of a nominal peak
Milliseconds = Annotated[float, Ge(0), Le(MAX_LATENCY_MS)]  # a fixed overhead, ms (≤ 1,000)


@dataclass(frozen=True, kw_only=True)
class GpuTraits:
    """What one GPU type achieves in training, beyond its spec sheet (all simulator assumptions,
    calibrated where published measurements exist; see docs/simulator.md). Constraints are checked
    at construction; conf/simulator YAML is validated against this type (`catalog.parse_yaml`)."""

    __pydantic_config__ = {"extra": "forbid", "allow_inf_nan": False}  # read by pydantic at the YAML edge

    name: GpuName
    """GPU catalog name, or `default`."""
    gemm_efficiency_large: Fraction
    """Achieved fraction of peak on large GEMMs."""
    gemm_half_efficiency_gflop: Annotated[float, Ge(0), Le(MAX_HALF_EFFICIENCY_GFLOP)]
    """GEMM size (GFLOP) at which efficiency is half the large value (≤ 1e6)."""
    flash_attention: bool
    """Fused attention kernel; False: eager attention storing the s² scores."""
    attention_efficiency: Fraction
    """Fraction of peak a fused attention kernel achieves."""
    memory_bound_efficiency: Fraction
    """Fraction of memory bandwidth elementwise kernels achieve."""
    context_memory_mib: Annotated[float, Ge(0), Le(MAX_GPU_MEMORY_MIB)]
    """CUDA/ROCm context, NCCL/HCCL buffers, workspace held on every GPU, MiB."""
    driver_reserved_mib: Annotated[float, Ge(0), Le(MAX_GPU_MEMORY_MIB)]
    """Device memory a process never gets: nominal memory − the driver-reported total (ECC, driver, firmware), MiB;
    the part's OOM threshold is nominal − this (`capacity_mib`)."""
    fragmentation_fraction: Annotated[float, Interval(ge=0, lt=1)]
    """Caching-allocator overhead, as a fraction of allocated bytes."""
    link_efficiency: Fraction
    """Achieved fraction of nominal link bandwidth by collectives / p2p."""
    collective_step_latency_ms: Milliseconds
    """Latency of one ring step (one hop of a collective), ms."""
    kernel_launch_overhead_ms: Milliseconds
    """Device-side gap + tail per kernel, ms."""
    host_dispatch_ms_per_kernel: Milliseconds
    """Host (framework) time to issue one operation, ms: the host-bound floor."""
    p2p_overhead_ms: Milliseconds
    """Fixed cost of one stage-to-stage send/recv (setup, host sync), ms."""
    recompute_penalty_factor: Annotated[float, Ge(1), Le(MAX_RECOMPUTE_PENALTY)]
    """A recomputed forward costs this × its first forward (paper §3.1.1)."""
    optimizer_efficiency: Fraction
    """Fraction of memory bandwidth the fused Adam step achieves."""
    noise_std_fraction: Annotated[float, Interval(ge=0, lt=0.5)]
    """Std-dev of per-micro-batch time noise, as a fraction of the time."""

    def __post_init__(self) -> None:
        check_spec(self)

    def capacity_mib(self, gpu: GpuType) -> float:
        """What a process on `gpu` can allocate, MiB: the spec sheet's memory less the driver reserve, the total a
        real device reports (torch.cuda.mem_get_info) and runs out of memory at (docs/simulator.md §Memory)."""
        return gpu.memory_mib - self.driver_reserved_mib


def traits_folder(conf_root: Path | None = None) -> Path:
    """The first catalog folder (the user's over $MEMX_HOME/conf over the packaged conf/) with simulator traits."""
    roots = catalog_roots(conf_root)
    return next((r / "simulator" for r in roots if (r / "simulator").is_dir()), roots[-1] / "simulator")


@functools.lru_cache(maxsize=256)
def _load_cached(gpu_name: str, folder: str) -> GpuTraits:
    base = Path(folder)
    path = base / f"{gpu_name}.yaml"
    if path.is_file():
        return parse_yaml(GpuTraits, path)
    fallback = base / f"{DEFAULT_TRAITS}.yaml"
    if not fallback.is_file():
        raise InputError(f"no simulator traits for GPU '{gpu_name}' and no {fallback}")
    return parse_yaml(GpuTraits, fallback)


def load_traits(gpu_name: str, conf_root: Path | None = None) -> GpuTraits:
    """Traits of `gpu_name` from conf/simulator/NAME.yaml, else conf/simulator/default.yaml.

    `gpu_name` names a file: it must be a catalog GPU name (`GPU_NAME_PATTERN`), never a path."""
    if problem := gpu_name_problem(gpu_name):
        raise InputError(f"simulator traits: GPU name {short_repr(gpu_name)}: {problem}")
    return _load_cached(gpu_name, str(traits_folder(conf_root).resolve()))


def traits_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(GpuTraits))
