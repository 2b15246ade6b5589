"""A whole plan on the virtual cluster: event-driven 1F1B with noise, p2p, DP all-reduce, optimizer.

Per DP replica, every stage runs its forwards and backwards in Megatron's 1F1B order (Narayanan 2021
§2.2, Fig. 4): min(pp−s−1, m) warm-up forwards, then one forward / one backward until the forwards
run out, then the cool-down backwards. An operation starts when its stage is free and its input has
arrived: the previous stage's activation (forward) or the next stage's gradient (backward), each
after a point-to-point transfer over the intra-node link when both stages sit on the same node
(`place_plan`) and over the inter-node network otherwise. Every forward and backward of every micro
batch gets its own noise draw. After its last backward each stage all-reduces its gradients over
its DP replicas (ring); once every stage has (Megatron's gradient-norm all-reduce before the optimizer step, a
barrier at --clip-grad > 0: memx.simulator.step_sync), each runs the Adam step; the iteration ends when the last
stage is done.
With the distributed optimizer (`Plan.distributed_optimizer`) the all-reduce becomes a reduce-scatter
of the fp32 gradients, the Adam step updates the rank's 1/dp shard, and an all-gather of the bf16
parameters follows (Megatron-LM docs, "Distributed Optimizer"; ZeRO-1, Rajbhandari et al. 2020 §5).

Per-GPU peak memory: stage s holds min(pp−s, m) micro batches of activations at its peak (1F1B).
GPU order in `peak_mem_mib`: replica-major, then stage, then TP rank.

A schema-2 plan (memx.domain.groups, issue #15) is placed jointly (`place_groups`); each replica group
runs the above with its own m, micro batch and placement. Groups that share a layer partition (same stage
boundaries and tp: `shared_partition`, what a stock runtime runs when a stage's replicas are of two GPU
types) then run ONE data-parallel collective per stage over every replica of every group, starting when
the last of them has finished its backward (`cross_sync.flat_stage_ms`), before each stage's optimizer
step; groups whose partitions differ all-reduce every layer's gradient across the groups after their own
DP step (the two-level exchange, memx/simulator/cross_sync.py). Per-GPU and
per-stage figures are concatenated over groups in group order; an OOM on any GPU of any group fails the
run. A one-group plan simulates exactly as its schema-1 plan (same seed, same noise draws).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from memx.domain.groups import AnyPlan, group_plans, place_groups, shared_partition, validate_any_plan
from memx.domain.context_parallel import rank_equivalent
from memx.domain.plan import Plan, plan_model
from memx.domain.records import tied_on_ends
from memx.simulator.context_parallel import cp_ring_links, with_ring
from memx.simulator.cross_sync import flat_stage_ms, schedule_sync, segment_ms, segments
from memx.simulator.interleave import chunk_signatures, interleaved_replicas, peak_held_mib
from memx.simulator.links import link, shared_nic
from memx.simulator.moe import dense_ffn, moe_stage_costs, replica_nodes
from memx.domain.stage_dp import has_stage_dp
from memx.simulator.stage_dp import dp_step_ms, simulate_meshes
from memx.simulator.step_sync import chunk_latency_ms, embedding_allreduce_ms, grad_norm_ms, step_end, synchronised
from memx.simulator.physics import BF16_BYTES, Device
from memx.simulator.stage import (
    ADAM_STATIC_BYTES_PER_PARAM,
    StageCost,
    StageSignature,
    noise_factor,
    stage_cost,
)
from memx.simulator.traits import GpuTraits, load_traits
from memx.domain.specs import Cluster, ModelArch


@dataclass(frozen=True, kw_only=True)
class PlanRun:
    """What a measured iteration of a plan reports, plus the simulator's own breakdown."""

    iteration_time_ms: float | None  # None when the run failed (OOM)
    peak_mem_mib: tuple[float, ...] | None  # per GPU (replica-major, stage, TP rank); None on OOM
    oom: bool
    reason: str
    oom_gpus: tuple[int, ...]  # indices (same order) of GPUs whose demand exceeds capacity
    demand_mem_mib: tuple[float, ...]  # simulated per-GPU demand, given even on OOM (diagnostics)
    capacity_mib: tuple[float, ...]  # per GPU (same order): what it can allocate, nominal − driver reserve (traits)
    stage_time_ms: tuple[float, ...]  # noise-free fwd+bwd of one micro batch per stage
    stage_busy_fraction: tuple[float, ...]  # share of the iteration each stage computes (replica mean)
    p2p_ms: tuple[float, ...]  # per stage boundary, one transfer, slowest replica
    dp_allreduce_ms: tuple[float, ...]  # per stage: the DP step (all-reduce, or reduce-scatter + all-gather)
    optimizer_ms: tuple[float, ...]  # per stage
    # schema 2 with two or more groups (issue #15); empty / 0 otherwise, so schema-1 runs are unchanged
    group_iteration_ms: tuple[float, ...] = ()  # per group: its own iteration without the cross-group exchange
    cross_sync_ms: float = 0.0  # what the cross-group gradient exchange adds: iteration − max(group_iteration_ms)
    # tied embeddings at pp > 1: the first ↔ last stage gradient all-reduce (memx.simulator.step_sync); 0 otherwise
    embedding_sync_ms: float = 0.0


