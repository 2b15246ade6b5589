"""A data-parallel degree per stage on the virtual cluster (issue #27; docs/simulator.md §Data parallel per stage).

Its own model of FlagScale's per-mesh dp (memx.domain.stage_dp says who holds which rows and who sends what to
whom; nothing here reads the planner). The plan is one pipeline: stage s runs on dp_s TP groups, each computing
its b_s = B / dp_s samples of every micro batch in Megatron's 1F1B order (schedule.one_f1b_order), every forward
and backward of every group its own noise draw. A group's forward of micro batch j starts when it is free and
every piece of its rows has arrived from the previous stage's groups (memx.domain.stage_dp.handoff); the pieces
of a receiver come in one after another (FlagScale's recv_forward_hetero loops over the slices, each a blocking
receive), and a sender's pieces leave one after another too, each piece rows · (B / lcm) · s · h · 2 B at the
link's achieved rate (the sender GPU's link efficiency) plus the link latency and the per-transfer overhead; a
node's NICs are shared by its ranks that send (take) pieces across nodes, one flow each (links.shared_nic).
Gradients go back the same way. After its last backward each stage's groups ring all-reduce their gradients over the stage's dp_s
groups (tp_s rings at once; reduce-scatter + all-gather with the distributed optimizer); with tied embeddings the
first and last stage then run FlagScale's embedding all-reduces (memx.simulator.step_sync.mesh_embedding_sync);
then, behind the gradient-norm barrier (memx.simulator.step_sync: every stage waits for the last one's DP step), the
Adam step; the iteration ends when the last stage has.
With context parallelism cp (one for the plan) stage s has dp_s · cp groups (group g·cp + c: cp rank c of dp rank g,
memx.domain.stage_dp.stage_groups), each a rank of s/cp tokens running the ring attention on its cp ring
(memx.simulator.context_parallel.with_ring, `ring_costs`); cp rank c hands off to cp rank c; the gradient ring is
the stage's dp_s · cp groups.
A mixture-of-experts model (each stage's ep_s, its own or the plan's, dividing its dp_s · cp: memx.domain.stage_dp):
stage s's ep groups are ep_s consecutive groups of its own (FlagScale builds each mesh's expert grid from its ranks); every rank
computes the router and its λ·k tokens' experts over the all-to-all of its ep group on the groups' links
(memx.simulator.moe.moe_stage_costs on each stage's group nodes; none at ep 1, every expert on every rank), and the
expert gradients reduce in rings of their own over the groups holding the same experts (g ≡ j mod ep_s), after the
dense ring (Megatron-LM's separate expert buffers; memx.simulator.moe.expert_dp_ms).
Memory per GPU: stage s holds min(pp − s, m) micro batches of its b_s-sample activations (1F1B), GPUs
stage-major, then group, then TP rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from memx.domain.plan import Plan, plan_model
from memx.domain.specs import Cluster, ModelArch
from memx.domain.stage_dp import (
    group_handoff,
    place_stage_groups,
    samples_per_micro_batch,
    stage_dps,
    stage_groups,
    stage_micro_batches,
)
from memx.simulator.context_parallel import cp_ring_links, with_ring
from memx.simulator.links import link, ring, shared_nic
from memx.simulator.moe import moe_stage_costs
from memx.simulator.physics import BF16_BYTES, GRAD_BYTES_OF, Device, ring_allreduce_ms, ring_collective_ms
from memx.simulator.stage import StageCost, StageSignature, noise_factor, stage_cost
from memx.simulator.step_sync import grad_norm_ms, mesh_embedding_sync, step_end
from memx.simulator.traits import GpuTraits

Piece = tuple[int, int, float]  # (source group, destination group, ms)


def signatures(plan: Plan, sigs: list[StageSignature]) -> list[StageSignature]:
    """The plan's stage signatures as one rank runs them: its per-rank micro batch b_s, its dp_s · cp optimizer
    shards and, with context parallelism, its s/cp tokens."""
    seq = plan.seq_len // plan.context_parallel
    return [dataclasses.replace(sig, micro_batch=b, dp=g, seq_len=seq)
            for sig, b, g in zip(sigs, stage_micro_batches(plan), stage_groups(plan), strict=True)]


def ring_costs(plan: Plan, cluster: Cluster, where: list[list[int]], sigs: list[StageSignature],
               costs: list[StageCost], tr: dict[str, GpuTraits]) -> list[StageCost]:
    """`costs` with the ring attention of context parallelism (memx.simulator.context_parallel.with_ring) on each
    stage's cp rings: group g·cp + c is cp rank c of dp rank g (memx.domain.stage_dp.stage_groups), laid out as
    the rank-equivalent replicas context_parallel.cp_ring_links reads. `costs` itself at cp 1."""
    cp = plan.context_parallel
    if cp == 1:
        return costs
    out = []
    for s, (st, sig, c) in enumerate(zip(plan.stages, sigs, costs)):
        (link_ms,) = cp_ring_links(dataclasses.replace(plan, stages=(st,)), cluster, [[n] for n in where[s]], tr, cp)
        t = tr[st.gpu]
        out.append(with_ring(c, sig, cp, Device.of(cluster.gpu(st.gpu), t, sig.precision), *link_ms,
                             t.recompute_penalty_factor))
    return out


def boundary_pieces(plan: Plan, model: ModelArch, cluster: Cluster, where: list[list[int]], s: int,
                    tr: dict[str, GpuTraits]) -> list[Piece]:
    """Every piece of the hand-off from stage s to s + 1 with its transfer time (module docstring), between TP
    groups (cp rank c to cp rank c, memx.domain.stage_dp.group_handoff)."""
    dp_a, dp_b = stage_dps(plan)[s], stage_dps(plan)[s + 1]
    unit = samples_per_micro_batch(plan) / math.lcm(dp_a, dp_b)  # samples per row of handoff
    pieces = group_handoff(plan, s)
    nodes = [(where[s][a], where[s + 1][b]) for a, b, _ in pieces]
    # each rank sends (takes) its pieces in turn: one flow per rank through its node's NICs at a time
    out_flows = Counter(x for x, _ in {(x, a) for (a, _, _), (x, y) in zip(pieces, nodes) if x != y})
    in_flows = Counter(y for y, _ in {(y, b) for (_, b, _), (x, y) in zip(pieces, nodes) if x != y})
    t = tr[plan.stages[s].gpu]
    out = []
    for (a, b, rows), (x, y) in zip(pieces, nodes):
        bw, lat = link(cluster, x, y)
        if x != y:
            bw = min(bw, shared_nic(cluster, x, out_flows[x]), shared_nic(cluster, y, in_flows[y]))
        nbytes = BF16_BYTES * rows * unit * (plan.seq_len // plan.context_parallel) * model.hidden
        out.append((a, b, nbytes / (bw * t.link_efficiency) + lat + t.p2p_overhead_ms))
    return out


def arrivals(pieces: list[Piece], send_end: np.ndarray, forward: bool) -> dict[int, float]:
    """When each receiver whose senders have all finished (send_end finite) has all its pieces: a sender sends
    its pieces in turn from its op's end, a receiver takes its pieces in turn (forward: source → destination;
    backward: the reverse)."""
    ends = [(a, b, ms) if forward else (b, a, ms) for a, b, ms in pieces]  # (sender, receiver, ms)
    offset, sent = {}, Counter()
    for src, dst, ms in sorted(ends):
        offset[(src, dst)] = sent[src]
        sent[src] += ms
    out: dict[int, float] = {}
    for dst in sorted({d for _, d, _ in ends}):
        mine = sorted((src, ms) for src, d, ms in ends if d == dst)
        if not all(np.isfinite(send_end[src]) for src, _ in mine):
            continue
        t = 0.0
        for src, ms in mine:
            t = max(t, send_end[src] + offset[(src, dst)]) + ms
        out[dst] = t
    return out


def run_meshes(fwd: list[np.ndarray], bwd: list[np.ndarray], pieces: list[list[Piece]],
               order: Callable[[int, int, int], list[tuple[int, int]]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """1F1B over every (stage, group), each group running `order(pp, m, s)` (schedule.one_f1b_order, the one 1F1B
    order) as far as its inputs have arrived, sweep after sweep: fwd/bwd[s][k, j] durations; pieces[s] the
    hand-off s → s + 1. Returns per stage each group's finish and busy time."""
    pp, m = len(fwd), fwd[0].shape[1]
    groups = [f.shape[0] for f in fwd]
    ready_f = [np.full((groups[s], m), 0.0 if s == 0 else math.inf) for s in range(pp)]
    ready_b = [np.full((groups[s], m), math.inf) for s in range(pp)]
    end_f = [np.full((groups[s], m), math.inf) for s in range(pp)]
    end_b = [np.full((groups[s], m), math.inf) for s in range(pp)]
    orders = [order(pp, m, s) for s in range(pp)]
    ptr = [[0] * groups[s] for s in range(pp)]
    free = [np.zeros(groups[s]) for s in range(pp)]
    busy = [np.zeros(groups[s]) for s in range(pp)]
    progress = True
    while progress:
        progress = False
        for s in range(pp):
            for k in range(groups[s]):
                while ptr[s][k] < len(orders[s]):
                    kind, j = orders[s][ptr[s][k]]
                    arrive = (ready_b if kind else ready_f)[s][k, j]
                    if arrive == math.inf:
                        break
                    dur = (bwd if kind else fwd)[s][k, j]
                    end = max(free[s][k], arrive) + dur
                    free[s][k], busy[s][k] = end, busy[s][k] + dur
                    (end_b if kind else end_f)[s][k, j] = end
                    ptr[s][k] += 1
                    progress = True
                    _deliver(s, j, kind, pp, end_f, end_b, ready_f, ready_b, pieces)
    if any(p < len(orders[s]) for s in range(pp) for p in ptr[s]):  # cannot happen for 1F1B; guards edits
        raise RuntimeError("per-stage-dp 1F1B schedule deadlocked")
    return free, busy


