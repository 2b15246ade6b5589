"""1F1B assembly: iteration time and per-GPU peak memory from per-stage predictions — the one
assembly both the search (thousands of plans per call) and `estimate_plans` (one column per plan) use.

Vectorised over plans, stage-major: per-stage arrays have shape (pp, N) — one row per stage, one
column per plan — so reductions over stages are element-wise operations on contiguous rows.
Formulas: the paper §3.1.2 and docs/architecture.md §1F1B assembly (its steady state either the paper's or the
maximum cycle mean, `steady_period_ms`, by SearchSpace.pipeline_assembly); the schedule itself is
PipeDream-Flush / 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", §2.2.1).
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from memx.domain.precision import DEFAULT_PRECISION, GRAD_BYTES, PARAM_BYTES
from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import DEFAULT_PIPELINE_ASSEMBLY, PIPELINE_ASSEMBLIES, Cluster, ModelArch, PipelineAssembly
from memx.planner.collectives import tail_collectives_ms
from memx.planner.cost import ACT_BYTES, dp_step_ms, optimizer_shards, static_bytes_per_param
from memx.planner.drain import drained_tail_ms
from memx.planner.interleave import interleaved_time_ms, p2p_hops


def inflight_micro_batches(pp: int, s: int, micro_batches: int) -> int:
    """1F1B: stage s holds min(pp − s, m) micro batches' activations at its peak (Narayanan et al.
    2021 §2.2.1: at most pp − s forward passes are outstanding; docs/architecture.md §1F1B assembly)."""
    return min(pp - s, micro_batches)


def p2p_ms(micro_batch: int, seq_len: int, hidden: int, bandwidth_gbps: np.ndarray, latency_ms) -> np.ndarray:
    """One activation (or its gradient) between stages: b·s·h·2 bytes / bandwidth + latency
    (docs/architecture.md §1F1B assembly)."""
    nbytes = micro_batch * seq_len * hidden * ACT_BYTES
    return nbytes / (np.asarray(bandwidth_gbps, dtype=np.float64) * 1e9) * 1e3 + latency_ms


def dp_allreduce_ms(params_per_rank: np.ndarray, dp: int, bandwidth_gbps: np.ndarray,
                    distributed_optimizer: bool = False, precision: str = DEFAULT_PRECISION) -> np.ndarray:
    """A stage's DP gradient step across its dp replicas: the T_dp term (paper §3.1.2; docs/architecture.md
    §1F1B assembly): ring all-reduce of fp32 grads, or with the distributed optimizer reduce-scatter +
    all-gather of bf16 params (memx.planner.cost.dp_step_ms)."""
    return dp_step_ms(params_per_rank, dp, bandwidth_gbps, distributed_optimizer, precision)


def optimizer_step_bytes(precision: str = DEFAULT_PRECISION) -> tuple[float, float]:
    """(bytes per parameter the rank holds, bytes per parameter it steps) that Megatron-LM's optimizer step moves —
    the 'fixed overhead' of the paper's 1F1B formula (§3.1.2), every pass memory-bound. Over the whole gradient
    buffer of g B/param (memx.domain.precision.GRAD_BYTES): `zero_grad_buffer` writes it before the forward, and
    the 1/dp pre-scaling reads and writes it before the reduction (megatron/core/distributed/
    param_and_grad_buffer.py start_grad_sync: `grad_data *= gradient_scaling_factor`, average_in_collective off by
    default; it skips a factor of 1, one data-parallel rank in the whole job, where the 2022 code of Korthikanti et
    al.'s runs divides always: megatron/model/distributed.py allreduce_gradients at 2755bcb — counted always, so a
    replica group of dp 1 in a larger job pays it too). Over the parameters the rank steps (all, or its 1/dp shard
    with the distributed optimizer): the gradient norm reads the fp32 main grads, 4 B (clip_grads.
    get_grad_norm_fp32; the clip's scale runs only when the norm exceeds --clip-grad: not counted); fused Adam reads
    the fp32 master weight, grad, m and v and writes master, m and v, 28 B (apex / Transformer Engine
    multi_tensor_adam); the master → model copy reads 4 B and writes the 16-bit weight
    (_copy_main_params_to_model_params, memx.domain.precision.PARAM_BYTES). fp16 adds the copy of the fp16 main grad
    to an fp32 one (2 + 4 B, _copy_model_grads_to_main_grads: `main_grad.float()`) and the loss-scale unscale + inf
    check over it (4 + 4 B, `_amp_foreach_non_finite_check_and_unscale_`) (megatron/core/optimizer/optimizer.py,
    MixedPrecisionOptimizer.prepare_grads / step_with_ready_grads). bf16: 3·4 + 38 = 50 B/param (was 2 × 18 =
    36 B: every state byte read and written once, our earlier assumption)."""
    held = 3.0 * GRAD_BYTES[precision]
    stepped = 4.0 + 28.0 + 4.0 + PARAM_BYTES[precision] + (6.0 + 8.0 if precision == "fp16" else 0.0)
    return held, stepped


def optimizer_ms(static_mib: np.ndarray, memory_bandwidth_gbps: np.ndarray, distributed_optimizer=False, dp=1,
                 precision: str = DEFAULT_PRECISION) -> np.ndarray:
    """The optimizer step of a rank whose static memory (weights, grads, optimizer state) is `static_mib`:
    `optimizer_step_bytes` over its parameters (static bytes / memx.planner.cost.static_bytes_per_param; a MoE
    stage's experts, sharded over fewer ranks, counted at the dense rate) at the memory bandwidth."""
    params = np.asarray(static_mib) * 1024.0 * 1024.0 / static_bytes_per_param(distributed_optimizer, dp, precision)
    held, stepped = optimizer_step_bytes(precision)
    nbytes = params * (held + stepped / optimizer_shards(distributed_optimizer, dp))
    return nbytes / (np.asarray(memory_bandwidth_gbps) * 1e9) * 1e3


def iteration_time_ms(stage_ms: np.ndarray, m: int, fixed_ms: float, tail_ms: np.ndarray,
                      loop_ms: np.ndarray | None = None, drain: bool = False) -> np.ndarray:
    """T = (m − 1)·c + Σ_s t_s + Σ_s 2·p2p_s + overhead + T_dp, c = max_s t_s (paper §3.1.2; the 1F1B
    bubble of Narayanan et al. 2021 §2.2.1; docs/architecture.md §1F1B assembly) or, with `loop_ms`, the maximum
    cycle mean `steady_period_ms` (pipeline_assembly cycle-mean, issues #22, #27).

    stage_ms (pp, N). fixed_ms: the per-plan constant, Σ_s 2·p2p_s (plus a calibrated per-iteration
    overhead, Pipeline.fixed_ms). tail_ms (pp, N) is each stage's gradient all-reduce plus optimizer
    step; the iteration ends when the slowest stage has done both, so overhead + T_dp = max_s tail_s
    (the largest stage's all-reduce and its optimizer step). loop_ms (pp − 1, N or 1): 2·p2p_s of each stage
    boundary in the stage times' dtype (Pipeline.loop_ms); None: the paper's max_s t_s. drain (pipeline_assembly
    cycle-mean-drain): max_s tail_s → max_s (tail_s − D_s), each stage's tail from its own last backward
    (memx.planner.drain.drained_tail_ms).
    """
    last = drained_tail_ms(stage_ms, tail_ms, loop_ms) if drain else tail_ms.max(axis=0)
    return (m - 1) * steady_period_ms(stage_ms, loop_ms) + stage_sum(stage_ms) + (fixed_ms + last)


def steady_period_ms(stage_ms: np.ndarray, loop_ms: np.ndarray | None = None) -> np.ndarray:
    """(N,) the steady-state time per micro batch of plain 1F1B. None: max_s t_s, the paper's (§3.1.2).

    With loop_ms (pp − 1, N or 1) = 2·p2p_s of each boundary: the maximum cycle mean of the schedule's timed
    event graph, the steady-state cycle time of a max-plus linear system (Baccelli, Cohen, Olsder & Quadrat 1992,
    "Synchronization and Linearity", Thm 3.23). In Megatron's 1F1B order (Narayanan et al. 2021 §2.2.1, Fig. 4)
    stage s runs B(j) then F(j + pp − s), whose activation reaches stage s + 1 after p2p_s; there that forward is
    followed by B(j + 2), whose gradient is back after p2p_s for stage s's B(j + 2): a loop of t_s + t_{s+1} +
    2·p2p_s over two micro batches. Over a contiguous range of stages a..e the loop runs down and back up,
    e − a + 1 micro batches: c = max over a ≤ e of (Σ_{a..e} t_i + 2·Σ_{a..e−1} p2p_i) / (e − a + 1), ranges of
    one stage giving max_s t_s, so c ≥ the paper's (its T is a lower bound of this one: memx.planner.bounds
    stays exact). Window sums grow one stage at a time (no prefix-sum cancellation), element-wise per column:
    a column's value is the same in any batch (see stage_sum). Zero rows (stages a layout does not have, with
    loop 0) only lower a window's mean. Float arrays only (the stage times' dtype)."""
    tmax = stage_ms.max(axis=0)
    pp = stage_ms.shape[0]
    if loop_ms is None or pp < 2:
        return tmax
    step = loop_ms + stage_ms[1:]  # (pp − 1, N): 2·p2p_s + t_{s+1}, what a window gains going one stage down
    window, best = stage_ms[:-1], None
    for k in range(2, pp + 1):  # windows of k stages a..a+k−1, a = 0 … pp − k
        window = window[:pp - k + 1] + step[k - 2:]
        mean = (window / k).max(axis=0)
        best = mean if best is None else np.maximum(best, mean)
    # a window's computed mean is within pp·ε (relative) of its true one: a mean no further above max_s t_s is
    # taken as max_s t_s, so equal stages without p2p give the paper's value bit for bit
    above = best > tmax * (1 + pp * np.finfo(stage_ms.dtype).eps)
    return np.where(above, best, tmax)


def blocking_transfers(pp: int, micro_batches: int) -> int:
    """Activation / gradient transfers on the 1F1B critical path when send/recv block (Narayanan et al. 2021
    §2.2.1: in 1F1B every micro batch's forward activation and backward gradient cross each stage boundary,
    and a stage whose send/recv block cannot compute meanwhile): the fill and drain cross the pp − 1
    boundaries both ways, 2 (pp − 1), and each of the other m − 1 micro batches adds one receive and one send
    to the bottleneck stage's cycle, 2 (m − 1). None without a pipeline (pp = 1)."""
    return 0 if pp <= 1 else 2 * (pp - 1) + 2 * (micro_batches - 1)


def stage_sum(x: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Σ_s weight_s·x_s over the stage rows, added row by row: every column's result is bit-identical
    however many columns (plans) the batch has and however it is laid out in memory, so a plan
    scores the same in any batch (the exact search compares plans scored in different batches)."""
    out = x[0] * weight[0] if weight is not None else x[0].copy()
    for s in range(1, x.shape[0]):
        out += x[s] * weight[s] if weight is not None else x[s]
    return out


@dataclass(frozen=True, kw_only=True)
class MemoryStats:
    max_mib: np.ndarray  # M: the largest per-GPU peak
    variance_mib2: np.ndarray  # V: variance of per-GPU peaks (absolute MiB²)
    min_margin: np.ndarray  # smallest (capacity − peak) / capacity over GPUs

    def take(self, rows: np.ndarray) -> MemoryStats:
        return MemoryStats(max_mib=self.max_mib[rows], variance_mib2=self.variance_mib2[rows],
                           min_margin=self.min_margin[rows])


def memory_stats(stage_peak_mib: np.ndarray, gpu_weight: np.ndarray, capacity_mib: np.ndarray) -> MemoryStats:
    """M, V and the smallest margin over GPUs. Every GPU of a stage (its tp ranks, in each of the dp
    replicas) has the stage's peak, so V is the variance weighted by each stage's GPU count
    (paper §3.1.2; docs/architecture.md §Score: variance over GPUs, absolute MiB): V = E[(x − E[x])²],
    two-pass (no cancellation in float32), row by row (batch-independent, see stage_sum)."""
    w = (gpu_weight / gpu_weight.sum()).astype(stage_peak_mib.dtype)
    inv_cap = (1.0 / np.asarray(capacity_mib)).astype(stage_peak_mib.dtype)
    return weighted_memory_stats(stage_peak_mib, w, inv_cap[:, None])


def weighted_memory_stats(stage_peak_mib: np.ndarray, w: np.ndarray, inv_cap: np.ndarray) -> MemoryStats:
    """memory_stats from the normalised GPU weights w ((pp,), or (pp, N): per plan) and 1 / capacity ((pp, 1)
    or (pp, N)), in the peaks' dtype."""
    mean = stage_sum(stage_peak_mib, w)
    dev = stage_peak_mib - mean
    var = stage_sum(dev * dev, w)
    margin = 1.0 - (stage_peak_mib * inv_cap).max(axis=0)
    return MemoryStats(max_mib=stage_peak_mib.max(axis=0), variance_mib2=var, min_margin=margin)


def assemble_columns(stage_ms: np.ndarray, stage_mib: np.ndarray, tail_ms: np.ndarray, *, micro_batches: np.ndarray,
                     virtual_stages: np.ndarray, fixed_ms: np.ndarray, w: np.ndarray, inv_cap: np.ndarray,
                     loop_ms: np.ndarray | None = None, drain: np.ndarray | None = None) -> tuple[np.ndarray, MemoryStats]:
    """Pipeline.assemble of N plans of different layouts (their m, v, fixed_ms (N,), w, 1 / capacity (pp, N) and
    loop_ms (pp − 1, N) or None, in the stage arrays' dtype), the same arithmetic column by column: plain 1F1B
    (iteration_time_ms) or interleaved (memx.planner.interleave.interleaved_time_ms). Stages a layout does not
    have are rows of 0 time, 0 peak, 0 tail, 0 loop and weight 0, which change no sum, maximum, cycle mean
    or variance. drain (N,) bool: the columns assembled with pipeline_assembly cycle-mean-drain (plain 1F1B only);
    None: none."""
    total = stage_sum(stage_ms)
    tmax = stage_ms.max(axis=0)
    period = tmax if loop_ms is None else steady_period_ms(stage_ms, loop_ms)
    m, v = micro_batches, virtual_stages
    with np.errstate(invalid="ignore"):  # inf − inf in the branch a column does not take
        compute = np.where(v == 1, (m - 1) * period + total, m * tmax + (total - tmax) / v)
    last = tail_ms.max(axis=0)
    if drain is not None and drain.any():
        with np.errstate(invalid="ignore"):  # inf − inf in a column that does not drain
            last = np.where(drain & (v == 1), drained_tail_ms(stage_ms, tail_ms, loop_ms), last)
    return compute + (fixed_ms + last), weighted_memory_stats(stage_mib, w, inv_cap)


@dataclass(frozen=True, kw_only=True)
class AssemblyCalibration:
    """Corrections of the assembly's own terms fitted on measured plans (memx.learn.calibration, issue
    #16): c multiplies the communication and step terms (Σ 2·p2p + T_dp + optimizer), o is added once
    per iteration (launch, data loading, logging: what no stage measurement sees), d is a fixed cost of every
    blocking p2p transfer on the 1F1B critical path (`blocking_transfers`: per micro batch and stage boundary;
    a framework's send/recv set-up and synchronisation, which the bytes / bandwidth + latency of p2p_ms do not
    see). Identity: c 1, o 0, d 0. `pipeline_assembly` is not fitted: it is how plain 1F1B is assembled
    (memx.domain.specs.PIPELINE_ASSEMBLIES, SearchSpace.pipeline_assembly; `steady_period_ms`), carried here so
    that every path that scores with these terms (search, estimate_plans, per-stage dp, the calibration's fit)
    assembles alike."""

    comm_scale: float = 1.0
    overhead_ms: float = 0.0
    p2p_per_transfer_ms: float = 0.0
    pipeline_assembly: PipelineAssembly = DEFAULT_PIPELINE_ASSEMBLY


IDENTITY_ASSEMBLY = AssemblyCalibration()
CYCLE_MEAN = ("cycle-mean", "cycle-mean-drain")  # the assemblies whose steady state is the maximum cycle mean


def assembly_of(predictor, pipeline_assembly: str | None = None) -> AssemblyCalibration:
    """The assembly calibration a stage predictor carries (`predictor.assembly`, as a calibrated
    predictor does, also through a prediction cache); the identity for any other predictor. pipeline_assembly
    (a search's SearchSpace.pipeline_assembly): how it assembles plain 1F1B; None: as the predictor's."""
    found = getattr(predictor, "assembly", None)
    out = found if isinstance(found, AssemblyCalibration) else IDENTITY_ASSEMBLY
    if pipeline_assembly is None or pipeline_assembly == out.pipeline_assembly:
        return out
    if pipeline_assembly not in PIPELINE_ASSEMBLIES:
        raise ValueError(f"pipeline_assembly {pipeline_assembly!r}; allowed: {', '.join(PIPELINE_ASSEMBLIES)}")
    return dataclasses.replace(out, pipeline_assembly=pipeline_assembly)


def steady_loop_ms(assembly: AssemblyCalibration, boundary_p2p_ms, dtype=np.float64) -> np.ndarray | None:
    """(pp − 1, 1) 2·c·p2p_s of each stage boundary in `dtype`: the p2p time in the steady-state loops of
    `steady_period_ms` (c: the calibrated communication scale, as on Σ 2·p2p in the fixed term) when `assembly`
    assembles with the cycle mean and there is a boundary; None: the paper's max_s t_s."""
    if assembly.pipeline_assembly not in CYCLE_MEAN or boundary_p2p_ms is None or np.size(boundary_p2p_ms) == 0:
        return None
    return (2.0 * assembly.comm_scale * np.asarray(boundary_p2p_ms, dtype=np.float64)).astype(dtype).reshape(-1, 1)


def drains(assembly: AssemblyCalibration) -> bool:
    """Whether `assembly` starts each stage's tail at its own last backward (cycle-mean-drain, memx.planner.drain)."""
    return assembly.pipeline_assembly == "cycle-mean-drain"


class TailKey(NamedTuple):
    distributed_optimizer: bool
    dp: int
    precision: str
    comm_scale: float


def stage_tail_ms(static_mib: np.ndarray, params_per_rank: np.ndarray, memory_bandwidth_gbps: np.ndarray,
                  dp_gbps: np.ndarray, *, distributed_optimizer: bool, dp: int, precision: str,
                  comm_scale: float, collectives_ms: np.ndarray | None = None) -> np.ndarray:
    """Per stage (rows, with their bandwidths) and column: optimizer step + T_dp, the terms after the last
    backward, plus each row's step-level collectives (`collectives_ms`: the DP step's latency and the tied
    embedding's all-reduce, memx.planner.collectives.tail_collectives_ms; None: none) (×c, the calibrated
    communication scale)."""
    mbw, dbw = np.asarray(memory_bandwidth_gbps)[:, None], np.asarray(dp_gbps)[:, None]
    tail = optimizer_ms(static_mib, mbw, distributed_optimizer, dp, precision) \
        + dp_allreduce_ms(params_per_rank, dp, dbw, distributed_optimizer, precision)
    if collectives_ms is not None:
        tail = tail + np.asarray(collectives_ms, dtype=np.float64)[:, None]
    return tail if comm_scale == 1.0 else tail * comm_scale


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """Everything the 1F1B assembly needs of a layout besides the stage predictions."""

    micro_batches: int  # m
    p2p_total_ms: float  # Σ_s 2·p2p_s: each activation forward and its gradient backward
    gpu_weight: np.ndarray  # (pp,) GPUs per stage replica (tp)
    capacity_mib: np.ndarray  # (pp,) usable: nominal − driver reserve (memx.domain.runtime.usable_capacity_mib)
    memory_bandwidth_gbps: np.ndarray  # (pp,)
    dp: int
    dp_gbps: np.ndarray  # (pp,) bandwidth of each stage's DP all-reduce ring
    distributed_optimizer: bool = False  # DP step RS + AG, Adam on params/dp (memx.planner.cost)
    assembly: AssemblyCalibration = IDENTITY_ASSEMBLY  # calibrated c, o, d (memx.learn.calibration)
    virtual_stages: int = 1  # v model chunks per rank: interleaved 1F1B (memx.planner.interleave)
    precision: str = DEFAULT_PRECISION  # gradient bytes of the DP step, Adam's share of static bytes
    # (pp,) each stage's step-level collectives: DP latency, tied-embedding all-reduce (memx.planner.collectives)
    collectives_ms: np.ndarray | None = None
    # (pp − 1,) one p2p transfer over each stage boundary (p2p_ms), for the cycle-mean steady state; None: none known
    boundary_p2p_ms: np.ndarray | None = None

    def loop_ms(self, dtype=np.float64) -> np.ndarray | None:
        """`steady_loop_ms` of this plain-1F1B pipeline in `dtype`; None: the paper's assembly (or interleaved)."""
        return steady_loop_ms(self.assembly, self.boundary_p2p_ms, dtype) if self.virtual_stages == 1 else None

    @property
    def fixed_ms(self) -> float:
        """The per-plan constant of T: c·Σ_s 2·p2p_s + o + d·blocking_transfers(pp, m) (c 1, o 0, d 0 without a
        calibration: the paper's Σ_s 2·p2p_s); interleaved, every chunk boundary is a transfer: v× as many."""
        a = self.assembly
        d = a.p2p_per_transfer_ms * blocking_transfers(len(self.gpu_weight), self.micro_batches) * self.virtual_stages
        return a.comm_scale * self.p2p_total_ms + a.overhead_ms + d

    @property
    def stage_collectives_ms(self) -> np.ndarray:
        """(pp,) the step-level collectives of each stage's tail (`collectives_ms`; 0 where none is given)."""
        return np.zeros(len(self.gpu_weight)) if self.collectives_ms is None else np.asarray(self.collectives_ms)

    def tail_ms(self, static_mib: np.ndarray, params_per_rank: np.ndarray) -> np.ndarray:
        """Per stage (rows) and column: optimizer step + T_dp + the step-level collectives, the terms after the
        last backward."""
        return stage_tail_ms(static_mib, params_per_rank, self.memory_bandwidth_gbps, self.dp_gbps,
                             collectives_ms=self.stage_collectives_ms, **self.tail_key()._asdict())

    def tail_key(self) -> TailKey:
        """What tail_ms needs of the pipeline besides per-stage bandwidths: layouts that share it are computed
        together (memx.planner.tables.StackedTables)."""
        return TailKey(self.distributed_optimizer, self.dp, self.precision, self.assembly.comm_scale)

    def assemble(self, stage_ms: np.ndarray, stage_mib: np.ndarray, tail_ms: np.ndarray) -> tuple[np.ndarray, MemoryStats]:
        """(T, M/V/margin) of N plans from (pp, N) stage times, peaks and tails."""
        if self.virtual_stages > 1:  # interleaved 1F1B: the bubble shrinks v-fold (memx.planner.interleave)
            compute = interleaved_time_ms(stage_ms, stage_sum(stage_ms), self.micro_batches, self.virtual_stages)
            T = compute + (self.fixed_ms + tail_ms.max(axis=0))
        else:
            T = iteration_time_ms(stage_ms, self.micro_batches, self.fixed_ms, tail_ms, self.loop_ms(stage_ms.dtype),
                                  drains(self.assembly))
        return T, memory_stats(stage_mib, self.gpu_weight, self.capacity_mib)


def pipeline(cluster: Cluster, model: ModelArch, *, stage_gpus: Sequence[str], stage_tp: Sequence[int], dp: int,
             micro_batch: int, micro_batches: int, seq_len: int, p2p_gbps: Sequence[float],
             dp_gbps: Sequence[float], distributed_optimizer: bool = False,
             assembly: AssemblyCalibration = IDENTITY_ASSEMBLY,
             p2p_latency_ms: Sequence[float] | None = None, virtual_stages: int = 1,
             wrap_gbps: float | None = None, precision: str = DEFAULT_PRECISION,
             dp_latency_ms: Sequence[float] | None = None,
             embedding_link: tuple[float, float] | None = None, expert_parallel: int = 1,
             expert_links: Sequence[Sequence[float]] | None = None) -> Pipeline:
    """The Pipeline of a layout or plan on `cluster` (p2p_gbps and p2p_latency_ms: between stage s and s+1,
    memx.planner.space.plan_links; latency None: the cluster's inter-node latency on every boundary; `assembly`:
    the calibrated c, o and d of the predictor that scores it, memx.planner.schedule.assembly_of; `precision`:
    the plan's training precision, memx.domain.precision).
    Interleaved (virtual_stages v > 1; wrap_gbps: the link from the last stage back to the first), each
    boundary is crossed v times and the wrap v − 1 times (memx.planner.interleave.p2p_hops).
    dp_latency_ms (each stage's DP ring step latency) and embedding_link (GB/s, ms between the first and last
    stage's nodes; memx.planner.space.plan_links) give the tail's step-level collectives, with a MoE model's
    expert-gradient collective from expert_parallel and expert_links (memx.planner.moe.a2a_links; dp: the dp·cp
    ranks) (memx.planner.collectives.tail_collectives_ms); None: that term is left out."""
    types = {g.name: g for g in cluster.gpu_types}  # Cluster.gpu walks the nodes: once per layout, not per stage
    gpus = [types[g] for g in stage_gpus]
    lat = cluster.inter_node_latency_ms if p2p_latency_ms is None else np.asarray(p2p_latency_ms, dtype=np.float64)
    p2p = p2p_ms(micro_batch, seq_len, model.hidden, np.asarray(p2p_gbps), lat)
    total = float(2.0 * p2p.sum())
    if virtual_stages > 1:
        hops, wrap_hops = p2p_hops(len(stage_gpus), virtual_stages)
        wrap_lat = float(np.max(lat)) if np.size(lat) else cluster.inter_node_latency_ms  # the wrap: a boundary's latency
        wrap = p2p_ms(micro_batch, seq_len, model.hidden, np.asarray([wrap_gbps]), wrap_lat)
        total = hops * total + wrap_hops * float(2.0 * wrap.sum())
    return Pipeline(micro_batches=micro_batches, p2p_total_ms=total, virtual_stages=virtual_stages,
                    boundary_p2p_ms=np.atleast_1d(np.asarray(p2p, dtype=np.float64)) if virtual_stages == 1 else None,
                    gpu_weight=np.asarray(stage_tp, dtype=np.float64),
                    capacity_mib=np.asarray([usable_capacity_mib(g) for g in gpus], dtype=np.float64),
                    memory_bandwidth_gbps=np.asarray([g.memory_bandwidth_gbps for g in gpus], dtype=np.float64),
                    dp=dp, dp_gbps=np.asarray(dp_gbps, dtype=np.float64), distributed_optimizer=distributed_optimizer,
                    assembly=assembly, precision=precision,
                    collectives_ms=tail_collectives_ms(model, stage_tp=stage_tp, dp=dp, virtual_stages=virtual_stages,
                                                       precision=precision, dp_latency=dp_latency_ms,
                                                       emb_link=embedding_link, expert_parallel=expert_parallel,
                                                       expert_links=expert_links))
