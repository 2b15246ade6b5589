"""Mixture of experts in the closed form (issue #27; docs/planner.md §Mixture of experts).

Every layer of a MoE model (ModelArch.num_experts) has a router, E routed experts of MLP size f_e of which
each token takes k (`moe_router_topk`), and optionally a shared expert of size f_sh every token takes
(Megatron-LM's MoELayer: TopKRouter, GroupedMLP / SequentialMLP, SharedExpertMLP). The experts are split
over ep ranks (`expert_parallel`); the expert tensor-parallel size is the stage's tp (Megatron's default:
`--expert-tensor-parallel-size` None → tp, megatron/training/arguments.py), so the expert data-parallel
group has dp·tp / (ep·tp) = dp / ep ranks (megatron/core/parallel_state.py, expert rank generator).

A stage predictor (closed form, learned, cached) sees the stage as its *dense equivalent* (a learned predictor
trained on MoE profile rows also sees ep, experts per GPU, tokens per expert and the all-to-all link as features,
memx.domain.moe_records, and learns the measurement minus the terms `adjust` adds): the same layer
with one MLP of inner size f_eq = λ·k·f_e + f_sh — the FLOPs, activations and TP traffic of the path one
token takes (a token's k expert MLPs plus the shared one: per-token FLOPs = k × expert FFN, Fedus et al. 2022
§2.1; Shazeer et al. 2017 §2), on the busiest rank (λ = `moe_load_imbalance`: that rank computes and holds λ×
the average tokens, and every rank waits for it in the combine). `adjust` then adds what a dense layer has not:

- parameters: per rank, attention + norms + shared expert over tp, the router h·E (replicated over tp: its
  weight is not tensor-parallel), and E/ep experts of the model's MLP kind over tp (SwiGLU 3·h·f_e, GELU
  2·h·f_e); the expert weights' optimizer state is sharded over the expert dp group (dp / ep) with the
  distributed optimizer (Megatron-LM dist_optimizer docs; ZeRO §5.1), the rest over dp
  (memx.planner.cost.static_bytes_per_param);
- the gradient step: expert gradients reduced over dp / ep ranks in their own collective on the expert-dp rings'
  link, the rest over dp (`dp_params_per_rank`; its latency memx.planner.collectives.expert_dp_latency_ms);
- time per layer and micro batch: 4 all-to-alls (dispatch and combine, forward and backward; a fully
  recomputed layer repeats its forward 2), each rank sending λ·T·k·h·2 bytes · (ep − 1)/ep with T = b·s/tp
  tokens per rank (sequence parallel, which Megatron requires with ep > 1 and tp > 1) over the link its ep
  group crosses (`a2a_links`: NVLink inside a node, the nodes' NICs across); the router GEMM 2·T·h·E FLOPs
  forward, ×3 with backward (Narayanan et al. 2021 §5.1), at half the 16-bit peak (memx.planner.cost.mfu);
  token permute / unpermute, memory-bound, 4 passes over λ·T·k·h·2 bytes forward and 4 backward; the expert
  tensor-parallel all-gather / reduce-scatter of the λ·k copies beyond the dense one (Megatron's alltoall
  dispatcher gathers the permuted tokens over the expert tp group);
- activations per kept layer: the experts' input, λ·k copies of the b·s tokens of the expert tensor-parallel group
  (2·λ·k·b·s·h: the dispatcher all-gathers the received tokens over it, so with tp > 1 it is not the rank's T tokens)
  beyond the dense equivalent's MLP input 2·T·h, and the fp32 router logits 4·T·E (Korthikanti et al. 2022 §4.1
  accounting); the dispatch buffers (send + receive) once as workspace.

Dense layers: the model's first `moe_first_dense_layers` (DeepSeek's `first_k_dense_replace`) have a dense MLP
of `ffn_hidden`; `split_layers` counts them on the first stage, and a dense layer's MLP replaces the equivalent's:
by the closed form's MLP difference (`time_delta_ms`, `static_delta_bytes`, `activation_delta_bytes`), or — where
the predictor measured those layers (a learned predictor whose profile held the dense-first points,
memx.profiling.design.dense_first_points) — by the predictor's own difference between the stage's first k' layers
as dense layers (`dense_layers_model`, no expert columns) and as the dense equivalent (memx.planner.moe_dense;
issue #27 session 5).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from memx.domain.context_parallel import rank_equivalent
from memx.domain.plan import Plan, place_plan
from memx.domain.records import nullable_floats
from memx.domain.specs import Cluster, GpuType, ModelArch, SearchSpace
from memx.planner.cost import (BYTES_PER_PARAM_STATIC, MIB, embedding_params, layer_params, option_columns,
                              precision_column, static_bytes_per_param)
from memx.planner.network import nic_share_gbps, pair_link, ring_link

MFU = 0.5  # memx.planner.cost.AnalyticStageModel.mfu (Narayanan et al. 2021 Table 1: 44–52 % of peak)
BF16 = 2.0
MOE_COLUMNS = ("expert_parallel", "expert_dp", "a2a_gbps", "a2a_latency_ms")


@lru_cache(maxsize=64)
def dense_equivalent(model: ModelArch) -> ModelArch:
    """The dense model a stage predictor sees for a MoE model: MLP inner size λ·k·f_e + f_sh (module docstring)."""
    f_eq = model.moe_load_imbalance * model.moe_router_topk * model.expert_ffn_hidden \
        + (model.moe_shared_expert_ffn_hidden or 0)
    return dataclasses.replace(model, ffn_hidden=int(round(f_eq)), num_experts=None, moe_ffn_hidden=None,
                               moe_shared_expert_ffn_hidden=None, moe_first_dense_layers=0)


@lru_cache(maxsize=64)
def dense_layers_model(model: ModelArch) -> ModelArch:
    """The dense transformer a MoE model's first `moe_first_dense_layers` layers are: the model with a dense MLP of
    its `ffn_hidden` and no experts (DeepSeek-V2 `first_k_dense_replace` layers: a plain MLP of `intermediate_size`)."""
    return dataclasses.replace(model, num_experts=None, moe_ffn_hidden=None, moe_shared_expert_ffn_hidden=None,
                               moe_first_dense_layers=0)


def layer_params_split(model: ModelArch, tp, ep) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, expert) parameters of one MoE layer held by one rank: attention + norms + shared expert over
    tp plus the router h·E; E/ep experts over tp (expert tp = tp). An expert is an MLP of the model's kind —
    SwiGLU three h×f_e matrices, GELU two (memx.planner.cost.layer_params): Megatron-LM's experts double fc1 only
    with `gated_linear_unit` (megatron/core/transformer/moe/experts.py, as mlp.py does for the dense MLP)."""
    h, t = float(model.hidden), np.asarray(tp, dtype=np.float64)
    attn_norms = layer_params(model.hidden, 0, model.heads, model.query_groups, model.mlp)
    shared = _mlp_params(model, model.moe_shared_expert_ffn_hidden or 0, 1)
    dense = (attn_norms + shared) / t + h * model.num_experts
    expert = model.num_experts / np.asarray(ep, dtype=np.float64) * _mlp_params(model, model.expert_ffn_hidden, 1) / t
    return dense, expert


