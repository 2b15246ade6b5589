"""Runtime terms of the closed-form stage model: what the textbook formulas leave out.

Vectorised over numpy arrays of stage-signature columns (one entry per row), per TP rank and per
micro batch. Units: bytes, FLOPs, ms. The per-GPU numbers (efficiencies, latencies, context and
communicator memory) come from conf/runtime via `RuntimeColumns`; the formulas cite their sources.
memx.planner.cost.predict_runtime_frame assembles them into stage predictions (docs/planner.md
§Runtime terms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from memx.domain.runtime import RuntimeProfile
from memx.domain.specs import GpuType

BF16, FP32 = 2.0, 4.0
MIB = 1024.0 * 1024.0


def name_codes(values) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(np.asarray(values).astype(str), return_inverse=True)` of a 1-D column of names (GPU,
    precision), sorting only the first value of each run of equal ones: the signature columns hold a
    context's names on consecutive rows (memx.planner.signatures.signature_columns), so a search's 10⁵
    rows are a few hundred runs. A run of equal str objects has one str() — the same result; any other
    column (numbers, None, not 1-D) takes np.unique itself."""
    a = np.asarray(values)
    if a.ndim == 1 and len(a) and a.dtype.kind in "UO":
        starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
        heads = a[starts]
        if a.dtype.kind == "U" or all(type(h) is str for h in heads.tolist()):
            uniq, inv = np.unique(heads.astype(str), return_inverse=True)
            return uniq, np.repeat(inv.reshape(-1), np.diff(np.r_[starts, len(a)]))
    uniq, inv = np.unique(a.astype(str), return_inverse=True)
    return uniq, inv.reshape(-1)


def uniform_precision(prec: np.ndarray) -> str | np.ndarray:
    """A column of names (memx.planner.cost.precision_column's) as its one name when every row has it (a search's
    usual case: rows broadcast it in one step instead of comparing 10⁵ Python strings per use), else the column."""
    names = set(prec.tolist())
    return next(iter(names)) if len(names) == 1 else prec


def per_run(terms: Callable[..., dict[str, np.ndarray]], *columns) -> dict[str, np.ndarray]:
    """terms(*columns) for rows given as dataclasses of equal-length arrays, computed once per run of
    consecutive rows equal in every field (a search's signature rows come context by context: ~10⁵ rows,
    a few hundred runs) and spread back to the rows — the same elementwise arithmetic on the same values."""
    arrays = [getattr(c, f.name) for c in columns for f in fields(c)]
    n = len(arrays[0])
    change = np.ones(n, dtype=bool)
    change[1:] = False
    for a in arrays:
        change[1:] |= a[1:] != a[:-1]
    heads = np.flatnonzero(change)
    if len(heads) == n:
        return terms(*columns)
    take = [replace(c, **{f.name: getattr(c, f.name)[heads] for f in fields(c)}) for c in columns]
    run = np.cumsum(change) - 1
    return {k: np.asarray(v).take(run, axis=0) for k, v in terms(*take).items()}  # take(): faster than v[run]


