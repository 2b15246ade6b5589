"""One pipeline stage alone on `tp` GPUs of one type: time of one micro batch and peak memory.

Input is a stage signature (the stage_runs input columns, docs/architecture.md §Measurement records); output a `StageRun` with what a
real single-stage run would report: forward+backward time of one micro batch (with measurement
noise), static memory and the device peak with `inflight` micro batches' activations held. A peak
above the GPU's capacity is an OOM: no numbers, like a crashed run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from memx.domain.errors import InputError, short_repr
from memx.domain.plan import PLAN_RECOMPUTE, Recompute
from memx.simulator.physics import Device, Dims, embedding_cost, layer_cost, output_cost, adam_step_ms
from memx.simulator.traits import GpuTraits
from memx.domain.specs import (MAX_CLUSTER_GPUS, MAX_HEADS, MAX_LAYERS, MAX_MICRO_BATCH, MAX_SEQ_LEN, MAX_TP,
                               MAX_VOCAB, MAX_WIDTH, GpuType)

MIB = 1024.0 * 1024.0
STAGE_RECOMPUTE = PLAN_RECOMPUTE  # a stage's recompute: the plan JSON's values
# bf16 weights 2 + fp32 main grads 4: held whole on every data-parallel rank, with or without the
# distributed optimizer (Megatron-LM docs, "Distributed Optimizer": bf16 params, fp32 grads → 6 + 12/d)
REPLICATED_BYTES_PER_PARAM = 6.0
# + fp32 master weights 4 + Adam m 4, v 4 = 18 B (Megatron-LM docs, non-distributed: 18; ZeRO §3.1: 16 B + 2 B)
ADAM_STATIC_BYTES_PER_PARAM = 18.0
# Per training precision (issue #23): (bytes added to the bf16 total, bytes kept on every dp rank). fp16 mixed
# precision (Micikevicius et al. 2018 §3.1) holds fp16 weights 2 + fp16 grads 2 on every rank, and the
# optimizer fp32 main grads 4 + master 4 + m 4 + v 4: 20 B, 4 + 16/d with the distributed optimizer
# (Megatron-LM docs, "Distributed Optimizer", float16 params / float16 grads row). fp8 (Transformer
# Engine) keeps bf16 weights and fp32 grads: bf16's bytes.
PRECISION_STATIC = {"bf16": (0.0, REPLICATED_BYTES_PER_PARAM), "fp8": (0.0, REPLICATED_BYTES_PER_PARAM),
                    "fp16": (2.0, 4.0)}


@dataclass(frozen=True, kw_only=True)
class StageSignature:
    """The stage_runs input columns (docs/architecture.md §Measurement records)."""

    gpu: str
    tp: int
    layers: int
    micro_batch: int
    seq_len: int
    recompute: str
    recompute_layers: int | None
    first: bool
    last: bool
    inflight: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    vocab: int
    mlp: str
    # Job options that change a stage's cost (plan-level in the plan JSON); defaults = what older
    # signatures meant (memx.domain.records.OPTION_DEFAULTS: older stage_runs rows take them).
    distributed_optimizer: bool = False  # Adam states and fp32 master params sharded over `dp` (ZeRO-1)
    dp: int = 1  # data-parallel size of the stage: the sharding factor of the distributed optimizer
    sequence_parallel: bool = False  # Megatron SP; no effect at tp = 1
    # The model's input embedding and output layer share one weight (GPT-2 style). A stage that holds both ends
    # (pp = 1) then keeps that one weight, its gradient and optimizer state once; a last stage without the first
    # keeps its own copy of it (the other end's is on stage 0), as an untied output layer would.
    tied_embeddings: bool = False
    precision: str = "bf16"  # training precision (bf16 | fp16 | fp8): GEMM peak, static and gradient bytes

    @property
    def recomputed_layers(self) -> int:
        """Layers recomputed in full; with `recompute_layers` the first N (Megatron block method)."""
        if self.recompute != Recompute.FULL:
            return 0
        return self.layers if self.recompute_layers is None else self.recompute_layers

    def dims(self) -> Dims:
        return Dims(micro_batch=self.micro_batch, seq_len=self.seq_len, hidden=self.hidden,
                    ffn_hidden=self.ffn_hidden, heads=self.heads, query_groups=self.query_groups,
                    vocab=self.vocab, mlp=self.mlp, tp=self.tp, sequence_parallel=self.sequence_parallel)

    @property
    def optimizer_shards(self) -> int:
        """Ranks the optimizer states are split over: dp with the distributed optimizer, else 1."""
        return self.dp if self.distributed_optimizer else 1

    def options_in_effect(self) -> tuple[str, ...]:
        """The option fields that change this stage's cost (set, and not a no-op)."""
        out = ("distributed_optimizer", "dp") if self.distributed_optimizer and self.dp > 1 else ()
        out += ("precision",) if self.precision != "bf16" else ()
        return out + (("sequence_parallel",) if self.sequence_parallel and self.tp > 1 else ())

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