def model_static_bytes(model: ModelArch) -> float:
    """Weights + grads + optimizer state of a whole MoE model, every expert once (18 B/param,
    memx.planner.cost.BYTES_PER_PARAM_STATIC)."""
    dense, expert = layer_params_split(model, 1, 1)
    emb = embedding_params(model.hidden, model.vocab) * (1 if model.tied_embeddings else 2)
    k = model.moe_first_dense_layers
    full = layer_params(model.hidden, model.ffn_hidden, model.heads, model.query_groups, model.mlp)
    return float((model.layers - k) * (dense + expert) + k * full + emb) * BYTES_PER_PARAM_STATIC


def moe_columns(contexts: Sequence, ctx_index: np.ndarray) -> dict[str, np.ndarray]:
    """The MoE columns of signature rows (not records columns: what `adjust` reads), from their contexts."""
    return {f: np.array([getattr(c, f) for c in contexts], dtype=np.float64)[ctx_index] for f in MOE_COLUMNS}


def _ranks(model: ModelArch, c: Mapping[str, np.ndarray]):
    """(tp, ep, expert dp, dp, tokens per rank) of signature rows."""
    tp = c["tp"].astype(np.float64)
    ep, edp = c["expert_parallel"], c["expert_dp"]
    tokens = c["micro_batch"] * c["seq_len"].astype(np.float64) / np.where(c["sequence_parallel"], tp, 1.0)
    return tp, ep, edp, ep * edp, tokens


