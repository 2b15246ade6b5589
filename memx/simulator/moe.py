"""Mixture-of-experts layers on the virtual cluster (issue #27; docs/simulator.md §Mixture of experts).
Independent of the planner: its own kernels (memx.simulator.physics) and links (memx.simulator.links).

A MoE stage is simulated as its dense layers (attention, norms, and the shared expert as the dense MLP when
the model has one) plus, per layer, what Megatron-LM's MoELayer with the alltoall token dispatcher runs
(megatron/core/transformer/moe/: router.py, token_dispatcher.py, experts.py): the router GEMM and its top-k
softmax; the permutation of the k copies of every token; the dispatch all-to-all over the stage's ep group
(ep consecutive data-parallel replicas); with tp > 1 the all-gather of the received tokens over the expert
tensor-parallel group (= tp) and the reduce-scatter back; E/ep local experts as a grouped GEMM — the busiest
rank gets λ × the average tokens (`moe_load_imbalance`), split evenly over its local experts, so few tokens
per expert run at the small-GEMM efficiency of gemm_ms —; the combine all-to-all and the unpermutation.
Backward runs each of them again (GEMMs twice). A model without a shared expert has no dense MLP: the
signature's MLP (one expert's width over all tokens) is taken out again with the same kernels.

Memory: the local experts' weights with their optimizer state sharded over the expert data-parallel group
(dp / ep ranks) with the distributed optimizer, and the router's; activations per kept layer: the gathered
expert input, the expert MLP intermediates, the fp32 router probabilities; the dispatch buffers as workspace.
The expert gradients are all-reduced (or reduce-scattered and the parameters all-gathered) over the ranks
holding the same experts: replicas r ≡ j (mod ep), a ring over their nodes. The model's first
`moe_first_dense_layers` layers run as dense layers (MLP `ffn_hidden`) on whichever stages hold them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from typing import Any, Mapping

import numpy as np

from memx.domain.errors import InputError
from memx.domain.plan import Plan, place_plan
from memx.domain.moe_records import expert_group_plan, expert_model
from memx.domain.stage_dp import stage_eps
from memx.domain.specs import Cluster, GpuType, ModelArch
from memx.simulator.links import link, ring, shared_nic
from memx.simulator.physics import (BF16_BYTES, FP32_BYTES, GRAD_BYTES_OF, Device, adam_step_ms, gemm_ms,
                                    membound_ms, ring_allreduce_ms, ring_collective_ms, tp_boundary_ms,
                                    tp_collective_ms)
from memx.simulator.interleave import chunk_signatures
from memx.simulator.stage import (ADAM_STATIC_BYTES_PER_PARAM, MIB, REPLICATED_BYTES_PER_PARAM, StageCost, StageRun,
                                  StageSignature, run_of, stage_cost)
from memx.simulator.traits import GpuTraits


def dense_ffn(model: ModelArch) -> int:
    """The MLP width of a MoE stage's signature: the shared expert's, else one routed expert's (taken out
    again by `moe_cost`)."""
    return model.moe_shared_expert_ffn_hidden or model.expert_ffn_hidden


def _mlp(dev: Device, tokens: float, width: float, tp: int, h: int, groups: float = 1.0,
         gated: bool = True) -> tuple[float, float]:
    """(forward, backward) ms of the MLPs on `tokens` tokens split evenly over `groups` experts of inner size
    `width` / tp: up (+gate when `gated`: SwiGLU) and down GEMMs (a grouped GEMM: `groups` batched matrices) and
    the activation (SwiGLU reads gate and up and writes one, GeLU reads and writes one: as physics.layer_cost)."""
    per = tokens / groups
    up = (2 if gated else 1) * width / tp
    g = gemm_ms(dev, per, up, h, groups, linear=True) + gemm_ms(dev, per, h, width / tp, groups, linear=True)
    act = (6.0 if gated else 4.0) * tokens * width / tp
    return g + membound_ms(dev, act, 1), 2 * g + membound_ms(dev, 2 * act, 2)


def _matrices(model: ModelArch) -> float:
    """h × f matrices of one expert MLP: 3 with SwiGLU (gate, up, down), 2 with GeLU (Megatron-LM
    moe/experts.py doubles fc1 only with gated_linear_unit)."""
    return 3.0 if model.mlp == "swiglu" else 2.0


def replica_nodes(plan: Plan, where: list[list[int]], s: int) -> list[int]:
    """The node of each data-parallel replica's stage s (`where`: memx.domain.plan.place_plan, replica by replica)."""
    return [where[r][s] for r in range(plan.dp)]