OPTION_FIELDS = ("distributed_optimizer", "dp", "sequence_parallel", "tied_embeddings", "precision")  # optional
SIGNATURE_FIELDS = tuple(f.name for f in fields(StageSignature))  # the stage_runs signature columns
_INT_FIELDS = ("tp", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads", "query_groups", "vocab")
# Upper bounds at the edge (memx.domain.specs §bounds): a signature the catalogs could never produce is bad
# input, never an overflow inside the physics or an "oom" answer for 10^12 layers.
_MAX = {"tp": MAX_TP, "layers": MAX_LAYERS, "recompute_layers": MAX_LAYERS, "micro_batch": MAX_MICRO_BATCH,
        "seq_len": MAX_SEQ_LEN, "inflight": MAX_LAYERS, "hidden": MAX_WIDTH, "ffn_hidden": MAX_WIDTH,
        "heads": MAX_HEADS, "query_groups": MAX_HEADS, "vocab": MAX_VOCAB, "dp": MAX_CLUSTER_GPUS}


def _as_int(field: str, given: Any, minimum: int) -> int:
    value = given
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    top = _MAX[field]
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum
            or value > top):
        raise InputError(f"stage signature: field '{field}' must be an integer in {minimum}..{top:,}, "
                         f"got {short_repr(given)}")
    return int(value)


