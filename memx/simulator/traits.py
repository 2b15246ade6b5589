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

from pydantic import BaseModel, ConfigDict, Field

from memx.domain.catalog import default_conf_root, parse_yaml
from memx.domain.errors import InputError

DEFAULT_TRAITS = "default"


@dataclass(frozen=True, kw_only=True)
class GpuTraits:
    """What one GPU type achieves in training, beyond its spec sheet (all simulator assumptions,
    calibrated where published measurements exist; see docs/simulator.md)."""

    name: str
    gemm_efficiency_large: float  # achieved fraction of peak on large GEMMs
    gemm_half_efficiency_gflop: float  # GEMM size (GFLOP) at which efficiency is half the large value
    flash_attention: bool  # fused attention kernel; False: eager attention storing the s² scores
    attention_efficiency: float  # fraction of peak a fused attention kernel achieves
    memory_bound_efficiency: float  # fraction of memory bandwidth elementwise kernels achieve
    context_memory_mib: float  # CUDA/ROCm context, NCCL/HCCL buffers, workspace: held on every GPU
    fragmentation_fraction: float  # caching-allocator overhead, as a fraction of allocated bytes
    link_efficiency: float  # achieved fraction of nominal link bandwidth by collectives / p2p
    collective_step_latency_ms: float  # latency of one ring step (one hop of a collective)
    kernel_launch_overhead_ms: float  # device-side gap + tail per kernel
    host_dispatch_ms_per_kernel: float  # host (framework) time to issue one operation: the host-bound floor
    p2p_overhead_ms: float  # fixed cost of one stage-to-stage send/recv (setup, host sync)
    recompute_penalty_factor: float  # recomputed forward costs this × its first forward (paper §3.1.1)
    optimizer_efficiency: float  # fraction of memory bandwidth the fused Adam step achieves
    noise_std_fraction: float  # std-dev of per-micro-batch time noise, as a fraction of the time


class _TraitsYaml(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gemm_efficiency_large: float = Field(gt=0, le=1)
    gemm_half_efficiency_gflop: float = Field(ge=0)
    flash_attention: bool
    attention_efficiency: float = Field(gt=0, le=1)
    memory_bound_efficiency: float = Field(gt=0, le=1)
    context_memory_mib: float = Field(ge=0)
    fragmentation_fraction: float = Field(ge=0, lt=1)
    link_efficiency: float = Field(gt=0, le=1)
    collective_step_latency_ms: float = Field(ge=0)
    kernel_launch_overhead_ms: float = Field(ge=0)
    host_dispatch_ms_per_kernel: float = Field(ge=0)
    p2p_overhead_ms: float = Field(ge=0)
    recompute_penalty_factor: float = Field(ge=1)
    optimizer_efficiency: float = Field(gt=0, le=1)
    noise_std_fraction: float = Field(ge=0, lt=0.5)
    notes: str | None = None


def traits_folder(conf_root: Path | None = None) -> Path:
    return (conf_root or default_conf_root()) / "simulator"


def _parse(path: Path) -> GpuTraits:
    y = parse_yaml(_TraitsYaml, path)
    return GpuTraits(**y.model_dump(exclude={"notes"}))


@functools.lru_cache(maxsize=256)
def _load_cached(gpu_name: str, folder: str) -> GpuTraits:
    base = Path(folder)
    path = base / f"{gpu_name}.yaml"
    if path.is_file():
        return _parse(path)
    fallback = base / f"{DEFAULT_TRAITS}.yaml"
    if not fallback.is_file():
        raise InputError(f"no simulator traits for GPU '{gpu_name}' and no {fallback}")
    return _parse(fallback)


def load_traits(gpu_name: str, conf_root: Path | None = None) -> GpuTraits:
    """Traits of `gpu_name` from conf/simulator/NAME.yaml, else conf/simulator/default.yaml."""
    return _load_cached(gpu_name, str(traits_folder(conf_root).resolve()))


def traits_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(GpuTraits))
