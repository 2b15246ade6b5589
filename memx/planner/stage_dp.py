"""A data-parallel degree per stage in the closed form (issue #27; docs/planner.md §Data parallel per stage).

A plan whose stages carry their own dp_i (memx.domain.stage_dp: FlagScale's per-mesh dp) is ONE pipeline whose
stage s runs on dp_s TP groups in lockstep: every micro batch of B = dp × micro_batch samples is split dp_s
ways there, so stage s computes a per-rank micro batch b_s = B / dp_s (FlagScale pre_validate_args,
`micro_batch_size = data_parallel_size · micro_batch_size // dp`), and the m = global_batch / B micro batches
flow through the stages in 1F1B order. What changes against memx.planner.schedule's assembly:

- stage time and peak: the stage predictor's, at micro batch b_s (its signature: `stage_contexts` with
  micro_batch b_s and, with the distributed optimizer, the dp_s optimizer shards); the 1F1B in-flight count
  min(pp − s, m) is unchanged (Narayanan et al. 2021 §2.2.1: m and pp are).
- the hand-off between stages of different dp: the activation [s, B, h] is re-sliced along the batch; each
  source rank sends its b_a rows to the fan_out destination ranks whose segments overlap them, each destination
  receives its b_b rows from fan_in sources (memx.domain.stage_dp.handoff; FlagScale
  hetero/parallel_context.py `get_inter_mesh_tensor_slices`), one blocking send / receive per piece in turn
  (hetero/p2p_communication.py `recv_forward_hetero` / `send_forward_hetero` loop over the slices). So one
  boundary's transfer takes
      p2p_s = max(b_a, b_b) · s · h · 2 B / bw + max(fan_in, fan_out) · latency
  (the busiest rank moves its whole slice and pays one latency per piece), bw the slowest piece's link, a node's
  NICs shared by its ranks that send (receive) across nodes at once, one flow each — a rank's own pieces follow one
  another (memx.planner.network.pair_link, nic_share_gbps).
  Equal dp on both sides: fan 1, b_a = b_b — the paper's p2p_s exactly. The gradient goes back the same way.
- the tail: stage s all-reduces its gradients over its own dp_s ranks (ring, Patarasuk & Yuan 2009; the T_dp of
  paper §3.1.2; distributed optimizer: reduce-scatter + all-gather over dp_s, memx.planner.cost.dp_step_ms) on
  the ring of its dp_s groups' nodes, tp_s rings at once (memx.planner.network.ring_link), then its Adam step;
  the iteration ends with the slowest stage's tail.
- memory: M, V and the margin over GPUs weight stage s's peak by its tp_s · dp_s GPUs (paper §3.1.2).

- tied embeddings: the first and last stage's tails carry FlagScale's embedding all-reduces (`embedding_ms`,
  memx.domain.stage_dp.embedding_groups).
- context parallelism cp (one for the plan, memx.domain.stage_dp): stage s has dp_s · cp TP groups; every rank
  computes b_s samples of s/cp tokens (its signature's seq_len, memx.planner.signatures) plus the ring attention's
  terms over the stage's cp rings (`cp_links`, memx.planner.context_parallel.add_ring_terms); the hand-off goes cp
  rank to cp rank with b · (s/cp) · h messages; T_dp and the optimizer shards are over dp_s · cp ranks.
- a mixture-of-experts model (ep 1: session 14; ep > 1 and an ep per stage: session 15;
  memx.domain.stage_dp.stage_dp_problems: each stage's ep, its own or the plan's, dividing its dp_s · cp): stage s's
  expert data-parallel group is its dp_s · cp / ep ranks (Megatron-LM's expert dp = dp · cp / ep,
  memx.planner.moe.expert_dp_size, with the stage's own dp and ep; FlagScale builds each mesh's expert grid from its
  own ranks). Its ep groups are ep consecutive TP groups of the stage
  (`place_stage_groups` order), its expert-dp rings the groups j, j + ep, … (`expert_links`: memx.planner.moe.
  stage_links, the uniform plan's all-to-all and ring rules on the stage's own groups); `with_stage_experts` gives
  each stage context ep, its expert dp and those links, memx.planner.moe.adjust adds the router, the all-to-all,
  the experts and their memory as for a uniform plan, and the expert collective's latency joins the stage's tail
  (`stage_expert_latency_ms`). At ep 1 every rank holds all its stage's experts: no all-to-all, the expert
  gradients ride the stage's dp_s ring (memx.planner.moe.dp_params_per_rank: one ring, no expert-dp slowdown).

T = (m − 1) · max_s t_s + Σ_s t_s + Σ_{s<pp−1} 2 · p2p_s + max_s tail_s (paper §3.1.2, Narayanan et al. 2021
§2.2.1), the same formula as every other plan; a calibrated predictor's c, o and d apply as in
schedule.Pipeline.fixed_ms, and with pipeline_assembly cycle-mean (max_s t_s → the maximum cycle mean over the
boundaries' p2p, memx.planner.schedule.steady_period_ms) as in schedule.Pipeline.assemble.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import numpy as np

from memx.domain.plan import Plan
from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import Cluster, ModelArch
from memx.domain.stage_dp import (embedding_groups, group_handoff, place_stage_groups, stage_eps, stage_groups,
                                  stage_micro_batches)
from memx.planner import moe
from memx.planner.collectives import dp_latency_ms, embedding_link, embedding_sync_ms, expert_dp_latency_ms
from memx.planner.metrics import PlanMetrics, plan_metrics
from memx.planner.network import nic_share_gbps, pair_link, ring_link, slowest_hop
from memx.planner.schedule import (
    AssemblyCalibration,
    blocking_transfers,
    drains,
    iteration_time_ms,
    memory_stats,
    p2p_ms,
    stage_tail_ms,
    steady_loop_ms,
)
from memx.planner.tables import StageContext, plan_contexts


def contexts(plan: Plan, ctxs: tuple[StageContext, ...]) -> tuple[StageContext, ...]:
    """The plan's stage contexts at each stage's per-rank micro batch b_s and, with the distributed optimizer,
    its dp_s · cp optimizer shards (module docstring)."""
    return tuple(_at_rank(c, b, g if c.distributed_optimizer else 1)
                 for c, b, g in zip(ctxs, stage_micro_batches(plan), stage_groups(plan), strict=True))


def expert_links(cluster: Cluster | None, plan: Plan) -> tuple[tuple[float, float, float, float], ...]:
    """Per stage, memx.planner.moe.stage_links over its dp_s · cp groups' nodes (`place_stage_groups`, rank order:
    an ep group is ep consecutive groups, FlagScale's expert grid 'tp-ep-dp' inside the mesh): the all-to-all's
    GB/s and latency, the expert-dp slowdown and step latency. ep 1 — no all-to-all — and without a cluster (memory
    only, as memx.planner.estimate's uniform contexts: the links do not change it): (0, 0, 1, 0)."""
    eps = stage_eps(plan)
    if max(eps) == 1 or cluster is None:
        return tuple((0.0, 0.0, 1.0, 0.0) for _ in plan.stages)
    where = place_stage_groups(plan, cluster)
    assert where is not None  # validated
    return tuple(moe.stage_links(cluster, row, ep, st.tp) for row, ep, st in zip(where, eps, plan.stages))


def with_stage_experts(plan: Plan, ctxs: tuple[StageContext, ...],
                       links: tuple[tuple[float, ...], ...]) -> tuple[StageContext, ...]:
    """A MoE model's stage contexts: stage s's ep_s (memx.domain.stage_dp.stage_eps), its expert dp group of
    dp_s · cp / ep_s ranks, its all-to-all and expert-dp links `links[s]` (`expert_links`; module docstring)."""
    eps = stage_eps(plan)
    return moe.with_experts(ctxs, eps, [g // e for g, e in zip(stage_groups(plan), eps)], links)


def plan_stage_contexts(plan: Plan, cluster: Cluster | None, model: ModelArch | None = None
                        ) -> tuple[StageContext, ...]:
    """`contexts` of a given plan; with context parallelism and a cluster, each stage's cp ring (`cp_links`); a
    mixture-of-experts `model`'s with each stage's experts (`with_stage_experts`)."""
    rings = cp_links(cluster, plan) if plan.context_parallel > 1 and cluster is not None else None
    ctxs = contexts(plan, plan_contexts(plan, rings))
    if model is None or not model.is_moe:
        return ctxs
    return with_stage_experts(plan, ctxs, expert_links(cluster, plan))


@functools.lru_cache(maxsize=1 << 16)
def _at_rank(ctx: StageContext, micro_batch: int, dp: int) -> StageContext:
    """A context at a per-rank micro batch and optimizer shards (a search asks for the same few thousand often)."""
    return dataclasses.replace(ctx, micro_batch=micro_batch, dp=dp)


def cp_links(cluster: Cluster, plan: Plan) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage, (GB/s, latency ms) of its cp rings: the cp groups of each dp rank (`stage_groups` order), one ring
    per TP rank, every ring of the stage at once — the slowest hop (memx.planner.context_parallel's rule on this
    placement)."""
    where, cp = place_stage_groups(plan, cluster), plan.context_parallel
    assert where is not None  # validated
    links = [slowest_hop(cluster, [(row[g * cp + c], row[g * cp + (c + 1) % cp]) for g in range(len(row) // cp)
                                   for c in range(cp)], st.tp) for row, st in zip(where, plan.stages)]
    return tuple(b for b, _ in links), tuple(t for _, t in links)


def boundary(cluster: Cluster, plan: Plan, where: list[list[int]], s: int) -> tuple[int, int, float, float]:
    """(busiest rank's samples max(b_a, b_b), pieces per rank max(fan_in, fan_out), GB/s, latency ms) of the
    hand-off from stage s to s + 1 (module docstring), every cp rank's pieces at once."""
    b_a, b_b = stage_micro_batches(plan)[s], stage_micro_batches(plan)[s + 1]
    pieces = group_handoff(plan, s)
    fan = max(max(Counter(a for a, _, _ in pieces).values()), max(Counter(b for _, b, _ in pieces).values()))
    hops = [(a, b, where[s][a], where[s + 1][b]) for a, b, _ in pieces]
    # a rank sends (receives) its pieces one after another: the flows through a node's NICs at once are its
    # ranks that send out of (receive into) it, one each
    out = Counter(x for x, _ in {(x, a) for a, _, x, y in hops if x != y})
    into = Counter(y for y, _ in {(y, b) for _, b, x, y in hops if x != y})
    bw, lat = np.inf, 0.0
    for _, _, x, y in hops:
        link_bw, link_lat = pair_link(cluster, x, y)
        if x != y:
            link_bw = min(link_bw, nic_share_gbps(cluster, x, out[x]), nic_share_gbps(cluster, y, into[y]))
        bw, lat = min(bw, link_bw), max(lat, link_lat)
    return max(b_a, b_b), fan, float(bw), lat


def boundary_p2p_ms(cluster: Cluster, plan: Plan, model: ModelArch, where: list[list[int]]) -> np.ndarray:
    """(pp − 1,) p2p_s: one micro batch's activation over each boundary (a cp rank's message holds its s/cp
    tokens)."""
    out = []
    for s in range(plan.pp - 1):
        rows, fan, bw, lat = boundary(cluster, plan, where, s)
        out.append(float(p2p_ms(rows, plan.seq_len // plan.context_parallel, model.hidden, np.asarray([bw]),
                                fan * lat)[0]))
    return np.asarray(out, dtype=np.float64)


def dp_rings(cluster: Cluster, plan: Plan, where: list[list[int]]) -> list[tuple[float, float]]:
    """Per stage, (GB/s, step latency ms) of its gradient ring over its dp_s · cp groups (the dp-cp group,
    memx.domain.context_parallel; tp_s concurrent rings)."""
    return [ring_link(cluster, nodes, st.tp) for nodes, st in zip(where, plan.stages)]


def stage_expert_latency_ms(plan: Plan, cluster: Cluster, model: ModelArch) -> np.ndarray:
    """(pp,) each stage's expert-gradient collective latency, 2(n − 1)·α over its dp_s · cp / ep expert-dp ranks at
    its expert-dp rings' step latency (memx.planner.collectives.expert_dp_latency_ms on `expert_links`); 0 for a dense
    model and at ep 1 (the experts ride the stage's dp ring: memx.planner.moe.dp_params_per_rank)."""
    if not model.is_moe or max(stage_eps(plan)) == 1:
        return np.zeros(plan.pp)
    return expert_dp_latency_ms(np.asarray(stage_groups(plan)), np.asarray(stage_eps(plan)), expert_links(cluster, plan))


def embedding_ms(cluster: Cluster, plan: Plan, model: ModelArch, where: list[list[int]]) -> float:
    """The tied embedding's gradient all-reduces between the first and last stage (memx.domain.stage_dp.
    embedding_groups: FlagScale's groups along the pipeline paths): every group of every cp rank at once on their
    slowest hop (memx.planner.collectives.embedding_link, one flow per tp rank), each bytes · share / B + 2α
    (collectives.embedding_sync_ms, a 2-rank ring); a rank runs its groups in their order, each blocking (it
    starts when both ranks have left their previous one), so the time is the longest such chain.
    0 without tied embeddings or at pp 1 (collectives.tied_embedding_ms's rule)."""
    if not (model.tied_embeddings and plan.pp > 1):
        return 0.0
    cp, groups = plan.context_parallel, embedding_groups(plan)
    pairs = [[where[0][f * cp + c], where[-1][last * cp + c]] for f, last, _ in groups for c in range(cp)]
    bw, lat = embedding_link(cluster, pairs, [plan.stages[0].tp, plan.stages[-1].tp])
    tp = min(plan.stages[0].tp, plan.stages[-1].tp)
    whole = embedding_sync_ms(model.vocab, model.hidden, tp, bw, 0.0, plan.precision)  # bandwidth part, full shard
    done: dict[tuple[str, int], float] = {}
    for f, last, share in groups:  # blocking, in order: a group starts when both its ranks left their previous one
        end = max(done.get(("first", f), 0.0), done.get(("last", last), 0.0)) + share * whole + 2.0 * lat
        done[("first", f)] = done[("last", last)] = end
    return float(max(done.values()))


def assemble(plan: Plan, cluster: Cluster, model: ModelArch, t: np.ndarray, mem: np.ndarray, static: np.ndarray,
             params: np.ndarray, reserve_gib: float, assembly: AssemblyCalibration) -> PlanMetrics:
    """One per-stage-dp plan's metrics from its stage predictions (at b_s) and parameters per rank."""
    where = place_stage_groups(plan, cluster)
    assert where is not None  # estimate_plans validated the plan
    gpus = [cluster.gpu(st.gpu) for st in plan.stages]
    groups = np.asarray(stage_groups(plan), dtype=np.float64)
    p2p = boundary_p2p_ms(cluster, plan, model, where)
    loop = steady_loop_ms(assembly, p2p)
    T = iteration_time_ms(t[:, None], plan.micro_batches, fixed_ms(plan, p2p, assembly),
                          tails(plan, cluster, model, where, static[:, None], params[:, None], assembly), loop,
                          drains(assembly))
    capacity = np.asarray([usable_capacity_mib(g) for g in gpus], dtype=np.float64)
    weight = np.asarray([st.tp for st in plan.stages], dtype=np.float64) * groups
    stats = memory_stats(mem[:, None], weight, capacity)
    return plan_metrics(plan, iteration_time_ms=T, stage_time_ms=t, stage_peak_mib=mem, capacity_mib=capacity,
                        stats=stats, feasible=bool(np.all(mem <= capacity - reserve_gib * 1024.0)),
                        loop_p2p_ms=() if loop is None else p2p)


def fixed_ms(plan: Plan, p2p: np.ndarray, assembly: AssemblyCalibration) -> float:
    """The plan's fixed term from its boundaries' p2p_s (`boundary_p2p_ms`): Σ_s 2 · p2p_s, each micro batch's
    activation forward and its gradient backward over every boundary (×c), + a calibration's overhead and
    per-transfer cost."""
    total = 0.0
    for x in p2p:
        total += 2.0 * float(x)
    return (assembly.comm_scale * total + assembly.overhead_ms
            + assembly.p2p_per_transfer_ms * blocking_transfers(plan.pp, plan.micro_batches))


def tails(plan: Plan, cluster: Cluster, model: ModelArch, where: list[list[int]], static: np.ndarray,
          params: np.ndarray, assembly: AssemblyCalibration) -> np.ndarray:
    """(pp, k) each stage's tail for k columns of static MiB and parameters per rank: optimizer step + T_dp over
    its dp_s · cp ring with its 2(n − 1) step latencies (memx.planner.collectives.dp_latency_ms), and on the first
    and last stage the tied embedding's all-reduce (`embedding_ms`), as schedule.stage_tail_ms adds them."""
    groups = np.asarray(stage_groups(plan), dtype=np.float64)
    rings = dp_rings(cluster, plan, where)
    extra = dp_latency_ms(groups, [lat for _, lat in rings]) + stage_expert_latency_ms(plan, cluster, model)
    emb = embedding_ms(cluster, plan, model, where)
    extra[0] += emb
    extra[-1] += emb  # 0 at pp = 1: one stage holds both ends
    return stage_tail_ms(static, params, [cluster.gpu(st.gpu).memory_bandwidth_gbps for st in plan.stages],
                         [bw for bw, _ in rings], distributed_optimizer=plan.distributed_optimizer,
                         dp=groups[:, None], precision=plan.precision, comm_scale=assembly.comm_scale,
                         collectives_ms=extra)