@dataclass(frozen=True, kw_only=True)
class RuntimeColumns:
    """Spec-sheet and runtime numbers broadcast to one entry per signature row."""

    peak_flop_per_ms: np.ndarray
    membw_bytes_per_ms: np.ndarray  # achieved by streaming kernels
    link_bytes_per_ms: np.ndarray  # achieved by collectives inside a node
    gemm_eff: np.ndarray
    units: np.ndarray
    tile_m: np.ndarray
    tile_n: np.ndarray
    attn_eff: np.ndarray
    step_ms: np.ndarray
    launch_ms: np.ndarray
    host_ms: np.ndarray
    p2p_ms: np.ndarray
    flash: np.ndarray
    sp: np.ndarray
    fixed_mib: np.ndarray  # context (the driver reserve is off the capacity, not in a peak: usable_capacity_mib)
    coll_mib: np.ndarray
    p2p_mib: np.ndarray
    frag: np.ndarray
    tp_exposed: np.ndarray  # RuntimeProfile.tp_overlap_exposed_fraction; −1 where it is None (the paper's formula)

    @classmethod
    def of(cls, names: np.ndarray, gpus: Mapping[str, GpuType], profiles: Mapping[str, RuntimeProfile]) -> RuntimeColumns:
        uniq, inv = name_codes(names)
        missing = [u for u in uniq if u not in gpus or u not in profiles]
        if missing:
            raise KeyError(f"no GPU spec or runtime profile for {missing}")
        g = [gpus[u] for u in uniq]
        r = [profiles[u] for u in uniq]
        cols = {
            "peak_flop_per_ms": [x.peak_tflops_bf16 * 1e9 for x in g],
            "membw_bytes_per_ms": [x.memory_bandwidth_gbps * 1e6 * p.memory_bandwidth_efficiency for x, p in zip(g, r)],
            "link_bytes_per_ms": [x.intra_node_bandwidth_gbps * 1e6 * p.link_efficiency for x, p in zip(g, r)],
            "gemm_eff": [p.gemm_efficiency_large for p in r], "units": [p.compute_units for p in r],
            "tile_m": [p.gemm_tile_m for p in r], "tile_n": [p.gemm_tile_n for p in r],
            "attn_eff": [p.attention_efficiency for p in r], "step_ms": [p.collective_step_ms for p in r],
            "launch_ms": [p.kernel_launch_ms for p in r], "host_ms": [p.host_op_ms for p in r],
            "p2p_ms": [p.p2p_latency_ms for p in r], "flash": [p.flash_attention for p in r],
            "sp": [p.sequence_parallel for p in r], "fixed_mib": [p.context_mib for p in r],
            "coll_mib": [p.collective_comm_mib for p in r], "p2p_mib": [p.p2p_comm_mib for p in r],
            "frag": [p.allocator_overhead_fraction for p in r],
            "tp_exposed": [-1.0 if p.tp_overlap_exposed_fraction is None else p.tp_overlap_exposed_fraction for p in r],
        }
        return cls(**{k: np.asarray(cols[k]).take(inv) for k in (f.name for f in fields(cls))})  # take(): as [inv], faster


@dataclass(frozen=True, kw_only=True)
class Shapes:
    """One micro batch through one stage's TP group, as float arrays."""

    b: np.ndarray
    s: np.ndarray
    h: np.ndarray
    f: np.ndarray
    a: np.ndarray
    kv: np.ndarray  # GQA key/value width g·h/a
    v: np.ndarray
    t: np.ndarray
    swiglu: np.ndarray
    dropout: np.ndarray  # GPT-style (GELU) models train with dropout, LLaMA-style (SwiGLU) without
    rep: np.ndarray  # divisor of the "replicated" activations: t with sequence parallelism, else 1

    @cached_property
    def tokens(self) -> np.ndarray:  # b·s, asked for by most terms: computed once per Shapes
        return self.b * self.s


def shapes(c: Mapping[str, np.ndarray], sp: np.ndarray) -> Shapes:
    """Dropout: Megatron-LM defaults --hidden-dropout / --attention-dropout to 0.1 (GPT); the LLaMA
    recipes (Touvron et al. 2023 train without dropout) set both to 0."""
    fl = {k: np.asarray(c[k], dtype=np.float64) for k in ("micro_batch", "seq_len", "hidden", "ffn_hidden", "heads",
                                                            "query_groups", "vocab", "tp")}
    swiglu = np.asarray(c["mlp"]) == "swiglu"
    t = fl["tp"]
    return Shapes(b=fl["micro_batch"], s=fl["seq_len"], h=fl["hidden"], f=fl["ffn_hidden"], a=fl["heads"],
                  kv=fl["hidden"] * fl["query_groups"] / fl["heads"], v=fl["vocab"], t=t, swiglu=swiglu,
                  dropout=~swiglu, rep=np.where(sp, t, 1.0))


# ---------------------------------------------------------------- time