def stage_signatures(plan: Plan, model: ModelArch) -> list[StageSignature]:
    """The signature of every stage of a plan, `inflight` = min(pp − s, m) (1F1B); heads, query groups and
    sequence length are the plan's where it changes the model's (memx.domain.plan.plan_model)."""
    m, model = plan.micro_batches, plan_model(plan, model)
    return [
        StageSignature(
            gpu=st.gpu, tp=st.tp, layers=st.layers, micro_batch=plan.micro_batch, seq_len=plan.seq_len,
            recompute=st.recompute, recompute_layers=st.recompute_layers, first=s == 0, last=s == plan.pp - 1,
            inflight=min(plan.pp - s, m), hidden=model.hidden, heads=model.heads,
            ffn_hidden=dense_ffn(model) if model.is_moe else model.ffn_hidden,  # MoE: memx.simulator.moe
            query_groups=model.query_groups, vocab=model.vocab, mlp=model.mlp,
            distributed_optimizer=plan.distributed_optimizer, dp=plan.dp, sequence_parallel=plan.sequence_parallel,
            tied_embeddings=bool(tied_on_ends(model.tied_embeddings, s == 0, s == plan.pp - 1)),
            precision=plan.precision,
        )
        for s, st in enumerate(plan.stages)
    ]


def one_f1b_order(pp: int, m: int, s: int) -> list[tuple[int, int]]:
    """(kind, micro batch) in the order stage s runs them; kind 0 = forward, 1 = backward."""
    warm = min(pp - s - 1, m)
    order = [(0, j) for j in range(warm)]
    for i in range(m - warm):
        order += [(0, warm + i), (1, i)]
    return order + [(1, j) for j in range(m - warm, m)]


def run_1f1b(fwd: list[list[float]], bwd: list[list[float]], p2p: list[float]) -> tuple[list[float], list[float]]:
    """Event-driven 1F1B of one replica. fwd/bwd[s][j]: durations; p2p[s]: transfer s↔s+1.

    Events are arrivals of activations / gradients (a heap by time). On an arrival the stage runs
    as many of its next operations as have their inputs. Returns per stage its finish time and busy time.
    """
    pp, m = len(fwd), len(fwd[0])
    inf = math.inf
    ready = [([0.0] * m if s == 0 else [inf] * m, [inf] * m) for s in range(pp)]
    orders = [one_f1b_order(pp, m, s) for s in range(pp)]
    ptr, free, busy = [0] * pp, [0.0] * pp, [0.0] * pp
    events = [(0.0, s) for s in range(pp)]
    while events:
        _, s = heapq.heappop(events)
        order, ready_s, k = orders[s], ready[s], ptr[s]
        while k < len(order):
            kind, j = order[k]
            arrive = ready_s[kind][j]
            if arrive == inf:
                break
            start = free[s] if free[s] > arrive else arrive
            dur = bwd[s][j] if kind else fwd[s][j]
            end = start + dur
            free[s], k = end, k + 1
            busy[s] += dur
            if kind == 0 and s + 1 < pp:
                ready[s + 1][0][j] = end + p2p[s]
                heapq.heappush(events, (end + p2p[s], s + 1))
            elif kind == 0:
                ready_s[1][j] = end  # last stage: its backward follows its own forward
            elif s > 0:
                ready[s - 1][1][j] = end + p2p[s - 1]
                heapq.heappush(events, (end + p2p[s - 1], s - 1))
        ptr[s] = k
    if any(ptr[s] != len(orders[s]) for s in range(pp)):  # cannot happen for 1F1B; guards edits
        raise RuntimeError("1F1B schedule deadlocked")
    return free, busy