def split_layers(model: ModelArch, layers, first) -> tuple[np.ndarray, np.ndarray]:
    """(MoE layers, dense layers) of stages of `layers` layers: the model's first `moe_first_dense_layers` are
    dense, counted on the first stage (min(k, n)); later stages are taken as all MoE — exact when the first
    stage holds at least k layers (the virtual cluster places them exactly, memx.simulator.moe)."""
    n = np.asarray(layers, dtype=np.float64)
    dense = np.where(np.asarray(first, dtype=bool), np.minimum(n, model.moe_first_dense_layers), 0.0)
    return n - dense, dense


def _mlp_params(model: ModelArch, ffn: int, tp) -> np.ndarray:
    """SwiGLU / GELU MLP weights of one layer per rank (memx.planner.cost.layer_params without attention)."""
    return (layer_params(model.hidden, ffn, model.heads, model.query_groups, model.mlp)
            - layer_params(model.hidden, 0, model.heads, model.query_groups, model.mlp)) / np.asarray(tp, dtype=np.float64)


def static_delta_bytes(model: ModelArch, c: Mapping[str, np.ndarray], gap=1.0) -> np.ndarray:
    """Real static bytes of the rows' layers minus their dense equivalent's (weights, grads, optimizer state); a
    dense layer's MLP is `ffn_hidden` instead of the equivalent's (× `gap`: 0 where the predictor measured the dense
    layers, `adjust`)."""
    tp, ep, edp, dp, _ = _ranks(model, c)
    do = option_columns(c)[0]
    prec = precision_column(c)
    dense, expert = layer_params_split(model, tp, ep)
    eq = dense_equivalent(model)
    eq_layer = layer_params(eq.hidden, eq.ffn_hidden, eq.heads, eq.query_groups, eq.mlp) / tp
    per_dp = static_bytes_per_param(do, dp, prec)
    real = dense * per_dp + expert * static_bytes_per_param(do, edp, prec)
    n_moe, n_dense = split_layers(model, c["layers"], c["first"])
    mlp_gap = _mlp_params(model, model.ffn_hidden, tp) - _mlp_params(model, eq.ffn_hidden, tp)
    return n_moe * (real - eq_layer * per_dp) + gap * n_dense * mlp_gap * per_dp


def activation_delta_bytes(model: ModelArch, c: Mapping[str, np.ndarray], gap=1.0) -> tuple[np.ndarray, np.ndarray]:
    """(bytes each held micro batch adds, workspace bytes) beyond the dense equivalent (module docstring); a kept
    dense layer's MLP intermediates are 6·b·s·(f − f_eq)/tp bytes off (SwiGLU, Korthikanti et al. 2022 §4.1; × `gap`
    as in `static_delta_bytes`)."""
    tp, _, _, _, tokens = _ranks(model, c)
    copies = model.moe_load_imbalance * model.moe_router_topk
    # the experts' input is the λ·k copies of all b·s tokens of the expert tensor-parallel group: Megatron-LM's
    # alltoall dispatcher all-gathers the received tokens over it (token_dispatcher.py, MoEAlltoAllTokenDispatcher.
    # dispatch_postprocess: "AG(TP)"), and each rank's expert fc1 keeps that gathered input for its weight gradient;
    # the dense equivalent already holds its MLP input, 2·h per rank token (b·s/tp under sequence parallelism)
    gathered = copies * c["micro_batch"] * c["seq_len"].astype(np.float64)
    per_layer = 2.0 * model.hidden * (gathered - tokens) + 4.0 * tokens * model.num_experts
    (n_moe, n_dense), (rec_moe, rec_dense) = split_layers(model, c["layers"], c["first"]), _recomputed(model, c)
    mlp_gap = 6.0 * c["micro_batch"] * c["seq_len"] * (model.ffn_hidden - dense_equivalent(model).ffn_hidden) / tp
    work = (n_moe > 0) * 2.0 * BF16 * copies * tokens * model.hidden
    return (n_moe - rec_moe) * per_layer + gap * (n_dense - rec_dense) * mlp_gap, work