def wave_efficiency(m, n, rc: RuntimeColumns, batch=1.0) -> np.ndarray:
    """Wave quantisation: batch·⌈M/tm⌉·⌈N/tn⌉ output tiles run in waves of `units` at once; the last wave
    is partly idle (NVIDIA Matrix Multiplication Background User's Guide, 'wave quantization'; a batched GEMM
    launches every matrix's tiles in one grid, cuBLAS gemmStridedBatched)."""
    tiles = batch * np.ceil(m / rc.tile_m) * np.ceil(n / rc.tile_n)
    units = np.maximum(rc.units, 1)
    return np.where(rc.units > 0, tiles / (np.ceil(tiles / units) * units), 1.0)


def gemm_ms(m, n, k, rc: RuntimeColumns, batch=1.0) -> np.ndarray:
    """One [m×k]·[k×n] bf16 GEMM (`batch` independent ones in one batched kernel): 2mnk FLOPs per matrix at the
    large-GEMM efficiency × wave efficiency, never faster than moving its operands (roofline, Williams et al.
    2009), plus one launch."""
    compute = 2.0 * batch * m * n * k / (rc.peak_flop_per_ms * rc.gemm_eff * wave_efficiency(m, n, rc, batch))
    memory = BF16 * batch * (m * k + k * n + m * n) / rc.membw_bytes_per_ms
    return np.maximum(compute, memory) + rc.launch_ms


def gemm_fwd_bwd_ms(m, n, k, rc: RuntimeColumns, batch=1.0) -> tuple[np.ndarray, np.ndarray]:
    """Forward Y = X·W ([m×k]·[k×n]); backward dX = dY·Wᵀ ([m×n]·[n×k]) and dW = Xᵀ·dY ([k×m]·[m×n]):
    2× the forward FLOPs (Narayanan 2021 §5.1), each GEMM with its own output shape. `batch`: that many
    independent matrix products (the attention core's per-head GEMMs): each backward GEMM is batched too, so
    dW's output is batch × k×n tiles, not one k×n reduced over the batch."""
    return gemm_ms(m, n, k, rc, batch), gemm_ms(m, k, n, rc, batch) + gemm_ms(k, n, m, rc, batch)


def layer_gemms_ms(x: Shapes, rc: RuntimeColumns) -> tuple[np.ndarray, np.ndarray]:
    """QKV, attention output, MLP up (+ gate for SwiGLU) and down projections, split over TP by
    columns / rows (Shoeybi et al. 2019 §3)."""
    T, t = x.tokens, x.t
    up = np.where(x.swiglu, 2.0, 1.0) * x.f
    fwd = bwd = 0.0
    for n, k in (((x.h + 2 * x.kv) / t, x.h), (x.h, x.h / t), (up / t, x.h), (x.h, x.f / t)):
        f_, b_ = gemm_fwd_bwd_ms(T, n, k, rc)
        fwd, bwd = fwd + f_, bwd + b_
    return fwd, bwd