def _traits_for(names: set[str], traits: Mapping[str, GpuTraits] | None, conf_root: Path | None) -> dict[str, GpuTraits]:
    given = dict(traits or {})
    return {n: given[n] if n in given else load_traits(n, conf_root) for n in names}


def _p2p_ms(plan: Plan, model: ModelArch, cluster: Cluster, where: list[list[int]],
            tr: dict[str, GpuTraits]) -> np.ndarray:
    """[replica, boundary]: activation b·s·h bf16 over the link (the p2p_s term, docs/architecture.md §1F1B assembly), at the sender's
    link efficiency (simulator assumption: TP ranks split the tensor and share the link); the dp replicas'
    transfers over one boundary cross the nodes' NICs together."""
    nbytes = BF16_BYTES * plan.micro_batch * plan.seq_len * model.hidden
    pairs = [(s, s + 1) for s in range(plan.pp - 1)] + ([(plan.pp - 1, 0)] if plan.virtual_stages > 1 else [])
    out = np.zeros((plan.dp, len(pairs)))  # interleaved: the last column is the wrap, last stage → first
    for s, (sa, sb) in enumerate(pairs):
        crossing = [(where[r][sa], where[r][sb]) for r in range(plan.dp)]  # the replicas send at once
        for r, (a, b) in enumerate(crossing):
            bw, lat = link(cluster, a, b)
            if a != b:  # the replicas crossing the same node share its NICs (links.shared_nic)
                bw = min(bw, shared_nic(cluster, a, sum(x == a and y != a for x, y in crossing)),
                         shared_nic(cluster, b, sum(y == b and x != b for x, y in crossing)))
            t = tr[plan.stages[sa].gpu]
            out[r, s] = nbytes / (bw * t.link_efficiency) + lat + t.p2p_overhead_ms
    return out


def _dp_allreduce_ms(plan: Plan, cluster: Cluster, where: list[list[int]], costs: list[StageCost],
                     tr: dict[str, GpuTraits]) -> list[float]:
    """Ring all-reduce of each stage's fp32 gradients over its dp replicas (the T_dp term,
    docs/architecture.md §1F1B assembly); with the distributed optimizer a reduce-scatter of the fp32
    gradients plus an all-gather of the bf16 parameters (memx.simulator.stage_dp.dp_step_ms, over the replicas'
    nodes). When the replicas span nodes, the stage's tp concurrent rings share the node's network link
    (simulator assumption). An interleaved plan runs one collective per model chunk: v times the ring's latency
    steps (memx.simulator.step_sync.chunk_latency_ms)."""
    ring = dp_step_ms(plan, cluster, [[where[r][s] for r in range(plan.dp)] for s in range(plan.pp)], costs, tr)
    return [a + b for a, b in zip(ring, chunk_latency_ms(plan, cluster, where, tr))]


def _memory(plan: Plan, sigs: list[StageSignature], costs: list[StageCost],
            chunks: list[list[StageCost]] | None = None) -> tuple[list[float], list[int], list[float]]:
    """Per-GPU demand, the GPUs over capacity and each GPU's capacity (same order); interleaved (`chunks`: each
    rank's chunk costs), the micro batches held are the chunk activations the interleaved order holds at most
    (memx.simulator.interleave)."""
    held = [sig.inflight for sig in sigs]
    if chunks is not None:
        top = peak_held_mib(plan, [[c.act_mem_mib for c in row] for row in chunks])
        held = [t / c.act_mem_mib if c.act_mem_mib else 0.0 for t, c in zip(top, costs)]
    demand, over, capacity = [], [], []
    for _r in range(plan.dp):
        for s, st in enumerate(plan.stages):
            peak = costs[s].peak_mem_mib(held[s])
            for _rank in range(st.tp):
                if peak > costs[s].capacity_mib:
                    over.append(len(demand))
                demand.append(peak)
                capacity.append(costs[s].capacity_mib)
    return demand, over, capacity