def a2a_ms(plan: Plan, cluster: Cluster, nodes: list[int], s: int, nbytes: float, traits: GpuTraits,
           ep: int | None = None) -> float:
    """One all-to-all of stage s, whose TP groups sit on `nodes` in rank order (`replica_nodes`; a per-stage-dp
    stage's groups, memx.simulator.stage_dp): every rank of an ep group (ep consecutive groups) sends nbytes/ep to
    each other member, all at once; the slowest member finishes it. A member's bytes to peers in its node share its
    intra-node link; bytes to other nodes share the node's NICs with every flow leaving that node at once (tp ranks
    × members × off-node peers, links.shared_nic); each flow also at most its pair link (cross-vendor included).
    `ep`: the stage's (a per-stage-dp plan's own, memx.simulator.stage_dp); None: the plan's."""
    ep, tp = plan.expert_parallel if ep is None else ep, plan.stages[s].tp
    groups = [nodes[g:g + ep] for g in range(0, len(nodes), ep)]
    flows: Counter = Counter()
    for grp in groups:
        for a in grp:
            flows[a] += tp * sum(1 for b in grp if b != a)
    part, worst = nbytes / ep, 0.0
    for grp in groups:
        for i, a in enumerate(grp):
            same = sum(1 for j, b in enumerate(grp) if b == a and j != i)
            t = same * part / (link(cluster, a, a)[0] * traits.link_efficiency)
            for j, b in enumerate(grp):
                if b != a:
                    bw, lat = link(cluster, a, b)
                    bw = min(bw, shared_nic(cluster, a, flows[a]), shared_nic(cluster, b, flows[b]))
                    t = max(t, part / (bw * traits.link_efficiency) + lat)
            worst = max(worst, t)
    return worst + traits.collective_step_latency_ms


