"""First-principles costs of one transformer layer, the embedding and the output layer on one GPU.

Everything is per GPU of a tensor-parallel group of `tp` GPUs, for one micro batch, in ms and bytes.
Megatron-style tensor parallelism: GEMMs and attention are split by heads (Shoeybi 2019 §3, Narayanan
2021 §2.3). Without sequence parallelism norms, residuals and dropouts are replicated across the TP
group and each TP boundary is an all-reduce; with it (`Dims.sequence_parallel`, tp > 1) they run on
s/t tokens per GPU and each all-reduce becomes an all-gather + reduce-scatter (Korthikanti 2022 §4.2.2). Effects a closed-form model leaves out are here on
purpose: GEMM efficiency falling for small GEMMs, a roofline on bytes moved, eager attention that
writes and stores the s² scores when the part has no fused attention kernel, memory-bound
elementwise kernels, kernel launch cost and link efficiency.

This module must not import the planner's cost model (memx.planner.cost / memx.planner.schedule / ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from memx.domain.errors import InputError
from memx.simulator.traits import GpuTraits
from memx.domain.specs import GpuType

BF16_BYTES = 2  # activations, weights and gradients exchanged in 16-bit (bf16 or fp16; simulator assumption)
FP32_BYTES = 4
# Training precision (issue #23), the simulator's own accounting (it never reads memx.planner or
# memx.domain.precision): what data parallelism reduces per parameter — fp32 main grads under bf16 and fp8
# (Megatron-LM accumulates bf16 training's grads in fp32), the fp16 grads themselves under fp16 mixed
# precision (Micikevicius et al. 2018 §3: fp16 weights/grads, fp32 master copy in the optimizer).
GRAD_BYTES_OF = {"bf16": FP32_BYTES, "fp8": FP32_BYTES, "fp16": BF16_BYTES}
# fp8 GEMMs (Transformer Engine on Hopper / MI300): the layer linears run at the fp8 peak but reach a lower
# share of it, and each one first casts its 16-bit input to fp8 (read 2 B, write 1 B per element):
# simulator assumptions (TE docs "Using FP8 with Transformer Engine": amax/scale bookkeeping and casts).
FP8_EFFICIENCY_FACTOR = 0.8
FP8_CAST_BYTES = 3.0


@dataclass(frozen=True, kw_only=True)
class Device:
    """A GPU type's spec sheet and traits in the units the cost functions use."""

    peak_flop_per_ms: float
    memory_bytes_per_ms: float  # achieved by memory-bound kernels
    link_bytes_per_ms: float  # achieved GPU<->GPU inside a node
    traits: GpuTraits
    precision: str = "bf16"  # training precision; fp8 changes the layer linears only (gemm_ms linear=True)
    linear_peak_flop_per_ms: float = 0.0  # peak of the layer linears; 0: peak_flop_per_ms

    @classmethod
    def of(cls, gpu: GpuType, traits: GpuTraits, precision: str = "bf16") -> Device:
        if precision == "fp8" and precision not in gpu.precisions:  # a 16-bit one: the part's own 16-bit mode
            raise InputError(f"stage signature: field 'precision' is {precision}, which GPU {gpu.name} cannot run; "
                             f"it has {', '.join(gpu.precisions)}")
        return cls(
            peak_flop_per_ms=gpu.peak_tflops_bf16 * 1e9,  # TFLOP/s -> FLOP/ms (the 16-bit tensor peak)
            memory_bytes_per_ms=gpu.memory_bandwidth_gbps * 1e6 * traits.memory_bound_efficiency,
            link_bytes_per_ms=gpu.intra_node_bandwidth_gbps * 1e6 * traits.link_efficiency,
            traits=traits,
            precision=precision,
            linear_peak_flop_per_ms=gpu.peak_tflops(precision, strict=False) * 1e9,
        )