@dataclass(frozen=True, kw_only=True)
class _Group:
    """One replica group ready to run: its plan, placement, stage costs and link times."""

    plan: Plan
    where: list[list[int]]
    sigs: list[StageSignature]
    costs: list[StageCost]
    p2p: np.ndarray
    dp_ar: list[float]
    chunks: list[list[StageCost]] | None = None  # interleaved 1F1B: each rank's v chunk costs
    emb_ms: float = 0.0  # tied embeddings at pp > 1: the first ↔ last stage all-reduce (step_sync)


def _prepare(plan: Plan, where: list[list[int]], cluster: Cluster, model: ModelArch, tr: dict[str, GpuTraits],
             static_bytes_per_param: float, context_parallel: int = 1) -> _Group:
    """A group's costs on its given placement (p2p and DP links follow `where`); `plan` with cp > 1 is the
    rank-equivalent plan, its stages running the ring attention (memx.simulator.context_parallel)."""
    sigs = stage_signatures(plan, model)
    costs = [stage_cost(sig, cluster.gpu(sig.gpu), tr[sig.gpu], static_bytes_per_param) for sig in sigs]
    chunk_sigs = None if plan.virtual_stages == 1 else [chunk_signatures(sig, s, plan.pp, plan.virtual_stages)
                                                        for s, sig in enumerate(sigs)]
    chunks = None if chunk_sigs is None else [
        [stage_cost(c, cluster.gpu(c.gpu), tr[c.gpu], static_bytes_per_param) for c in cs] for cs in chunk_sigs]
    expert_dp = [0.0] * plan.pp
    if plan_model(plan, model).is_moe:  # routed experts, router, all-to-all (memx.simulator.moe)
        nodes = [replica_nodes(plan, where, s) for s in range(plan.pp)]
        costs, chunks, expert_dp = moe_stage_costs(plan, plan_model(plan, model), cluster, nodes, sigs, costs, chunks, tr,
                                                   static_bytes_per_param)
    if context_parallel > 1:  # the ring's steps on top of the rank's costs, MoE layers' included (with_ring adds)
        rings = cp_ring_links(plan, cluster, where, tr, context_parallel)

        def ring(s: int, sig: StageSignature, c: StageCost) -> StageCost:
            t = tr[sig.gpu]
            return with_ring(c, sig, context_parallel, Device.of(cluster.gpu(sig.gpu), t, sig.precision), *rings[s],
                             t.recompute_penalty_factor)

        costs = [ring(s, sig, c) for s, (sig, c) in enumerate(zip(sigs, costs))]
        if chunks is not None:
            chunks = [[ring(s, sig, c) for sig, c in zip(chunk_sigs[s], chunks[s])] for s in range(plan.pp)]
    dp_ar = [a + b for a, b in zip(_dp_allreduce_ms(plan, cluster, where, costs, tr), expert_dp)]
    return _Group(plan=plan, where=where, sigs=sigs, costs=costs, p2p=_p2p_ms(plan, model, cluster, where, tr),
                  dp_ar=dp_ar, chunks=chunks, emb_ms=embedding_allreduce_ms(plan, model, cluster, where, tr))


def _oom_reason(groups: list[_Group], first: int, demand: float) -> str:
    """The first GPU over capacity; with several groups also its (group, replica, stage)."""
    if len(groups) == 1:
        return f"out of memory on GPU {first}: needs {demand:.0f} MiB"
    base = first
    for g, grp in enumerate(groups):
        per_replica = sum(st.tp for st in grp.plan.stages)
        if base < grp.plan.dp * per_replica:
            r, k = divmod(base, per_replica)
            s = next(i for i, acc in enumerate(np.cumsum([st.tp for st in grp.plan.stages])) if k < acc)
            return (f"out of memory on GPU {first} (group {g}, replica {r}, stage {s}, {grp.plan.stages[s].gpu}): "
                    f"needs {demand:.0f} MiB")
        base -= grp.plan.dp * per_replica
    raise AssertionError("GPU index beyond the plan")  # cannot happen: `first` indexes the demand list