def moe_cost(cost: StageCost, sig: StageSignature, model: ModelArch, ep: int, a2a: float, gpu: GpuType,
             traits: GpuTraits) -> tuple[StageCost, float]:
    """(the MoE stage's cost, its expert parameters per GPU) from the dense stage cost of its signature (module
    docstring); `a2a`: one all-to-all's ms on the stage's links (`a2a_ms`)."""
    if not sig.layers:
        return cost, 0.0
    dev, d = Device.of(gpu, traits, sig.precision), sig.dims()
    h, tp, E, fe = model.hidden, sig.tp, model.num_experts, model.expert_ffn_hidden
    rank_tokens = d.tokens / tp if d.sp else d.tokens
    copies = model.moe_load_imbalance * model.moe_router_topk
    gathered = copies * (d.tokens if tp > 1 else rank_tokens)  # the expert GEMMs' tokens on the busiest rank
    e_local = E / ep
    gated = model.mlp == "swiglu"
    exp_f, exp_b = _mlp(dev, gathered, fe, tp, h, e_local, gated)
    router_f = gemm_ms(dev, rank_tokens, E, h) + membound_ms(dev, 3 * FP32_BYTES * rank_tokens * E, 2)
    router_b = 2 * gemm_ms(dev, rank_tokens, E, h) + membound_ms(dev, 3 * FP32_BYTES * rank_tokens * E, 2)
    perm = membound_ms(dev, 2 * 2 * BF16_BYTES * copies * rank_tokens * h, 2)  # permute + unpermute, read + write
    etp = 2 * tp_collective_ms(dev, d, BF16_BYTES * gathered * h) - tp_boundary_ms(dev, d, BF16_BYTES * d.tokens * h) \
        if tp > 1 else 0.0  # the experts' gather / scatter instead of the dense MLP's TP boundary
    shared = model.moe_shared_expert_ffn_hidden is not None
    drop_f, drop_b = (0.0, 0.0) if shared else _mlp(dev, d.tokens, fe, tp, h, gated=gated)
    f1 = exp_f + router_f + perm + etp - drop_f + 2 * a2a
    b1 = exp_b + router_b + perm + etp - drop_b + 2 * a2a
    n_full = sig.recomputed_layers
    fwd = cost.fwd_ms + sig.layers * f1
    bwd = cost.bwd_ms + sig.layers * b1 + traits.recompute_penalty_factor * n_full * f1
    expert = sig.layers * e_local * _matrices(model) * h * fe / tp
    dense = sig.layers * (h * E - (0.0 if shared else _matrices(model) * h * fe / tp))
    shards_dp, shards_edp = sig.optimizer_shards, max(sig.optimizer_shards // ep, 1)
    per_param = cost.static_mem_mib * MIB / cost.params if cost.params else 0.0
    states = per_param - REPLICATED_BYTES_PER_PARAM  # the optimizer state left per parameter after sharding
    static = cost.static_mem_mib * MIB + dense * per_param \
        + expert * (REPLICATED_BYTES_PER_PARAM + states * shards_dp / shards_edp)
    keep = BF16_BYTES * gathered * h + BF16_BYTES * 3 * gathered * fe / tp + FP32_BYTES * rank_tokens * E
    drop = 0.0 if shared else BF16_BYTES * 3 * d.tokens * fe / tp
    act = cost.act_mem_mib * MIB + (sig.layers - n_full) * (keep - drop)
    work = cost.workspace_mem_mib * MIB + 2 * BF16_BYTES * copies * rank_tokens * h
    opt = cost.optimizer_ms + adam_step_ms(dev, expert / shards_edp + dense / shards_dp) - adam_step_ms(dev, 0.0)
    return dataclasses.replace(cost, fwd_ms=fwd, bwd_ms=bwd, params=cost.params + dense, static_mem_mib=static / MIB,
                               act_mem_mib=act / MIB, workspace_mem_mib=work / MIB, optimizer_ms=opt), expert


def dispatch_bytes(model: ModelArch, sig: StageSignature) -> float:
    """Bytes one rank dispatches (and combines) per MoE layer: λ·k copies of its tokens' hidden states."""
    d = sig.dims()
    rank_tokens = d.tokens / sig.tp if d.sp else d.tokens
    return BF16_BYTES * model.moe_load_imbalance * model.moe_router_topk * rank_tokens * model.hidden


def measure_expert_stage(sig: StageSignature, point: Mapping[str, Any], gpu: GpuType, traits: GpuTraits,
                         cluster: Cluster | None, *, rng: np.random.Generator,
                         static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM) -> StageRun:
    """One MoE stage alone (a profile point with experts, issue #27): the stage of `sig` — whose `ffn_hidden` is
    the dense equivalent's, as records hold it (memx.domain.records) — run with its real MoE layers (`moe_cost`)
    at the row's expert parallelism, its all-to-all over the ep group's placement on `cluster`
    (memx.domain.records.expert_group_plan; `a2a_ms`). The expert gradients' DP step belongs to the plan's tail,
    not to a stage run."""
    model, ep = expert_model(point), int(point.get("expert_parallel") or 1)
    m_sig = dataclasses.replace(sig, ffn_hidden=dense_ffn(model))
    a2a = 0.0
    if ep > 1:
        plan = expert_group_plan(point)
        where = None if cluster is None else place_plan(plan, cluster)
        if where is None:
            raise InputError(f"stage signature: field 'expert_parallel' {ep} needs {ep} × tp {sig.tp} GPUs "
                             f"{sig.gpu} on the cluster given (its all-to-all runs over their links)")
        a2a = a2a_ms(plan, cluster, replica_nodes(plan, where, 0), 0, dispatch_bytes(model, m_sig), traits)
    cost, _ = moe_cost(stage_cost(m_sig, gpu, traits, static_bytes_per_param), m_sig, model, ep, a2a, gpu, traits)
    return run_of(cost, m_sig, gpu, traits, rng=rng)


def moe_stage_costs(plan: Plan, model: ModelArch, cluster: Cluster, nodes: list[list[int]], sigs: list[StageSignature],
                    costs: list[StageCost], chunks: list[list[StageCost]] | None, tr: dict[str, GpuTraits],
                    static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM):
    """(stage costs, chunk costs or None, per-stage expert dp step ms) of a MoE plan from its dense costs; `nodes[s]`:
    the node of each of stage s's TP groups in rank order (`replica_nodes`; a per-stage-dp plan's own groups,
    memx.simulator.stage_dp), stage s at its ep (memx.domain.stage_dp.stage_eps: the plan's, or a per-stage-dp
    stage's own). The model's first `moe_first_dense_layers` layers, wherever the split puts them, run a dense MLP
    (`_with_dense`)."""
    out, out_chunks, dp_ms = [], None if chunks is None else [], []
    v, per_chunk = plan.virtual_stages, [st.layers // plan.virtual_stages for st in plan.stages]
    for s, (sig, cost, ep) in enumerate(zip(sigs, costs, stage_eps(plan))):
        gpu, t = cluster.gpu(sig.gpu), tr[sig.gpu]
        a2a = a2a_ms(plan, cluster, nodes[s], s, dispatch_bytes(model, sig), t, ep) if ep > 1 else 0.0
        args = (model, ep, a2a, gpu, t, static_bytes_per_param)
        new, expert = _with_dense(cost, sig, sum(st.layers for st in plan.stages[:s]), *args)
        out.append(new)
        dp_ms.append(expert_dp_ms(plan, cluster, nodes[s], s, expert, t, ep))
        if chunks is not None:  # chunk c of rank s is virtual stage c·pp + s
            out_chunks.append([_with_dense(c, sc, c_i * sum(per_chunk) + sum(per_chunk[:s]), *args)[0]
                               for c_i, (c, sc) in enumerate(zip(chunks[s], chunk_signatures(sig, s, plan.pp, v)))])
    return out, out_chunks, dp_ms


def _with_dense(cost: StageCost, sig: StageSignature, offset: int, model: ModelArch, ep: int, a2a: float,
                gpu: GpuType, traits: GpuTraits, bpp: float) -> tuple[StageCost, float]:
    """`moe_cost` of a stage whose layers start at model layer `offset`; the ones below `moe_first_dense_layers`
    run as a dense stage of their own (MLP `ffn_hidden`, the block recompute's first layers), added to the rest."""
    dense = max(0, min(offset + sig.layers, model.moe_first_dense_layers) - offset)
    if not dense:
        return moe_cost(cost, sig, model, ep, a2a, gpu, traits)
    n_rec = sig.recomputed_layers
    rec_dense = min(n_rec, dense)
    part = dataclasses.replace(sig, layers=dense, ffn_hidden=model.ffn_hidden, first=False, last=False,
                               recompute=sig.recompute if rec_dense or sig.recompute == "selective" else "none",
                               recompute_layers=rec_dense if 0 < rec_dense < dense else None)
    d_cost = stage_cost(part, gpu, traits, bpp)
    rest, rec_rest = sig.layers - dense, n_rec - rec_dense
    if not (rest or sig.first or sig.last):
        return d_cost, 0.0
    m_sig = dataclasses.replace(sig, layers=rest, recompute=sig.recompute if rec_rest or sig.recompute != "full"
                                else "none", recompute_layers=rec_rest if 0 < rec_rest < rest else None)
    m_cost, expert = moe_cost(stage_cost(m_sig, gpu, traits, bpp), m_sig, model, ep, a2a, gpu, traits)
    return dataclasses.replace(
        m_cost, fwd_ms=m_cost.fwd_ms + d_cost.fwd_ms, bwd_ms=m_cost.bwd_ms + d_cost.bwd_ms, params=m_cost.params
        + d_cost.params, static_mem_mib=m_cost.static_mem_mib + d_cost.static_mem_mib, act_mem_mib=m_cost.act_mem_mib
        + d_cost.act_mem_mib, workspace_mem_mib=max(m_cost.workspace_mem_mib, d_cost.workspace_mem_mib),
        optimizer_ms=m_cost.optimizer_ms + d_cost.optimizer_ms), expert


def expert_dp_ms(plan: Plan, cluster: Cluster, nodes: list[int], s: int, expert_params: float,
                 traits: GpuTraits, ep: int | None = None) -> float:
    """The expert gradients' data-parallel step of stage s (its TP groups on `nodes`, as `a2a_ms`): one ring per TP
    rank and expert slot over the groups holding the same experts (g ≡ j mod ep); like the dense step, all-reduce,
    or reduce-scatter + all-gather with the distributed optimizer. The ep rings run at once: the slowest. `ep`: as
    `a2a_ms`'s."""
    ep = plan.expert_parallel if ep is None else ep
    edp = len(nodes) // ep
    grad = GRAD_BYTES_OF[plan.precision]
    worst = 0.0
    for j in range(ep):
        bw, step = ring(cluster, nodes[j::ep], [traits] * edp, plan.stages[s].tp * ep)
        if plan.distributed_optimizer:
            t = ring_collective_ms(grad * expert_params, edp, bw, step) \
                + ring_collective_ms(BF16_BYTES * expert_params, edp, bw, step)
        else:
            t = ring_allreduce_ms(grad * expert_params, edp, bw, step)
        worst = max(worst, t)
    return worst