@dataclass(frozen=True, kw_only=True)
class Dims:
    """Shapes of one micro batch through one stage's TP group."""

    micro_batch: int
    seq_len: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    vocab: int
    mlp: str
    tp: int
    sequence_parallel: bool = False

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect: Megatron disables it when tp = 1 (arguments.py validate_args)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def sp_share(self) -> float:
        """Share of the b·s·h tensors of norm/dropout regions held per GPU: 1/t with SP, else 1."""
        return 1.0 / self.tp if self.sp else 1.0

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def kv_hidden(self) -> int:
        return self.query_groups * (self.hidden // self.heads)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def dropout(self) -> bool:
        # simulator assumption: GPT-style (gelu) models train with dropout, LLaMA-style (swiglu) without
        return self.mlp == "gelu"

    @property
    def score_elements(self) -> float:
        # attention score matrix b·(a/t)·s² per GPU (Korthikanti 2022 §4.1)
        return self.micro_batch * (self.heads / self.tp) * self.seq_len**2

    @property
    def mlp_in_width(self) -> int:
        # SwiGLU has gate and up projections (Shazeer 2020); GeLU one up projection
        return (2 if self.mlp == "swiglu" else 1) * self.ffn_hidden


# ---------------------------------------------------------------- kernels


def gemm_ms(dev: Device, m: float, n: float, k: float, batch: float = 1.0, linear: bool = False) -> float:
    """One (batched) GEMM of [m×k]·[k×n]: 2mnk FLOPs per matrix.

    Efficiency saturates with size: eff = eff_large · F / (F + F_half) (simulator assumption: small
    GEMMs fill fewer SMs and waves), and the kernel cannot beat the roofline on bytes moved
    (Williams 2009): 2 bytes × (m·k + k·n + m·n) per matrix. `linear`: a layer linear, which under fp8
    runs at the fp8 peak × FP8_EFFICIENCY_FACTOR on 1-byte operands after casting its m×k input.
    """
    flops = 2.0 * m * n * k * batch
    tr = dev.traits
    eff = tr.gemm_efficiency_large * flops / (flops + tr.gemm_half_efficiency_gflop * 1e9)
    if linear and dev.precision == "fp8":
        compute_ms = flops / (dev.linear_peak_flop_per_ms * eff * FP8_EFFICIENCY_FACTOR)
        memory_ms = (m * k + k * n + BF16_BYTES * m * n) * batch / dev.memory_bytes_per_ms
        cast_ms = membound_ms(dev, FP8_CAST_BYTES * m * k * batch, 1)
        return max(compute_ms, memory_ms) + tr.kernel_launch_overhead_ms + cast_ms
    compute_ms = flops / (dev.peak_flop_per_ms * eff)
    memory_ms = BF16_BYTES * (m * k + k * n + m * n) * batch / dev.memory_bytes_per_ms
    return max(compute_ms, memory_ms) + tr.kernel_launch_overhead_ms


def membound_ms(dev: Device, nbytes: float, kernels: int) -> float:
    """Elementwise kernels: bytes read + written at the achieved bandwidth, plus launches."""
    return nbytes / dev.memory_bytes_per_ms + kernels * dev.traits.kernel_launch_overhead_ms


def ring_allreduce_ms(nbytes: float, ranks: int, bytes_per_ms: float, step_latency_ms: float) -> float:
    """Ring all-reduce: 2(r−1)/r · bytes over the slowest link, 2(r−1) latency steps
    (Patarasuk & Yuan 2009; the T_dp term of docs/architecture.md §1F1B assembly)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / bytes_per_ms + 2 * (ranks - 1) * step_latency_ms


def ring_collective_ms(nbytes: float, ranks: int, bytes_per_ms: float, step_latency_ms: float) -> float:
    """Ring reduce-scatter or all-gather of a `nbytes` tensor: (r−1)/r · bytes, r−1 latency steps — one
    half of a ring all-reduce (Patarasuk & Yuan 2009; Korthikanti 2022 §4.2.2)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bytes_per_ms + (ranks - 1) * step_latency_ms


def tp_allreduce_ms(dev: Device, d: Dims, nbytes: float) -> float:
    return ring_allreduce_ms(nbytes, d.tp, dev.link_bytes_per_ms, dev.traits.collective_step_latency_ms)


def tp_collective_ms(dev: Device, d: Dims, nbytes: float) -> float:
    """One TP all-gather or reduce-scatter of a (gathered) `nbytes` tensor."""
    return ring_collective_ms(nbytes, d.tp, dev.link_bytes_per_ms, dev.traits.collective_step_latency_ms)


def tp_boundary_ms(dev: Device, d: Dims, nbytes: float) -> float:
    """One TP boundary (f/g operator) of b·s·h: an all-reduce, or with SP a reduce-scatter + all-gather
    (g + ḡ, Korthikanti 2022 §4.2.2 Fig. 5): the same ring bytes and steps, one more kernel."""
    if d.sp:
        return 2 * tp_collective_ms(dev, d, nbytes) + dev.traits.kernel_launch_overhead_ms
    return tp_allreduce_ms(dev, d, nbytes)


# ---------------------------------------------------------------- one transformer layer


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    fwd_ms: float  # forward of one layer, device time
    bwd_ms: float  # backward of one layer (no recomputation), device time
    attn_core_fwd_ms: float  # the part selective recomputation reruns (QKᵀ, softmax, dropout, ·V)
    comm_ms: float  # TP all-reduces inside fwd_ms (the same again inside bwd_ms)
    regather_ms: float  # with SP: the backward's re-gathers of saved s/t inputs, also inside bwd_ms
    fwd_kernels: int  # operations the host issues for the forward (for the host-bound floor)
    bwd_kernels: int
    attn_core_kernels: int
    params: float  # parameters per GPU
    act_none_bytes: float  # activations stored per micro batch, no recomputation
    act_selective_bytes: float  # ... with selective recomputation
    act_full_bytes: float  # ... with full recomputation (the layer input only)
    workspace_bytes: float  # transient gradient/temporary tensors while this layer's backward runs


def _attention_core(dev: Device, d: Dims) -> tuple[float, float, int]:
    """Forward and backward ms of QKᵀ → softmax → (dropout) → ·V, and the forward's kernel count."""
    t, s, dh = d.tp, d.seq_len, d.head_dim
    if dev.traits.flash_attention:
        # fused kernel; causal masking skips half the tiles; backward recomputes S and P:
        # 2.5× the forward FLOPs (Dao 2023, FlashAttention-2 §3)
        flops = 4.0 * d.micro_batch * (d.heads / t) * s * s * dh * 0.5
        io = BF16_BYTES * d.tokens * (2 * d.hidden + 2 * d.kv_hidden) / t
        fwd = max(flops / (dev.peak_flop_per_ms * dev.traits.attention_efficiency), io / dev.memory_bytes_per_ms)
        launch = dev.traits.kernel_launch_overhead_ms
        return fwd + launch, 2.5 * fwd + 2 * launch, 1
    batch = d.micro_batch * d.heads / t
    e = d.score_elements
    qk = gemm_ms(dev, s, s, dh, batch)  # QKᵀ, Korthikanti 2022 §4.1
    av = gemm_ms(dev, s, dh, s, batch)  # softmax(·)·V
    # fused scale-mask-softmax: read 2 B + write 2 B per score; dropout: read 2, write 2, mask 1
    drop = 5.0 * e if d.dropout else 0.0
    kernels = 2 if d.dropout else 1
    fwd = qk + av + membound_ms(dev, 4.0 * e + drop, kernels)
    # backward: two GEMMs per forward GEMM; softmax grad reads y and dy, writes dx (6 B/score)
    bwd = 2 * (qk + av) + membound_ms(dev, 6.0 * e + drop, kernels)
    return fwd, bwd, 2 + kernels


def _layer_elementwise_bytes(d: Dims) -> float:
    """Forward bytes of the memory-bound kernels of one layer (per GPU)."""
    th, tf = d.tokens * d.hidden, d.tokens * d.ffn_hidden / d.tp
    # two (RMS/Layer)Norms, read 2 B + write 2 B; replicated across TP, or on s/t tokens with SP (Korthikanti §4.2.2)
    norms = 2 * 4.0 * th * d.sp_share
    residual = 2 * (6.0 * th + (1.0 * th if d.dropout else 0.0)) * d.sp_share  # bias-dropout-add: read 2×2 B, write 2 B (+mask)
    act = 6.0 * tf if d.mlp == "swiglu" else 4.0 * tf  # SwiGLU reads gate+up, writes one; GeLU read+write
    rotary = 4.0 * d.tokens * (d.hidden + d.kv_hidden) / d.tp if d.mlp == "swiglu" else 0.0  # RoPE on q, k
    return norms + residual + act + rotary


def layer_cost(dev: Device, d: Dims) -> LayerCost:
    t, th = d.tp, d.tokens * d.hidden
    T = d.tokens
    gemms = (
        gemm_ms(dev, T, (d.hidden + 2 * d.kv_hidden) / t, d.hidden, linear=True)  # QKV projection
        + gemm_ms(dev, T, d.hidden, d.hidden / t, linear=True)  # attention output projection
        + gemm_ms(dev, T, d.mlp_in_width / t, d.hidden, linear=True)  # MLP up (+gate)
        + gemm_ms(dev, T, d.hidden, d.ffn_hidden / t, linear=True)  # MLP down
    )
    core_fwd, core_bwd, core_kernels = _attention_core(dev, d)
    ew_bytes = _layer_elementwise_bytes(d)
    ew_kernels = 5 + (1 if d.mlp == "swiglu" else 0)
    # two TP boundaries of b·s·h in forward and two in backward (Shoeybi 2019 §3, f/g operators); with SP
    # the backward also all-gathers again the two saved s/t inputs of the QKV and MLP-up GEMMs for their
    # weight gradients (Korthikanti 2022 §4.2.2). Megatron issues them asynchronously, but Table 4 shows
    # SP saving 0.5 ms of forward and only 0.1 ms of backward: they are counted as exposed here.
    comm = 2 * tp_boundary_ms(dev, d, BF16_BYTES * th)
    regather = 2 * tp_collective_ms(dev, d, BF16_BYTES * th) if d.sp else 0.0
    fwd = gemms + core_fwd + membound_ms(dev, ew_bytes, ew_kernels) + comm
    # backward: dgrad + wgrad GEMMs (2× forward FLOPs, Narayanan 2021 §5.1); elementwise kernels read the
    # saved input and the incoming gradient and write a gradient: 2× forward bytes (simulator assumption)
    bwd = 2 * gemms + core_bwd + membound_ms(dev, 2 * ew_bytes, 2 * ew_kernels) + comm + regather
    # host-issued ops: 4 GEMMs, attention core, elementwise, 2 all-reduces (tp > 1; 4 collectives with SP),
    # 2 layout copies; backward issues twice as many (with SP: 4 collectives + 2 re-gathers, also 2×)
    fwd_kernels = 4 + core_kernels + ew_kernels + (2 if t > 1 else 0) + (2 if d.sp else 0) + 2
    return LayerCost(
        fwd_ms=fwd,
        bwd_ms=bwd,
        attn_core_fwd_ms=0.0 if dev.traits.flash_attention else core_fwd,
        comm_ms=comm,
        regather_ms=regather,
        fwd_kernels=fwd_kernels,
        bwd_kernels=2 * fwd_kernels,
        attn_core_kernels=0 if dev.traits.flash_attention else core_kernels,
        params=layer_params(d),
        **_layer_memory(dev, d),
    )


def layer_params(d: Dims) -> float:
    """Parameters of one layer on one GPU: QKV + proj + MLP split by TP, two norms replicated."""
    h = d.hidden
    attn = h * (h + 2 * d.kv_hidden) + h * h
    mlp = h * d.mlp_in_width + d.ffn_hidden * h
    return (attn + mlp) / d.tp + 2 * h


def _layer_memory(dev: Device, d: Dims) -> dict[str, float]:
    """Activation bytes one layer keeps per micro batch (Korthikanti 2022 Eq. 1–2, §4.1, generalised to
    GQA and SwiGLU): replicated 2sbh inputs of LN1, QKV, LN2, MLP (+1-byte dropout masks) — divided by t
    with sequence parallelism (Korthikanti 2022 §4.2.2, Table 2: sbh(10 + 24/t + 5as/ht) → sbh(34/t +
    5as/ht)); per-TP-rank Q, K, V, context, MLP intermediates; eager attention adds softmax output (+
    mask + dropout output)."""
    t, th = d.tp, d.tokens * d.hidden
    replicated = (8.0 * th + (2.0 * th if d.dropout else 0.0)) * d.sp_share
    qkv_ctx = BF16_BYTES * d.tokens * (2 * d.hidden + 2 * d.kv_hidden) / t
    mlp_width = 3 if d.mlp == "swiglu" else 2  # swiglu: gate, up, product; gelu: gelu input, linear2 input
    mlp = BF16_BYTES * mlp_width * d.tokens * d.ffn_hidden / t
    e = d.score_elements
    if dev.traits.flash_attention:
        scores = FP32_BYTES * d.micro_batch * (d.heads / t) * d.seq_len  # log-sum-exp only (Dao 2022)
    else:
        scores = 2.0 * e + (3.0 * e if d.dropout else 0.0)  # 5as²b/t with dropout (Korthikanti 2022 §4.1)
    none = replicated + qkv_ctx + mlp + scores
    selective = none - (0.0 if dev.traits.flash_attention else scores)  # Korthikanti 2022 §5 (selective)
    largest = max(BF16_BYTES * d.tokens * d.mlp_in_width / t, 0.0 if dev.traits.flash_attention else 2.0 * e, 2.0 * th)
    return {
        "act_none_bytes": none,
        "act_selective_bytes": selective,
        # only the layer input is kept (Chen 2016; Korthikanti 2022 §4.3): with sequence parallelism the input between
        # layers is the rank's s/t slice (Korthikanti 2022 §4.2.2), and that slice is what the checkpoint saves
        "act_full_bytes": BF16_BYTES * th * d.sp_share,
        "workspace_bytes": 2.0 * largest,  # a gradient and a temporary of the largest tensor (simulator assumption)
    }


# ---------------------------------------------------------------- embedding and output layer


@dataclass(frozen=True, kw_only=True)
class EndCost:
    fwd_ms: float
    bwd_ms: float
    comm_ms: float  # TP collectives inside fwd_ms
    bwd_comm_ms: float  # TP collectives inside bwd_ms
    fwd_kernels: int
    bwd_kernels: int
    params: float
    act_bytes: float  # kept per micro batch until its backward
    workspace_bytes: float  # transient during its backward


def embedding_cost(dev: Device, d: Dims) -> EndCost:
    """Vocab-parallel embedding (Shoeybi 2019 §3): gather rows, all-reduce b·s·h across TP — with SP a
    reduce-scatter to s/t tokens, whose backward is an all-gather of the gradient (Korthikanti 2022
    §4.2.2); GPT-style models add learned positions and dropout (simulator assumption)."""
    th = d.tokens * d.hidden
    positions = d.seq_len * d.hidden if d.mlp == "gelu" else 0
    comm = tp_collective_ms(dev, d, BF16_BYTES * th) if d.sp else tp_allreduce_ms(dev, d, BF16_BYTES * th)
    bwd_comm = tp_collective_ms(dev, d, BF16_BYTES * th) if d.sp else 0.0
    fwd = membound_ms(dev, 8.0 * th, 2) + comm
    bwd = membound_ms(dev, 10.0 * th, 2) + bwd_comm  # scatter-add into fp32 gradient rows (read-modify-write)
    return EndCost(
        fwd_ms=fwd,
        bwd_ms=bwd,
        comm_ms=comm,
        bwd_comm_ms=bwd_comm,
        fwd_kernels=3,
        bwd_kernels=3 + (1 if d.sp else 0),
        params=d.vocab * d.hidden / d.tp + positions,
        act_bytes=1.0 * th * d.sp_share if d.dropout else 0.0,  # dropout mask (on s/t tokens with SP)
        workspace_bytes=FP32_BYTES * th,
    )


def output_cost(dev: Device, d: Dims, owns_weight: bool = True) -> EndCost:
    """Final norm, vocab-parallel logits GEMM, fp32 cross entropy with three small all-reduces
    (max, sum-exp, target logit; Shoeybi 2019 §3). `owns_weight`: the layer holds its vocab × hidden / tp
    weight; false when it multiplies by the input embedding's weight on the same GPU (tied embeddings, Press &
    Wolf 2017; Megatron-LM allocates no output weight on a stage that also holds the embedding), the GEMMs
    unchanged — only the parameters (and so their gradients, optimizer state and update) are not there twice.
    With SP the norm runs on s/t tokens and an all-gather of b·s·h feeds the GEMM, a reduce-scatter of
    its input gradient in backward (Korthikanti 2022 §4.2.2); the GEMM input is kept as the s/t shard.
    (Without SP the backward all-reduce of the GEMM's input gradient is not modelled — a known gap.)"""
    th, share = d.tokens * d.hidden, d.sp_share
    logits = d.tokens * d.vocab / d.tp
    gemm = gemm_ms(dev, d.tokens, d.vocab / d.tp, d.hidden)
    gather = tp_collective_ms(dev, d, BF16_BYTES * th) if d.sp else 0.0
    small = 3 * tp_allreduce_ms(dev, d, FP32_BYTES * d.tokens) + gather
    # forward: norm 4 B/elt of b·s·h; CE reads bf16 logits, writes fp32, two fp32 passes
    fwd = gemm + membound_ms(dev, 4.0 * th * share + 14.0 * logits, 4) + small
    bwd = 2 * gemm + membound_ms(dev, 8.0 * th * share + 6.0 * logits, 3) + gather
    return EndCost(
        fwd_ms=fwd,
        bwd_ms=bwd,
        comm_ms=small,
        bwd_comm_ms=gather,
        fwd_kernels=8 + (1 if d.sp else 0),
        bwd_kernels=6 + (1 if d.sp else 0),
        params=(d.vocab * d.hidden / d.tp if owns_weight else 0.0) + d.hidden,
        act_bytes=4.0 * th * share + FP32_BYTES * logits,  # norm + GEMM inputs, fp32 softmax kept for backward
        # transient while the loss and its backward run: 4 B per logit beyond the kept fp32 softmax. Megatron-LM
        # computes the fp32 logit gradient in place in that softmax (megatron/core/tensor_parallel/cross_entropy.py:
        # `grad_input = softmax`, `grad_input.mul_`), so it is not a second fp32 tensor (the code alone shows the 2 B
        # of the bf16 logits beside their fp32 copy and of the gradient's cast back). 4 B is what its functional
        # tests' measured max allocated bytes on the last stage hold (tests/validation/data/megatron_golden.yaml, 32
        # cases, every term as the closed form counts it: kept 4 + transient 4 B per logit -3.8 ... +9.5 %, median
        # +3 %; 4 + 2 B under on the large cases, Mixtral 8x7B -3.5 %; 4 + 6 B, as here before issue #27 session 7,
        # +0.2 ... +24.5 %, above every case; docs/simulator.md §Memory)
        workspace_bytes=FP32_BYTES * logits,
    )


def adam_step_ms(dev: Device, params: float) -> float:
    """Fused Adam step over `params` (with the distributed optimizer: this rank's 1/dp shard, ZeRO §5):
    reads fp32 master, grad, m, v and writes master, m, v, bf16 weights (30 B/param) at the
    optimizer's achieved bandwidth (simulator assumption)."""
    bw = dev.memory_bytes_per_ms / dev.traits.memory_bound_efficiency * dev.traits.optimizer_efficiency
    return 30.0 * params / bw + 4 * dev.traits.kernel_launch_overhead_ms