def simulate_plan(plan: AnyPlan, cluster: Cluster, model: ModelArch, *, seed: int = 0,
                  conf_root: Path | None = None, traits: Mapping[str, GpuTraits] | None = None,
                  static_bytes_per_param: float = ADAM_STATIC_BYTES_PER_PARAM,
                  grad_norm_barrier: bool = True) -> PlanRun:
    """Run one training iteration of a schema-1 or schema-2 `plan` (validated first: InputError on a
    bad plan). Groups are placed jointly and run on one seeded noise stream, group after group.
    grad_norm_barrier: Megatron-LM's --clip-grad > 0, its default (memx.simulator.step_sync); False: --clip-grad 0,
    each stage's optimizer step right after its own DP step."""
    validate_any_plan(plan, cluster, model)
    if has_stage_dp(plan):  # one pipeline, dp_s groups per stage (memx.simulator.stage_dp)
        return _meshes_run(plan, cluster, model, seed, conf_root, traits, static_bytes_per_param, grad_norm_barrier)
    plans = group_plans(plan)
    placement = place_groups(plan, cluster)
    assert placement is not None  # validate_any_plan checked placement
    tr = _traits_for({s.gpu for p in plans for s in p.stages}, traits, conf_root)
    cp = getattr(plan, "context_parallel", 1)  # schema 1 only: dp·cp replicas of s/cp (domain.context_parallel)
    groups = [_prepare(rank_equivalent(p), w, cluster, model, tr, static_bytes_per_param, cp)
              for p, w in zip(plans, placement)]
    demand, over, capacity = [], [], []
    for grp in groups:
        d, o, c = _memory(grp.plan, grp.sigs, grp.costs, grp.chunks)
        over += [len(demand) + i for i in o]
        demand += d
        capacity += c
    breakdown = dict(
        demand_mem_mib=tuple(demand), capacity_mib=tuple(capacity),
        stage_time_ms=tuple(c.time_ms for g in groups for c in g.costs),
        p2p_ms=tuple(float(x) for g in groups for x in g.p2p.max(axis=0)),
        dp_allreduce_ms=tuple(x for g in groups for x in g.dp_ar),
        optimizer_ms=tuple(c.optimizer_ms for g in groups for c in g.costs),
        embedding_sync_ms=float(max(g.emb_ms for g in groups)),
    )
    if over:
        reason = _oom_reason(groups, over[0], demand[over[0]])
        return PlanRun(iteration_time_ms=None, peak_mem_mib=None, oom=True, reason=reason, oom_gpus=tuple(over),
                       stage_busy_fraction=(), **breakdown)
    rng = np.random.default_rng(seed)
    runs = [_replicas(g.plan, g.costs, g.p2p, tr, rng) if g.chunks is None
            else interleaved_replicas(g.plan, g.chunks, g.p2p, tr, rng) for g in groups]
    ready = [synchronised([finish[:, s].max() + g.dp_ar[s] for s in range(g.plan.pp)], g.emb_ms)
             for g, (finish, _) in zip(groups, runs)]
    norm = [grad_norm_ms(cluster, _norm_members(g, tr)) if grad_norm_barrier else None for g in groups]
    alone = [step_end(rd, [c.optimizer_ms for c in g.costs], n) for g, rd, n in zip(groups, ready, norm)]
    extra: dict = {}
    if len(groups) > 1:
        if shared_partition(plan):  # one DP collective per stage over every group's replicas (module docstring)
            done = [max(finish[:, s].max() for finish, _ in runs) for s in range(plans[0].pp)]
            synced = [synchronised([t + flat_stage_ms(plans, placement, s, groups[0].costs[s].params, cluster, tr)
                                    for s, t in enumerate(done)], max(g.emb_ms for g in groups))] * len(groups)
        else:
            segs = segments(plans, model)
            seg_ms = [segment_ms(sg, plans, placement, cluster, tr) for sg in segs]
            synced = schedule_sync(segs, seg_ms, ready)
        if grad_norm_barrier and plan.distributed_optimizer:  # the grad-stats group is every rank (step_sync)
            world = grad_norm_ms(cluster, [m for g in groups for m in _norm_members(g, tr)])
            iteration = step_end([t for sy in synced for t in sy], [c.optimizer_ms for g in groups for c in g.costs],
                                 world)
        else:
            iteration = max(step_end(sy, [c.optimizer_ms for c in g.costs], n) for g, sy, n in zip(groups, synced, norm))
        extra = dict(group_iteration_ms=tuple(float(a) for a in alone), cross_sync_ms=iteration - float(max(alone)))
    else:
        iteration = float(alone[0])
    busy = [x for _, b in runs for x in b.mean(axis=0) / iteration]
    return PlanRun(iteration_time_ms=iteration, peak_mem_mib=tuple(demand), oom=False, reason="", oom_gpus=(),
                   stage_busy_fraction=tuple(float(x) for x in busy), **breakdown, **extra)