def _as_bool(field: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InputError(f"stage signature: field '{field}' must be true or false, got {value!r}")


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def signature_from_dict(data: Mapping[str, Any]) -> StageSignature:
    """Parse and check a stage signature; InputError names the field."""
    if not isinstance(data, Mapping):
        raise InputError(f"stage signature: must be a JSON object, got {type(data).__name__}")
    missing = [f for f in SIGNATURE_FIELDS if f not in data and f != "recompute_layers"
               and f not in OPTION_FIELDS]  # options may be absent
    if missing:
        raise InputError(f"stage signature: missing field(s) {', '.join(missing)}")
    values: dict[str, Any] = {name: _as_int(name, data[name], 1) for name in _INT_FIELDS}
    values["layers"] = _as_int("layers", data["layers"], 0)
    values["first"], values["last"] = _as_bool("first", data["first"]), _as_bool("last", data["last"])
    values["gpu"] = str(data["gpu"])
    values["recompute"] = str(data["recompute"])
    values["mlp"] = str(data["mlp"])
    rl = data.get("recompute_layers")
    values["recompute_layers"] = None if _is_missing(rl) else _as_int("recompute_layers", rl, 0)
    for name in ("distributed_optimizer", "sequence_parallel", "tied_embeddings"):
        if not _is_missing(data.get(name)):
            values[name] = _as_bool(name, data[name])
    if not _is_missing(data.get("dp")):
        values["dp"] = _as_int("dp", data["dp"], 1)
    if not _is_missing(data.get("precision")):
        values["precision"] = data["precision"]
    sig = StageSignature(**values)
    _check(sig)
    return sig


def _check(sig: StageSignature) -> None:
    problems = []
    if sig.recompute not in STAGE_RECOMPUTE:
        problems.append(f"field 'recompute' is {sig.recompute!r}; allowed: {', '.join(STAGE_RECOMPUTE)}")
    if sig.recompute_layers is not None and (sig.recompute != Recompute.FULL or sig.recompute_layers > sig.layers):
        problems.append(f"field 'recompute_layers' ({sig.recompute_layers}) needs recompute 'full' and "
                        f"at most 'layers' ({sig.layers})")
    if sig.mlp not in ("swiglu", "gelu"):
        problems.append(f"field 'mlp' is {sig.mlp!r}; allowed: swiglu, gelu")
    if sig.precision not in PRECISION_STATIC:
        problems.append(f"field 'precision' is {sig.precision!r}; allowed: {', '.join(PRECISION_STATIC)}")
    if sig.hidden % sig.heads or sig.heads % sig.query_groups:
        problems.append(f"field 'heads' ({sig.heads}) must divide 'hidden' ({sig.hidden}) and be a multiple "
                        f"of 'query_groups' ({sig.query_groups})")
    if sig.heads % sig.tp or sig.query_groups % sig.tp:
        problems.append(f"field 'tp' ({sig.tp}) must divide heads ({sig.heads}) and query_groups ({sig.query_groups})")
    if sig.layers == 0 and not (sig.first or sig.last):
        problems.append("field 'layers' is 0: the stage must then hold the embedding ('first') or output ('last')")
    if problems:
        raise InputError("stage signature: " + "; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class StageCost:
    """Noise-free cost of a stage (per GPU of its TP group); the schedule adds noise per micro batch."""

    fwd_ms: float
    bwd_ms: float  # includes recomputation
    optimizer_ms: float
    params: float  # per GPU
    static_mem_mib: float
    act_mem_mib: float  # activations kept per in-flight micro batch
    workspace_mem_mib: float  # transient during backward
    context_mem_mib: float
    fragmentation_fraction: float
    capacity_mib: float

    @property
    def time_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms

    def peak_mem_mib(self, inflight: int) -> float:
        """Device peak: context + (static + inflight·activations + workspace)·(1 + fragmentation)
        (simulator assumption: the caching allocator's overhead grows with what it holds)."""
        allocated = self.static_mem_mib + inflight * self.act_mem_mib + self.workspace_mem_mib
        return self.context_mem_mib + allocated * (1.0 + self.fragmentation_fraction)


@dataclass(frozen=True, kw_only=True)
class StageRun:
    """What one measured stage run reports; numbers are None when it failed (status 'oom')."""

    time_ms: float | None
    peak_mem_mib: float | None
    static_mem_mib: float | None
    status: str  # ok | oom
    reason: str


def static_bytes_per_param_of(sig: StageSignature, static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM) -> float:
    """Static bytes per parameter on one GPU. The bytes beyond the 6 B of bf16 weights + fp32 main grads
    are optimizer state (fp32 master params + Adam m, v); the distributed optimizer keeps 1/dp of them:
    6 + 12/dp for Adam (Megatron-LM docs, "Distributed Optimizer"; ZeRO-1, Rajbhandari et al. 2020 §5).
    A lowered `static_bytes_per_param` (optimizer offloaded, e.g. 4) has no state left to shard. The
    precision moves both (PRECISION_STATIC): fp16 20 B, 4 + 16/dp."""
    extra, replicated = PRECISION_STATIC[sig.precision]
    total = static_bytes_per_param + extra
    states = max(total - replicated, 0.0)
    return total - states + states / sig.optimizer_shards


@functools.lru_cache(maxsize=65536)
def stage_cost(sig: StageSignature, gpu: GpuType, traits: GpuTraits,
               static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM) -> StageCost:
    dev, d = Device.of(gpu, traits, sig.precision), sig.dims()
    fwd = bwd = params = act = workspace = 0.0
    fwd_ops = bwd_ops = 0
    comm_fwd = comm_bwd = 0.0  # TP collectives: on the critical path, never hidden behind host dispatch
    if sig.layers:
        lc = layer_cost(dev, d)
        n_full, pen = sig.recomputed_layers, traits.recompute_penalty_factor
        n_sel = sig.layers if sig.recompute == Recompute.SELECTIVE else 0
        kept = lc.act_selective_bytes if n_sel else lc.act_none_bytes
        fwd += sig.layers * lc.fwd_ms
        # recomputation reruns forward work inside backward at the part's recompute penalty (paper §3.1.1):
        # full = the whole layer (Chen 2016), selective = the attention core only (Korthikanti 2022 §5)
        bwd += sig.layers * lc.bwd_ms + pen * (n_full * lc.fwd_ms + n_sel * lc.attn_core_fwd_ms)
        comm_fwd += sig.layers * lc.comm_ms
        comm_bwd += (sig.layers + pen * n_full) * lc.comm_ms + sig.layers * lc.regather_ms
        fwd_ops += sig.layers * lc.fwd_kernels
        bwd_ops += sig.layers * lc.bwd_kernels + n_full * lc.fwd_kernels + n_sel * lc.attn_core_kernels
        params += sig.layers * lc.params
        act += n_full * lc.act_full_bytes + (sig.layers - n_full) * kept
        # while a recomputed layer runs its backward its full activations are alive again
        workspace = lc.workspace_bytes + (lc.act_none_bytes if sig.recompute != Recompute.NONE else 0.0)
    ends = [embedding_cost(dev, d)] if sig.first else []
    # tied with both ends on this stage: the output layer multiplies by the embedding's weight, held once
    ends += [output_cost(dev, d, owns_weight=not (sig.tied_embeddings and sig.first))] if sig.last else []
    for ec in ends:
        fwd, bwd, params, act = fwd + ec.fwd_ms, bwd + ec.bwd_ms, params + ec.params, act + ec.act_bytes
        fwd_ops, bwd_ops = fwd_ops + ec.fwd_kernels, bwd_ops + ec.bwd_kernels
        comm_fwd, comm_bwd = comm_fwd + ec.comm_ms, comm_bwd + ec.bwd_comm_ms
        workspace = max(workspace, ec.workspace_bytes)
    # the host issues operations asynchronously: a pass takes the longer of device compute and host
    # dispatch, plus the blocking TP collectives, which wait for the slowest rank's host (simulator
    # assumption; small layers are host-bound, e.g. vTrain's 1024-wide models)
    host = traits.host_dispatch_ms_per_kernel
    fwd = max(fwd - comm_fwd, fwd_ops * host) + comm_fwd
    bwd = max(bwd - comm_bwd, bwd_ops * host) + comm_bwd
    return StageCost(
        fwd_ms=fwd,
        bwd_ms=bwd,
        optimizer_ms=adam_step_ms(dev, params / sig.optimizer_shards),  # each rank updates its shard (ZeRO §5)
        params=params,
        static_mem_mib=params * static_bytes_per_param_of(sig, static_bytes_per_param) / MIB,
        act_mem_mib=act / MIB,
        workspace_mem_mib=workspace / MIB,
        context_mem_mib=traits.context_memory_mib,
        fragmentation_fraction=traits.fragmentation_fraction,
        capacity_mib=traits.capacity_mib(gpu),
    )


def noise_factor(rng: np.random.Generator, std_fraction: float, size: Any = None) -> Any:
    """Multiplicative measurement noise 1 + N(0, σ), clipped at 0.5 (simulator assumption)."""
    return np.maximum(0.5, 1.0 + std_fraction * rng.standard_normal(size))


def measure_stage(sig: StageSignature, gpu: GpuType, traits: GpuTraits, *, rng: np.random.Generator,
                  static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM) -> StageRun:
    """Run one stage alone: time with noise, peak memory with `inflight` micro batches held."""
    if sig.gpu != gpu.name:
        raise InputError(f"stage signature: field 'gpu' is {sig.gpu!r} but the GPU given is {gpu.name!r}")
    return run_of(stage_cost(sig, gpu, traits, static_bytes_per_param), sig, gpu, traits, rng=rng)


def run_of(cost: StageCost, sig: StageSignature, gpu: GpuType, traits: GpuTraits, *,
           rng: np.random.Generator) -> StageRun:
    """What a run of a stage of cost `cost` reports: time with noise, or an OOM when its peak does not fit."""
    noise = float(noise_factor(rng, traits.noise_std_fraction))  # drawn even on OOM: same stream either way
    peak = cost.peak_mem_mib(sig.inflight)
    if peak > cost.capacity_mib:
        return StageRun(time_ms=None, peak_mem_mib=None, static_mem_mib=None, status="oom",
                        reason=f"out of memory: needs {peak:.0f} MiB of {cost.capacity_mib:.0f} MiB on {gpu.name}")
    return StageRun(time_ms=cost.time_ms * noise, peak_mem_mib=peak, static_mem_mib=cost.static_mem_mib,
                    status="ok", reason="")