def _recomputed(model: ModelArch, c: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(MoE, dense) layers recomputed in full: the block method's first N are the dense ones first."""
    rl = nullable_floats(c["recompute_layers"])
    full = np.asarray(c["recompute"]) == "full"
    n = np.where(full, np.where(np.isnan(rl), c["layers"], np.minimum(rl, c["layers"])), 0.0)
    _, n_dense = split_layers(model, c["layers"], c["first"])
    dense = np.minimum(n, n_dense)
    return n - dense, dense


def time_delta_ms(model: ModelArch, c: Mapping[str, np.ndarray], gpus: Mapping[str, GpuType], gap=1.0) -> np.ndarray:
    """Forward + backward ms of the rows' MoE terms beyond the dense equivalent, one micro batch (the dense layers'
    MLP difference × `gap`, as in `static_delta_bytes`)."""
    tp, ep, _, _, tokens = _ranks(model, c)
    names = np.asarray(c["gpu"]).astype(str)
    peak = np.array([gpus[g].peak_tflops_bf16 for g in names]) * 1e9 * MFU  # FLOP per ms
    membw = np.array([gpus[g].memory_bandwidth_gbps for g in names]) * 1e6  # bytes per ms
    intra = np.array([gpus[g].intra_node_bandwidth_gbps for g in names]) * 1e6
    (L, n_dense), (n_rec, rec_dense) = split_layers(model, c["layers"], c["first"]), _recomputed(model, c)
    copies = model.moe_load_imbalance * model.moe_router_topk
    moved = BF16 * copies * tokens * model.hidden  # bytes a rank dispatches (and combines) per layer
    a2a = np.where(ep > 1, moved * (ep - 1) / ep / np.maximum(c["a2a_gbps"], 1e-9) / 1e6 + c["a2a_latency_ms"], 0.0)
    router = 3.0 * 2.0 * tokens * model.hidden * model.num_experts / peak
    permute = 8.0 * moved / membw
    etp = np.where(tp > 1, 2.0 * 2.0 * (tp - 1) / tp * moved * (copies - 1.0) / copies * tp / intra, 0.0)
    # a full recompute reruns the forward: 2 of the 4 all-to-alls, 1/3 of the router's 3 GEMMs, half the rest
    # a dense layer: the MLP GEMMs of f instead of f_eq, 2·b·s·h·3·Δf/tp FLOPs forward (Narayanan et al. 2021 §5.1)
    mlp_gap = 2.0 * c["micro_batch"] * c["seq_len"] * model.hidden * 3.0 \
        * (model.ffn_hidden - dense_equivalent(model).ffn_hidden) / tp / peak
    return (4.0 * L + 2.0 * n_rec) * a2a + (L + n_rec / 3.0) * router + (L + n_rec / 2.0) * (permute + etp) \
        + gap * (3.0 * n_dense + rec_dense) * mlp_gap


POINT_OF = {"time_ms": "time_ms", "time_ms_low": "time_ms", "time_ms_high": "time_ms", "peak_mem_mib": "peak_mem_mib",
            "peak_mem_mib_low": "peak_mem_mib", "peak_mem_mib_high": "peak_mem_mib", "static_mem_mib": "static_mem_mib"}


def adjust(pred: dict[str, np.ndarray], cols: Mapping[str, np.ndarray], model: ModelArch,
           gpus: Mapping[str, GpuType] | None, dense_shift: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A stage predictor's columns for the dense equivalent of MoE signature rows → the MoE stage's (in place;
    the interval columns shift with their points). `gpus` None: memory only (time columns unchanged).
    `dense_shift` (memx.planner.moe_dense.measured_dense_shift: the predictor measured the model's dense-first
    layers): per row, what the stage's dense layers change, in place of the closed form's MLP difference."""
    if not model.is_moe or "expert_parallel" not in cols:
        return pred
    gap = 1.0 if dense_shift is None else 0.0
    static = static_delta_bytes(model, cols, gap)
    act, work = activation_delta_bytes(model, cols, gap)
    peak = (static + cols["inflight"] * act + work) / MIB
    for col in ("peak_mem_mib", "peak_mem_mib_low", "peak_mem_mib_high"):
        if col in pred:
            pred[col] = pred[col] + peak
    pred["static_mem_mib"] = pred["static_mem_mib"] + static / MIB
    if gpus is not None:
        dt = time_delta_ms(model, cols, gpus, gap)
        for col in ("time_ms", "time_ms_low", "time_ms_high"):
            if col in pred:
                pred[col] = pred[col] + dt
    for col, point in POINT_OF.items():
        if dense_shift is not None and col in pred and point in dense_shift and (gpus is not None or point != "time_ms"):
            pred[col] = pred[col] + dense_shift[point]
    return pred


def stage_static_bytes(model: ModelArch, ctx, layers: np.ndarray, dense_bytes: np.ndarray) -> np.ndarray:
    """Static bytes of a MoE stage of `layers` layers: the dense equivalent's `dense_bytes` plus the delta."""
    n = np.asarray(layers)
    cols = {"tp": np.full(n.shape, ctx.tp), "expert_parallel": np.full(n.shape, float(ctx.expert_parallel)),
            "expert_dp": np.full(n.shape, float(ctx.expert_dp)), "micro_batch": np.full(n.shape, ctx.micro_batch),
            "seq_len": np.full(n.shape, model.seq_len), "sequence_parallel": np.full(n.shape, ctx.sequence_parallel),
            "distributed_optimizer": np.full(n.shape, ctx.distributed_optimizer), "dp": np.full(n.shape, ctx.dp),
            "precision": np.full(n.shape, ctx.precision, dtype=object), "layers": n, "first": np.full(n.shape, ctx.first)}
    return dense_bytes + static_delta_bytes(model, cols)


def dp_params_per_rank(model: ModelArch, ctx, layers: np.ndarray, dense_params: np.ndarray) -> np.ndarray:
    """The parameter count whose gradient step over the stage's dp ranks costs the bandwidth part of the MoE
    stage's two DP collectives. Megatron-LM keeps the expert parameters (`allreduce = False`) in their own
    gradient buffers, reduced over the expert data-parallel group, beside the dense buffers reduced over the
    dp × cp group (megatron/core/distributed/distributed_data_parallel.py: `expert_parallel_buffers` on
    `intra_expt_dp_group`, `expert_parallel_bucket_groups`; start/finish_grad_sync run the dense bucket groups
    then the expert ones): the non-expert part's ring over dp ranks, the expert part's over dp / ep ranks on the
    expert-dp rings' own link. A ring step's bandwidth term is ∝ (n − 1)/n · bytes / B
    (memx.planner.cost.dp_step_ms), so the expert ring's term equals the dp ring's on the expert part × share,
    share = (1 − ep/dp)/(1 − 1/dp) · B_dp / B_edp (`expert_dp_slowdown`, `a2a_links`) — exact, not an
    approximation. The expert collective's own latency, 2(n − 1)·α over its ranks, is a tail constant
    (memx.planner.collectives.expert_dp_latency_ms). `dense_params`: the dense equivalent's count
    (stage_params_per_rank)."""
    dp = ctx.expert_parallel * ctx.expert_dp
    dense, expert = layer_params_split(model, ctx.tp, ctx.expert_parallel)
    eq = dense_equivalent(model)
    eq_layer = layer_params(eq.hidden, eq.ffn_hidden, eq.heads, eq.query_groups, eq.mlp) / ctx.tp
    share = (1.0 - 1.0 / ctx.expert_dp) / (1.0 - 1.0 / dp) * ctx.expert_dp_slowdown if dp > 1 else 1.0
    n_moe, n_dense = split_layers(model, layers, ctx.first)
    mlp_gap = _mlp_params(model, model.ffn_hidden, ctx.tp) - _mlp_params(model, eq.ffn_hidden, ctx.tp)
    return dense_params + n_moe * (dense + expert * share - eq_layer) + n_dense * mlp_gap


def a2a_links(cluster: Cluster, plan: Plan) -> tuple[tuple[float, float, float, float], ...]:
    """(effective GB/s per rank, latency ms, expert-dp slowdown, expert-dp step latency ms) of each stage's
    all-to-all over its ep groups (ep consecutive dp
    replicas: Megatron's rank order tp-cp-ep-dp-pp puts ep inside dp; the first-fit placement puts a stage's
    replicas on as few nodes as it can, memx.domain.plan.place_plan). A rank sends 1/ep of its volume V to
    each of the other ep − 1 ranks of its group; the all-to-all takes the longest of: a rank's peers in its
    node over the intra-node link, its peers on other nodes over the pair link (memx.planner.network.pair_link,
    cross-vendor included), and a node's bytes leaving over its NICs — all tp ranks of every group of the stage
    at once (`nic_share_gbps`). Effective bandwidth = V·(ep − 1)/ep ÷ that time. ep 1: no all-to-all (0, 0).
    The expert-dp rings: the replicas r ≡ j (mod ep) hold the same experts (Megatron's expert data-parallel
    group), one ring per expert slot j and tp rank, tp·ep rings at once: they all run together
    (memx.planner.network.ring_link). The slowdown is the stage's dp ring bandwidth (tp rings) over the slowest
    expert-dp ring's; the step latency the slowest hop's of any of them (`dp_params_per_rank`,
    memx.planner.collectives.expert_dp_latency_ms). ep 1: slowdown 1, latency 0."""
    ep = plan.expert_parallel
    where = place_plan(plan, cluster)
    if ep == 1 or where is None:
        return tuple((0.0, 0.0, 1.0, 0.0) for _ in plan.stages)
    return tuple(stage_links(cluster, [where[r][s] for r in range(plan.dp)], ep, st.tp)
                 for s, st in enumerate(plan.stages))


def stage_links(cluster: Cluster, nodes: Sequence[int], ep: int, tp: int) -> tuple[float, float, float, float]:
    """One stage's `a2a_links` entry from the node of each of its dp (× cp) TP groups in rank order (ep groups:
    `ep` consecutive ones; expert-dp rings: nodes[j::ep]); a per-stage-dp stage's groups too (memx.planner.stage_dp).
    ep 1: (0, 0, 1, 0)."""
    return (0.0, 0.0, 1.0, 0.0) if ep == 1 else _stage_links(cluster, tuple(nodes), ep, tp)


@lru_cache(maxsize=1 << 14)
def _stage_links(cluster: Cluster, nodes: tuple[int, ...], ep: int, tp: int) -> tuple[float, float, float, float]:
    """`stage_links` at ep > 1 (a per-stage-dp search asks for the same few hundred thousands of times)."""
    nodes = list(nodes)
    dp_bw = ring_link(cluster, nodes, tp)[0]
    rings = [ring_link(cluster, nodes[j::ep], tp * ep) for j in range(ep)]
    edp_bw, edp_lat = min(bw for bw, _ in rings), max(lat for _, lat in rings)
    return (*_stage_a2a(cluster, nodes, ep, tp), dp_bw / edp_bw, edp_lat)


def _stage_a2a(cluster: Cluster, nodes: list[int], ep: int, tp: int) -> tuple[float, float]:
    slowest, lat, leaving = 0.0, 0.0, Counter()
    groups = [nodes[g:g + ep] for g in range(0, len(nodes), ep)]
    for group in groups:
        count = Counter(group)
        for a in count:
            intra = (count[a] - 1) / ep / cluster.nodes[a].gpu.intra_node_bandwidth_gbps
            inter = 0.0
            for b in count:
                if b != a:
                    bw, link_lat = pair_link(cluster, a, b)
                    inter, lat = inter + count[b] / ep / bw, max(lat, link_lat)
            slowest = max(slowest, intra, inter)
            leaving[a] += tp * count[a] * (ep - count[a]) / ep  # V units leaving node a
    for a, volume in leaving.items():  # the node's NICs carry every flow out at once
        flows = max(int(round(volume * ep)), 1)
        slowest = max(slowest, volume / (nic_share_gbps(cluster, a, flows) * flows))
    return (ep - 1) / ep / slowest, lat


def expert_dp_size(dp: int, cp: int, ep: int) -> int:
    """The expert data-parallel size of a stage: its dp × cp ranks over ep (Megatron's expert grid has no cp axis:
    parallel_state.py, expert dp = world / (etp × ep × pp); memx.domain.plan.moe_problems)."""
    return dp * cp // ep


def with_experts(ctxs: Sequence, ep: int | Sequence[int], expert_dp: int | Sequence[int],
                 links: Sequence[tuple[float, ...]]) -> tuple:
    """Stage contexts carrying ep and the expert dp size (one each, or one per stage with a per-stage dp,
    memx.planner.stage_dp) and each stage's links (`a2a_links`; a MoE model's; the expert-dp latency is the
    pipeline's, not a context's: memx.planner.collectives.expert_dp_latency_ms)."""
    eps = [ep] * len(ctxs) if isinstance(ep, int) else ep
    dps = [expert_dp] * len(ctxs) if isinstance(expert_dp, int) else expert_dp
    return tuple(_expert_context(c, e, d, bw, lat, slow)
                 for c, e, d, (bw, lat, slow, *_) in zip(ctxs, eps, dps, links, strict=True))


@lru_cache(maxsize=1 << 16)
def _expert_context(ctx, ep: int, expert_dp: int, bw: float, lat: float, slow: float):
    """One context of `with_experts` (searches ask for the same few thousand often)."""
    return dataclasses.replace(ctx, expert_parallel=ep, expert_dp=expert_dp, a2a_gbps=bw, a2a_latency_ms=lat,
                               expert_dp_slowdown=slow)


def plan_expert_contexts(ctxs: Sequence, plan: Plan, model: ModelArch, cluster: Cluster) -> tuple:
    """`ctxs` (memx.planner.tables.plan_contexts) of a plan of a MoE model with its experts; others unchanged."""
    if not model.is_moe:
        return tuple(ctxs)
    ep = plan.expert_parallel  # cp > 1: the all-to-all's ep groups are among the rank-equivalent plan's dp·cp replicas
    return with_experts(ctxs, ep, expert_dp_size(plan.dp, plan.context_parallel, ep),
                        a2a_links(cluster, rank_equivalent(plan)))


def expert_parallelisms(space: SearchSpace, model: ModelArch, dp: int) -> list[int]:
    """The ep values searched for a layout of `dp` replicas (dp·cp with context parallelism;
    SearchSpace.expert_parallel_options): 1 for a dense model; else those that divide it
    (memx.domain.plan.moe_problems; that they divide num_experts is checked on the space,
    `expert_option_problems`)."""
    if not model.is_moe:
        return [1]
    return [ep for ep in space.expert_parallel_options if dp % ep == 0]


def expert_option_problems(space: SearchSpace, model: ModelArch) -> list[str]:
    """Every expert_parallel_options value > 1 that a dense model cannot take, that replica groups cannot carry or
    that does not divide the model's experts: one message naming them (exit 2)."""
    big = [ep for ep in space.expert_parallel_options if ep > 1]
    if big and not model.is_moe:
        return [f"search '{space.name}': field 'expert_parallel_options' {big} needs a mixture-of-experts model; "
                f"{model.name} has no 'num_experts'"]
    if big and space.max_replica_groups > 1:
        return [f"search '{space.name}': field 'expert_parallel_options' {big} needs max_replica_groups 1 (a plan of "
                "replica groups, schema 2, has no expert_parallel; neither Megatron-LM nor FlagScale runs it)"]
    bad = [ep for ep in big if model.is_moe and model.num_experts % ep]
    if bad:
        return [f"search '{space.name}': field 'expert_parallel_options' values {bad} do not divide num_experts "
                f"({model.num_experts}) of model {model.name}"]
    return []