def _norm_members(g: _Group, tr: dict[str, GpuTraits]) -> list[tuple[int, GpuTraits]]:
    """(node, traits) of each rank of a group's grad-stats group (memx.simulator.step_sync): one replica's tp × pp
    ranks, every replica's with the distributed optimizer."""
    replicas = g.plan.dp if g.plan.distributed_optimizer else 1
    return [(g.where[r][s], tr[st.gpu]) for r in range(replicas) for s, st in enumerate(g.plan.stages)
            for _ in range(st.tp)]


def _meshes_run(plan: Plan, cluster: Cluster, model: ModelArch, seed: int, conf_root: Path | None,
                traits: Mapping[str, GpuTraits] | None, static_bytes_per_param: float, grad_norm_barrier: bool) -> PlanRun:
    """simulate_plan of a plan with a per-stage dp (memx.simulator.stage_dp.simulate_meshes)."""
    tr = _traits_for({s.gpu for s in plan.stages}, traits, conf_root)
    run = simulate_meshes(plan, cluster, model, stage_signatures(plan, model), tr, static_bytes_per_param, seed,
                          one_f1b_order, grad_norm_barrier)
    fields = {f: getattr(run, f) for f in ("demand_mem_mib", "capacity_mib", "oom_gpus", "stage_time_ms", "stage_busy_fraction",
                                           "p2p_ms", "dp_allreduce_ms", "optimizer_ms", "embedding_sync_ms")}
    if run.oom_gpus:
        first = run.oom_gpus[0]
        return PlanRun(iteration_time_ms=None, peak_mem_mib=None, oom=True,
                       reason=f"out of memory on GPU {first}: needs {run.demand_mem_mib[first]:.0f} MiB", **fields)
    return PlanRun(iteration_time_ms=run.iteration_time_ms, peak_mem_mib=run.demand_mem_mib, oom=False, reason="",
                   **fields)


def _replicas(plan: Plan, costs: list[StageCost], p2p: np.ndarray, tr: dict[str, GpuTraits],
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Finish and busy time [replica, stage]; each forward/backward of each micro batch has its own noise."""
    pp, m = plan.pp, plan.micro_batches
    sigma = np.array([tr[st.gpu].noise_std_fraction for st in plan.stages])[None, :, None, None]
    noise = noise_factor(rng, sigma, (plan.dp, pp, m, 2))  # broadcast: each stage its own σ
    base = np.array([[c.fwd_ms, c.bwd_ms] for c in costs])[None, :, None, :]
    dur = base * noise
    finish, busy = np.zeros((plan.dp, pp)), np.zeros((plan.dp, pp))
    for r in range(plan.dp):
        f, b = run_1f1b(dur[r, :, :, 0].tolist(), dur[r, :, :, 1].tolist(), p2p[r].tolist())
        finish[r], busy[r] = f, b
    return finish, busy