def attention_core_ms(x: Shapes, rc: RuntimeColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """QKᵀ → softmax → (dropout) → ·V: forward ms, backward ms, forward kernels.

    Fused (Dao 2023, FlashAttention-2): 4·b·s²·h/t FLOPs halved by the causal mask, backward 2.5×
    the forward (recomputes S, P; §3.1). Eager: two batched GEMMs of b·a/t heads, a fused
    scale-mask-softmax reading and writing 2 B per score, dropout reading 2 and writing 2 + 1-byte mask
    (Korthikanti 2022 §4.1 tensors); backward two GEMMs per forward GEMM and the softmax gradient
    reading y, dy and writing dx (6 B per score)."""
    dh, heads = x.h / x.a, x.b * x.a / x.t
    fused_fwd = 2.0 * x.b * x.s ** 2 * x.h / x.t / (rc.peak_flop_per_ms * rc.attn_eff) + rc.launch_ms
    scores = heads * x.s ** 2
    # per head (b·a/t of them, one batched kernel each): S = Q·Kᵀ [s×dh]·[dh×s], O = P·V [s×s]·[s×dh]; their
    # backward GEMMs are batched the same way (dK = dSᵀ·Q, dV = Pᵀ·dO: s×dh per head, Korthikanti 2022 §4.1)
    qk_f, qk_b = gemm_fwd_bwd_ms(x.s, x.s, dh, rc, heads)
    av_f, av_b = gemm_fwd_bwd_ms(x.s, dh, x.s, rc, heads)
    drop = np.where(x.dropout, 5.0, 0.0) * scores
    eager_fwd = qk_f + av_f + (4.0 * scores + drop) / rc.membw_bytes_per_ms + 2 * rc.launch_ms
    eager_bwd = qk_b + av_b + (6.0 * scores + drop) / rc.membw_bytes_per_ms + 2 * rc.launch_ms
    fwd = np.where(rc.flash, fused_fwd, eager_fwd)
    bwd = np.where(rc.flash, 2.5 * (fused_fwd - rc.launch_ms) + 3 * rc.launch_ms, eager_bwd)
    return fwd, bwd, np.where(rc.flash, 1.0, 4.0)


def layer_elementwise_bytes(x: Shapes) -> np.ndarray:
    """Forward bytes of one layer's memory-bound kernels (Megatron's fused kernels): two norms read
    and write 2 B per element of b·s·h; two bias-dropout-adds read input and residual and write the
    sum (+ a 1-byte mask with dropout); the activation reads and writes b·s·f/t (SwiGLU reads gate
    and up); rotary embeddings (LLaMA family) read and write q and k. Norm and residual tensors are
    replicated over TP without sequence parallelism (Korthikanti 2022 §4.2.2)."""
    th = x.tokens * x.h / x.rep
    tf = x.tokens * x.f / x.t
    rope = np.where(x.swiglu, 4.0 * x.tokens * (x.h + x.kv) / x.t, 0.0)
    return 8.0 * th + 2.0 * (6.0 + x.dropout) * th + np.where(x.swiglu, 6.0, 4.0) * tf + rope


def ring_ms(nbytes, ranks, rc: RuntimeColumns) -> np.ndarray:
    """Ring all-reduce: 2(n−1)/n · bytes at the achieved link bandwidth + 2(n−1) step latencies
    (Patarasuk & Yuan 2009; Thakur et al. 2005)."""
    n = np.asarray(ranks, dtype=np.float64)
    return np.where(n > 1, 2.0 * (n - 1) / np.maximum(n, 1) * nbytes / rc.link_bytes_per_ms
                    + 2.0 * (n - 1) * rc.step_ms, 0.0)


def backward_tp_ms(x: Shapes, rc: RuntimeColumns, ring_act: np.ndarray, paper: np.ndarray) -> np.ndarray:
    """One layer's backward TP collectives, ms; `ring_act`: one all-reduce of b·s·h (ring_ms), `paper`: the
    paper's formula, used where rc.tp_exposed < 0 (None in the catalog): 2 blocking all-reduces of
    b·s·h (Shoeybi 2019 §3, the f operators), reduce-scatter + all-gather with sequence parallelism moving the same
    bytes (Korthikanti 2022 §4.2.2). Otherwise as Megatron-LM runs them (megatron/core/tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward): without sequence parallelism the column-parallel
    input-gradient all-reduce is issued async_op=True and waited for after the weight-gradient GEMM; with it, the
    input is all-gathered again (async, beside the input-gradient GEMM: the gathered input is not stored) and the
    input gradient reduce-scattered (async, beside the weight-gradient GEMM), while the row-parallel linears'
    output-gradient all-gathers block (_ReduceScatterToSequenceParallelRegion.backward). Per layer: 2 overlapped
    all-reduces without SP; 2 blocking all-gathers (one all-reduce's time) + 2 overlapped reduce-scatters and
    2 overlapped all-gathers (two all-reduces' time) with SP; an overlapped collective costs rc.tp_exposed of its
    time (NCCL's kernels share the SMs and HBM with the GEMM beside them). The catalog's default is 1.0 (every one
    exposed; docs/results.md §Selective recomputation against Korthikanti et al.)."""
    e = rc.tp_exposed
    megatron = np.where(x.rep > 1, ring_act * (1.0 + 2.0 * e), 2.0 * e * ring_act)
    return np.where(e < 0, paper, megatron)


# ---------------------------------------------------------------- memory


def activation_bytes(x: Shapes, flash: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stored per layer and micro batch: (none, selective, full) recomputation.

    Korthikanti 2022 §4.1 tensors, generalised to GQA and SwiGLU: replicated unless sequence
    parallel — two norm inputs, the QKV and MLP inputs (8sbh) and two dropout masks (2sbh with
    dropout); per TP rank — Q, K, V (2sbh + 4sbh·g/a), the projection input (2sbh), MLP
    intermediates 4sbf (GELU) or 6sbf (SwiGLU). Eager attention adds the softmax output 2as²b (+ mask
    and dropout output 3as²b); a fused kernel keeps only its fp32 log-sum-exp, 4·a·s·b (Dao 2022 §3.1).
    Selective recomputation drops the score tensors (§5); full keeps the layer input 2sbh (§4.3)."""
    th = x.tokens * x.h
    replicated = (8.0 + 2.0 * x.dropout) * th / x.rep
    sharded = (4.0 * th + 4.0 * x.tokens * x.kv + np.where(x.swiglu, 6.0, 4.0) * x.tokens * x.f) / x.t
    scores = np.where(flash, FP32 * x.a * x.s * x.b, (2.0 + 3.0 * x.dropout) * x.a * x.s ** 2 * x.b) / x.t
    none = replicated + sharded + scores
    return none, none - scores, BF16 * th / x.rep


def backward_workspace_bytes(x: Shapes, flash: np.ndarray) -> np.ndarray:
    """Transient while one layer runs its backward: the incoming and outgoing activation gradients
    (2 × 2sbh, replicated without sequence parallelism) plus the larger of the MLP intermediate
    gradients (gradient + temporary of b·s·f/t, twice for SwiGLU's gate and up) and the attention
    gradients — eager: dP and dS, 2 × 2as²b/t; fused: dQ, dK, dV and FlashAttention-2's fp32 dQ
    accumulator (Dao 2023 §3.2)."""
    T = x.tokens
    mlp = 2.0 * BF16 * T * x.f * np.where(x.swiglu, 2.0, 1.0) / x.t
    attn = np.where(flash, (BF16 * (x.h + 2 * x.kv) + FP32 * x.h) * T / x.t, 2.0 * BF16 * x.a * x.s ** 2 * x.b / x.t)
    return 2.0 * BF16 * T * x.h / x.rep + np.maximum(mlp, attn)


def logits_bytes(x: Shapes) -> tuple[np.ndarray, np.ndarray]:
    """Last stage, (kept, transient): the output layer's and final norm's inputs (2 × 2sbh) and the fp32
    logits / softmax the vocab-parallel cross entropy keeps for backward, 4·s·b·v/t (Korthikanti 2022
    §4.3); during its backward the fp32 gradient of the logits, another 4·s·b·v/t (Megatron computes it
    in place and casts to bf16; a generic loss allocates it: the safe side)."""
    logits = FP32 * x.tokens * x.v / x.t
    return 2.0 * BF16 * x.tokens * x.h / x.rep + logits, logits


def communicator_mib(first: np.ndarray, last: np.ndarray, x: Shapes, rc: RuntimeColumns,
                     tied_embeddings: np.ndarray) -> np.ndarray:
    """Buffers of the communicators one rank uses (PyTorch creates an NCCL communicator per process
    group at its first collective; Megatron-LM parallel_state groups): tp (tp > 1); dp (gradient
    all-reduce; dp is not in the signature: counted, safe side); model-parallel (gradient-norm
    all-reduce, tp·pp > 1); embedding (first/last stage of a pipeline with tied input/output embeddings:
    the all-reduce of the two copies' gradients, megatron/core/distributed/finalize_model_grads.py
    _allreduce_word_embedding_grads, runs only then; a stage holding both ends has one weight and no
    such collective); world (initialisation barrier); one p2p connection per pipeline neighbour."""
    pipelined = ~(first & last)
    tied = (first | last) & pipelined & np.asarray(tied_embeddings, dtype=bool)
    n_coll = (x.t > 1) + 1.0 + ((x.t > 1) | pipelined) + tied + 1.0
    n_p2p = (~first).astype(float) + (~last)
    return n_coll * rc.coll_mib + n_p2p * rc.p2p_mib