def _deliver(s: int, j: int, kind: int, pp: int, end_f, end_b, ready_f, ready_b, pieces) -> None:
    """After a group of stage s finishes micro batch j's op: the neighbour's groups whose senders have all
    finished it get their arrival times."""
    if kind == 0 and s == pp - 1:
        ready_b[s][:, j] = end_f[s][:, j]  # the last stage's backward follows its own forward
        return
    ends = (end_b if kind else end_f)[s][:, j]
    if kind == 0:
        for dst, t in arrivals(pieces[s], ends, forward=True).items():
            ready_f[s + 1][dst, j] = t
    elif s > 0:
        for dst, t in arrivals(pieces[s - 1], ends, forward=False).items():
            ready_b[s - 1][dst, j] = t


def dp_step_ms(plan: Plan, cluster: Cluster, nodes: list[list[int]], costs: list[StageCost],
               tr: dict[str, GpuTraits]) -> list[float]:
    """Per stage: the ring all-reduce of its gradients over its data-parallel groups on `nodes[s]` (one node per
    group; a stage's replicas, or its dp_s groups), reduce-scatter + all-gather with the distributed optimizer (6 B
    instead of 8 B per parameter × (r − 1)/r on the wire: Megatron-LM docs, "Distributed Optimizer"); the stage's
    tp_s rings at once share the nodes' network links (links.ring)."""
    out = []
    for s, st in enumerate(plan.stages):
        dp = len(nodes[s])
        per_ring, step = ring(cluster, nodes[s], [tr[st.gpu]] * dp, st.tp)
        grad = GRAD_BYTES_OF[plan.precision]  # fp32 main grads, or fp16 grads under fp16 (physics.GRAD_BYTES_OF)
        if plan.distributed_optimizer:
            out.append(ring_collective_ms(grad * costs[s].params, dp, per_ring, step)
                       + ring_collective_ms(BF16_BYTES * costs[s].params, dp, per_ring, step))
        else:
            out.append(ring_allreduce_ms(grad * costs[s].params, dp, per_ring, step))
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshRun:
    """A per-stage-dp plan's simulated figures (schedule.simulate_plan wraps them in its PlanRun)."""

    iteration_time_ms: float | None
    demand_mem_mib: tuple[float, ...]
    oom_gpus: tuple[int, ...]
    stage_time_ms: tuple[float, ...]
    stage_busy_fraction: tuple[float, ...]
    p2p_ms: tuple[float, ...]
    dp_allreduce_ms: tuple[float, ...]
    optimizer_ms: tuple[float, ...]
    capacity_mib: tuple[float, ...]  # per GPU, as demand_mem_mib: what each can allocate (GpuTraits.capacity_mib)
    embedding_sync_ms: float = 0.0  # tied embeddings at pp > 1: what the first ↔ last all-reduces add (step_sync)


