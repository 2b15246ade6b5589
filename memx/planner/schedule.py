"""1F1B assembly: iteration time and per-GPU peak memory from per-stage predictions.

Vectorised over plans, stage-major: per-stage arrays have shape (pp, N) — one row per stage, one
column per plan — so reductions over stages are element-wise operations on contiguous rows. DESIGN.md §4 and the paper §3.1.2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memx.planner.cost import ACT_BYTES, GRAD_BYTES_PER_PARAM, ring_allreduce_ms


def p2p_ms(micro_batch: int, seq_len: int, hidden: int, bandwidth_gbps: np.ndarray, latency_ms: float) -> np.ndarray:
    """One activation (or its gradient) between stages: b·s·h·2 bytes / bandwidth + latency
    (DESIGN.md §4)."""
    nbytes = micro_batch * seq_len * hidden * ACT_BYTES
    return nbytes / (np.asarray(bandwidth_gbps, dtype=np.float64) * 1e9) * 1e3 + latency_ms


def dp_allreduce_ms(params_per_rank: np.ndarray, dp: int, bandwidth_gbps: np.ndarray) -> np.ndarray:
    """Ring all-reduce of a stage's fp32 gradients across its dp replicas (DESIGN.md §4)."""
    return ring_allreduce_ms(params_per_rank * GRAD_BYTES_PER_PARAM, dp, bandwidth_gbps)


def optimizer_ms(static_mib: np.ndarray, memory_bandwidth_gbps: np.ndarray) -> np.ndarray:
    """Adam step: memory-bound; reads and writes every optimizer-state byte once (our assumption,
    the 'fixed overhead' of the paper's 1F1B formula, §3.1.2)."""
    return 2.0 * static_mib * 1024.0 * 1024.0 / (np.asarray(memory_bandwidth_gbps) * 1e9) * 1e3


def iteration_time_ms(stage_ms: np.ndarray, m: int, p2p_total_ms: float, tail_ms: np.ndarray) -> np.ndarray:
    """T = (m − 1)·max_s t_s + Σ_s t_s + Σ_s 2·p2p_s + overhead + T_dp (paper §3.1.2, DESIGN.md §4).

    stage_ms (pp, N). tail_ms (pp, N) is each stage's gradient all-reduce plus optimizer step; the
    iteration ends when the slowest stage has done both, so overhead + T_dp = max_s tail_s (the
    largest stage's all-reduce, as DESIGN.md says, and its optimizer step).
    """
    return (m - 1) * stage_ms.max(axis=0) + stage_ms.sum(axis=0) + (p2p_total_ms + tail_ms.max(axis=0))


@dataclass(frozen=True, kw_only=True)
class MemoryStats:
    max_mib: np.ndarray  # M: the largest per-GPU peak
    variance_mib2: np.ndarray  # V: variance of per-GPU peaks (absolute MiB²)
    min_margin: np.ndarray  # smallest (capacity − peak) / capacity over GPUs


def memory_stats(stage_peak_mib: np.ndarray, gpu_weight: np.ndarray, capacity_mib: np.ndarray) -> MemoryStats:
    """M, V and the smallest margin over GPUs. Every GPU of a stage (its tp ranks, in each of the dp
    replicas) has the stage's peak, so V is the variance weighted by each stage's GPU count
    (DESIGN.md §4: variance over GPUs, absolute MiB): V = E[x²] − E[x]²."""
    w = (gpu_weight / gpu_weight.sum()).astype(stage_peak_mib.dtype)
    mean = w @ stage_peak_mib
    var = np.maximum(w @ (stage_peak_mib * stage_peak_mib) - mean * mean, 0.0)
    inv_cap = (1.0 / np.asarray(capacity_mib)).astype(stage_peak_mib.dtype)
    margin = 1.0 - (stage_peak_mib * inv_cap[:, None]).max(axis=0)
    return MemoryStats(max_mib=stage_peak_mib.max(axis=0), variance_mib2=var, min_margin=margin)