def simulate_meshes(plan: Plan, cluster: Cluster, model: ModelArch, sigs: list[StageSignature],
                    tr: dict[str, GpuTraits], static_bytes_per_param: float, seed: int,
                    order: Callable[[int, int, int], list[tuple[int, int]]], grad_norm_barrier: bool = True) -> MeshRun:
    """One iteration of a validated per-stage-dp plan (`sigs`: schedule.stage_signatures of the plan; `order`:
    schedule.one_f1b_order; grad_norm_barrier: as schedule.simulate_plan's)."""
    where = place_stage_groups(plan, cluster)
    assert where is not None  # validated
    model = plan_model(plan, model)
    sigs = signatures(plan, sigs)
    costs = [stage_cost(sig, cluster.gpu(sig.gpu), tr[sig.gpu], static_bytes_per_param) for sig in sigs]
    expert_dp = [0.0] * plan.pp
    if model.is_moe:  # the stage's experts over its own groups' ep groups (memx.simulator.moe)
        costs, _, expert_dp = moe_stage_costs(plan, model, cluster, where, sigs, costs, None, tr, static_bytes_per_param)
    costs = ring_costs(plan, cluster, where, sigs, costs, tr)
    demand, over, capacity = [], [], []
    for st, groups, sig, c in zip(plan.stages, stage_groups(plan), sigs, costs):
        peak = c.peak_mem_mib(sig.inflight)
        for _ in range(groups * st.tp):
            if peak > c.capacity_mib:
                over.append(len(demand))
            demand.append(peak)
            capacity.append(c.capacity_mib)
    pieces = [boundary_pieces(plan, model, cluster, where, s, tr) for s in range(plan.pp - 1)]
    dp_ar = dp_step_ms(plan, cluster, where, costs, tr)  # `where`: each stage's dp_s · cp group nodes
    dp_ar = [a + e for a, e in zip(dp_ar, expert_dp)]  # the expert gradients' own rings (memx.simulator.moe)
    common = dict(demand_mem_mib=tuple(demand), oom_gpus=tuple(over), stage_time_ms=tuple(c.time_ms for c in costs),
                  p2p_ms=tuple(max(ms for _, _, ms in p) for p in pieces), dp_allreduce_ms=tuple(dp_ar),
                  optimizer_ms=tuple(c.optimizer_ms for c in costs), capacity_mib=tuple(capacity))
    if over:
        return MeshRun(iteration_time_ms=None, stage_busy_fraction=(), **common)
    rng = np.random.default_rng(seed)
    m = plan.micro_batches
    fwd, bwd = [], []
    for st, groups, c in zip(plan.stages, stage_groups(plan), costs):
        noise = noise_factor(rng, tr[st.gpu].noise_std_fraction, (groups, m, 2))
        fwd.append(c.fwd_ms * noise[:, :, 0])
        bwd.append(c.bwd_ms * noise[:, :, 1])
    finish, busy = run_meshes(fwd, bwd, pieces, order)
    ready = [float(f.max() + a) for f, a in zip(finish, dp_ar)]  # a stage's ranks leave its DP collective together
    ready[0], ready[-1] = mesh_embedding_sync(plan, model, cluster, where, tr, ready[0], ready[-1])
    emb = max(ready[0], ready[-1]) - max(float(finish[0].max() + dp_ar[0]), float(finish[-1].max() + dp_ar[-1]))
    # the grad-stats group (memx.simulator.step_sync): one path's tp_s ranks, every rank with the distributed optimizer
    members = [(node, tr[st.gpu]) for st, row in zip(plan.stages, where)
               for node in (row if plan.distributed_optimizer else row[:1]) for _ in range(st.tp)]
    iteration = step_end(ready, [c.optimizer_ms for c in costs],
                         grad_norm_ms(cluster, members) if grad_norm_barrier else None)
    return MeshRun(iteration_time_ms=iteration, stage_busy_fraction=tuple(float(b.mean() / iteration) for b in busy),
                   embedding_sync_ms=emb, **common)
