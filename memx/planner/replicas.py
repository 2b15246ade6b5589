"""Schema-2 plans in the planner: the cross-group gradient term, the combined metrics, estimates.

Iteration time of a plan of replica groups (issue #15; docs/architecture.md §Plan JSON, schema 2):

    T = max_g T_g + T_x

where T_g is group g's own schema-1 iteration (its 1F1B with its m and micro batch, its in-group DP
step and optimizer step: memx.planner.schedule) and T_x the cross-group gradient synchronisation,
which runs after every group's in-group reduction and before the optimizer step (so it adds to the
slowest group; no overlap is assumed). Memory is each group's schema-1 memory; M = max, V = variance,
margin = min over all GPUs of all groups. With one group T_x = 0 and everything equals schema 1.

How the groups' gradients are synchronised depends on their layer partitions (`replica_sync_ms`):

- Groups that SHARE a layer partition (same stage boundaries, same tp per stage; GPU types may differ:
  memx.domain.groups.shared_partition) are what a stock runtime runs when a stage's replicas land on two
  GPU types: ONE data-parallel collective per stage over every replica of every group (Megatron-LM builds
  one dp process group per (pp, tp) rank; NCCL runs it as a ring, or a tree, over all its ranks). The
  closed form charges it as a ring (`flat_dp_ms`): N = Σ_g dp_g ranks, 2(N−1)/N · 4P / B for the fp32
  all-reduce, (N−1)/N · 6P / B for the distributed optimizer's reduce-scatter + all-gather, B the slowest
  hop of the ring with the GPUs of a node sharing its NICs (memx.planner.network). NCCL's tree algorithm has
  the same bandwidth term, 2 · S / B per rank, and a latency term of log₂ N instead of N steps (Sanders et
  al. 2009, two-tree broadcast; NCCL 2.4 release notes); at the gradient sizes of training the bandwidth
  term dominates, so the ring's figure stands for both. The term added to max_g T_g is the flat step in
  place of each group's own DP step (it may be negative).
- Groups with DIFFERENT partitions (a framework with heterogeneous data parallelism): the two-level
  exchange below (`cross_group_sync_ms`), the algorithm such frameworks run (in-group all-reduce, a
  per-segment all-reduce across groups, an in-group broadcast; the hierarchical all-reduce).

T_x of the two-level exchange, closed form (`cross_group_sync_ms`). Groups may partition the layers differently, so the
exchange is per layer: the union of all groups' stage boundaries cuts the layers into segments, each
held by exactly one stage of every group. A segment's gradient (P_seg parameters, the embedding with
the first segment, the output layer and final norm with the last: memx.planner.cost.stage_params_per_rank)
is summed across the G groups by a ring all-reduce among one rank per group, 2(G−1)/G · bytes / bw
(Patarasuk & Yuan 2009), run as k parallel rings over aligned shards:

- plain data parallelism (Megatron DDP): every replica of a group holds the group's summed fp32
  gradient after its all-reduce; the groups' replica-0 ranks exchange it per tensor-parallel shard,
  k = min_g tp_g rings of 4·P_seg / k bytes each, and each group then broadcasts the result to its
  other dp_g − 1 replicas (a ring broadcast, (n−1)/n · bytes / bw: half a ring all-reduce);
- distributed optimizer: after the group's reduce-scatter each of its dp_g·tp_g ranks holds a 1/(dp_g·tp_g)
  fp32 shard, so the cross exchange is the hierarchical all-reduce's middle step (reduce-scatter in the
  group, all-reduce across groups, all-gather in the group: Jia et al. 2018, "Highly Scalable Deep
  Learning Training System with Mixed-Precision", §3.3; Goyal et al. 2017 §4): k = min_g dp_g·tp_g
  rings of 4·P_seg / k bytes, and no broadcast — the group's bf16 all-gather, already in T_g,
  distributes the updated parameters. The bytes per ring rank are thus smaller by min dp·tp / min tp.

Rings of different segments held by the same stage of a group share that stage's links and run one
after another; different stages' rings run concurrently (as the in-group DP rings do in schema 1,
memx.planner.schedule.Pipeline.tail_ms), except that every ring rank leaving a node shares the node's one
inter-node link: a node whose ranks carry a fraction f of a group's segment sends 2(G−1)/G · f · 4·P_seg
bytes through it, whatever k (each rank sends 2(G−1)/G of its shard, Patarasuk & Yuan 2009). So
T_x = max(max over (group, stage) of the sum of its segments' ring times (+ the plain broadcast),
max over nodes of the sum of their rings' bytes / the inter-node bandwidth) — a pp = 1 group on one node
exchanges its whole fp32 gradient through that node's NICs. A ring runs at its slowest hop (the GPU type's
intra-node bandwidth inside a node, else the link between the two nodes: the smaller NIC or the cross-vendor
link, memx.planner.network.pair_link); a node's load is limited by all its NICs together; each message also
pays the ring's largest hop latency.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from memx.domain.groups import AnyPlan, GroupedPlan, group_plans, place_groups, shared_partition, simplest, validate_any_plan
from memx.domain.plan import Plan, place_plan
from memx.domain.precision import GRAD_BYTES
from memx.domain.specs import Cluster, ModelArch, Node
from memx.planner.collectives import dp_collective_ms, embedding_link, tied_embedding_ms
from memx.planner.cost import MIB, ring_allreduce_ms, stage_params_per_rank, static_bytes_per_param
from memx.planner.estimate import estimate_plans
from memx.planner.metrics import PlanMetrics
from memx.planner.network import achieved, nic_gbps, ring_link
from memx.planner.schedule import optimizer_ms
from memx.planner.signatures import StagePredictor


def _segment_params(model: ModelArch, lo: int, hi: int) -> float:
    """Parameters of layers [lo, hi) with the embedding (lo = 0) and the output layer (hi = L)."""
    return float(stage_params_per_rank(hi - lo, 1, lo == 0, hi == model.layers, model.hidden, model.ffn_hidden,
                                       model.heads, model.query_groups, model.vocab, model.mlp,
                                       tied=model.tied_embeddings))


def _stage_of(plan: Plan) -> list[tuple[int, int]]:
    """(first layer, end layer) of every stage of a schema-1 plan."""
    out, k = [], 0
    for st in plan.stages:
        out.append((k, k + st.layers))
        k += st.layers
    return out


def cross_group_sync_ms(plan: AnyPlan, cluster: Cluster, model: ModelArch,
                        where: list[list[list[int]]] | None = None) -> float:
    """T_x of the two-level exchange (module docstring; 0 for one group), for groups whose partitions differ.
    `where`: the joint placement (memx.domain.groups.place_groups), computed when not given; a plan that cannot
    be placed raises ValueError."""
    parts = group_plans(plan)
    G = len(parts)
    if G <= 1:
        return 0.0
    where = _placement(plan, cluster, where)
    do = plan.distributed_optimizer
    bounds = sorted({b for p in parts for a, e in _stage_of(p) for b in (a, e)})
    ranges = [_stage_of(p) for p in parts]
    load: dict[tuple, float] = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        stage = [next(s for s, (a, e) in enumerate(r) if a <= lo < e) for r in ranges]
        k = min((p.dp if do else 1) * p.stages[s].tp for p, s in zip(parts, stage))
        members = [where[g][0][s] for g, s in enumerate(stage)]
        same = len(set(members)) == 1
        bw, step = ring_link(cluster, members)  # memx.planner.network: the ring's slowest hop
        lat = 2.0 * (G - 1) * step  # ring: 2(G−1) steps
        nbytes = GRAD_BYTES[parts[0].precision] * _segment_params(model, lo, hi)  # memx.domain.precision
        ms = float(ring_allreduce_ms(nbytes / k, G, bw)) + lat
        for g, s in enumerate(stage):
            load[(g, s)] = load.get((g, s), 0.0) + ms
            if not same:  # the k rings' ranks of this group leave their nodes through the node's NICs
                reps = range(parts[g].dp) if do else (0,)
                for r in reps:
                    node = where[g][r][s]
                    nic = min(bw * k, nic_gbps(cluster, node) * cluster.nodes[node].nics)
                    share = float(ring_allreduce_ms(nbytes / len(reps), G, nic)) + lat
                    load[("node", node)] = load.get(("node", node), 0.0) + share
    if not do:  # plain: each group broadcasts the global sum from replica 0 to its other replicas
        for g, p in enumerate(parts):
            for s, (a, e) in enumerate(ranges[g]):
                if p.dp > 1:
                    bw, _ = ring_link(cluster, [where[g][r][s] for r in range(p.dp)], p.stages[s].tp)
                    nbytes = GRAD_BYTES[p.precision] * _segment_params(model, a, e) / p.stages[s].tp
                    load[(g, s)] += 0.5 * float(ring_allreduce_ms(nbytes, p.dp, bw))
    return max(load.values())


def _placement(plan: AnyPlan, cluster: Cluster, where: list[list[list[int]]] | None) -> list[list[list[int]]]:
    where = place_groups(plan, cluster) if where is None else where
    if where is None:
        raise ValueError(f"the groups of the plan cannot be placed on {cluster.name} together")
    return where


def flat_dp_ms(plan: AnyPlan, cluster: Cluster, model: ModelArch,
               where: list[list[list[int]]] | None = None) -> list[float]:
    """Per stage, the ONE data-parallel step over the replicas of every group of a plan whose groups share a
    layer partition (memx.domain.groups.shared_partition), as the runtime runs it: N = Σ_g dp_g ranks per
    tensor-parallel shard, tp concurrent NCCL rings in group-then-replica order, each as fast as its slowest
    hop, the GPUs of a node sharing its NICs (memx.planner.network.ring_link); a ring all-reduce of the fp32
    gradients, 2(N−1)/N · 4P / B, or with the distributed optimizer a reduce-scatter plus an all-gather of
    the bf16 parameters, (N−1)/N · 6P / B (memx.planner.cost.dp_step_ms; Patarasuk & Yuan 2009; NCCL's ring
    algorithm, whose bus bandwidth is the algorithm bandwidth × 2(n−1)/n: nccl-tests doc/PERFORMANCE.md), plus
    the ring's 2(N−1) step latencies and, on the end stages, the slowest group's tied-embedding all-reduce
    (memx.planner.collectives.dp_collective_ms, tied_embedding_ms; issue #23)."""
    parts = group_plans(plan)
    where = _placement(plan, cluster, where)
    n = sum(p.dp for p in parts)
    emb = max(_embedding_ms(p, cluster, model, w) for p, w in zip(parts, where))
    out = []
    for s, (lo, hi) in enumerate(_stage_of(parts[0])):
        tp = parts[0].stages[s].tp
        link = ring_link(cluster, [where[g][r][s] for g, p in enumerate(parts) for r in range(p.dp)], tp)
        params = _segment_params(model, lo, hi) / tp
        ends = emb if s in (0, len(parts[0].stages) - 1) else 0.0
        out.append(dp_collective_ms(params, n, link, plan.distributed_optimizer, parts[0].precision) + ends)
    return out


def _embedding_ms(p: Plan, cluster: Cluster, model: ModelArch, where: list[list[int]]) -> float:
    """A group's tied-embedding all-reduce between its first and last stage (memx.planner.collectives)."""
    tps = [st.tp for st in p.stages]
    return tied_embedding_ms(model, tps, embedding_link(cluster, where, tps), p.precision)


def _own_tails_ms(plan: AnyPlan, cluster: Cluster, model: ModelArch, where: list[list[list[int]]]
                  ) -> tuple[list[list[float]], list[list[float]]]:
    """([group][stage] Adam step, [group][stage] the group's own DP step) of the closed form, on the joint
    placement (the tail of memx.planner.schedule.Pipeline.tail_ms, with the closed form's static memory)."""
    opt, own = [], []
    for g, p in enumerate(group_plans(plan)):
        do, o, d = p.distributed_optimizer, [], []
        emb = _embedding_ms(p, cluster, model, where[g])
        for s, (lo, hi) in enumerate(_stage_of(p)):
            st = p.stages[s]
            params = _segment_params(model, lo, hi) / st.tp
            static_mib = params * float(static_bytes_per_param(do, p.dp, p.precision)) / MIB
            o.append(float(optimizer_ms(static_mib, cluster.gpu(st.gpu).memory_bandwidth_gbps, do, p.dp, p.precision)))
            link = ring_link(cluster, [where[g][r][s] for r in range(p.dp)], st.tp)
            d.append(dp_collective_ms(params, p.dp, link, do, p.precision) + (emb if s in (0, p.pp - 1) else 0.0))
        opt.append(o)
        own.append(d)
    return opt, own


def own_dp_ms(plan: Plan, cluster: Cluster, model: ModelArch) -> float:
    """The largest closed-form DP step of a schema-1 plan's stages on `cluster` (first-fit placement). A group
    whose partition other groups share may lose it to the flat collective, so T ≥ T_g − own_dp_ms (the replica
    search's bound, memx.planner.replica_search.evaluate_split)."""
    where = place_plan(plan, cluster)
    if where is None or plan.dp <= 1:
        return 0.0
    out = 0.0
    for s, (lo, hi) in enumerate(_stage_of(plan)):
        st = plan.stages[s]
        link = ring_link(cluster, [where[r][s] for r in range(plan.dp)], st.tp)
        out = max(out, dp_collective_ms(_segment_params(model, lo, hi) / st.tp, plan.dp, link, plan.distributed_optimizer,
                                        plan.precision))
    return out


def replica_sync_ms(plan: AnyPlan, parts: Sequence[PlanMetrics], cluster: Cluster, model: ModelArch,
                    where: list[list[list[int]]] | None = None) -> float:
    """What the replica groups' gradient synchronisation adds to the slowest group's own time (`parts`: the
    groups' own metrics, group order; 0 for one group).

    Groups that share a layer partition (memx.domain.groups.shared_partition): the runtime runs one flat
    collective per stage over all of them (`flat_dp_ms`) instead of each group's own DP step, so
    T = max_g (T_g − max_s tail_g,s) + max_g,s (opt_g,s + F_s), tail_g,s = opt_g,s + own DP step_g,s (the
    1F1B assembly's tail, memx.planner.schedule), and the term is T − max_g T_g — negative when the flat ring
    beats the slowest group's own DP step. Other plans: the two-level exchange `cross_group_sync_ms`."""
    if len(parts) <= 1:
        return 0.0
    where = _placement(plan, cluster, where)
    if not shared_partition(plan):
        return cross_group_sync_ms(plan, cluster, model, where)
    flat = flat_dp_ms(plan, cluster, model, where)
    opt, own = _own_tails_ms(plan, cluster, model, where)
    compute = max(m.iteration_time_ms - max(o + d for o, d in zip(og, dg)) for m, og, dg in zip(parts, opt, own))
    ends = max(o + f for og in opt for o, f in zip(og, flat))
    return compute + ends - max(m.iteration_time_ms for m in parts)


def combine(plan: GroupedPlan, parts: Sequence[PlanMetrics], cross_sync_ms: float) -> PlanMetrics:
    """The schema-2 PlanMetrics from the groups' own (group order): T = max_g T_g + T_x; stage and
    per-GPU columns concatenated; M = max, V = variance, margin = min over all GPUs; feasible when
    every group is (memory is per GPU per group)."""
    peaks = tuple(x for m in parts for x in m.peak_mem_mib)
    return PlanMetrics(
        plan=plan, iteration_time_ms=max(m.iteration_time_ms for m in parts) + float(cross_sync_ms),
        stage_time_ms=tuple(x for m in parts for x in m.stage_time_ms),
        stage_peak_mib=tuple(x for m in parts for x in m.stage_peak_mib), peak_mem_mib=peaks,
        capacity_mib=tuple(x for m in parts for x in m.capacity_mib), max_mem_mib=float(max(peaks)),
        mem_variance_mib2=float(np.var(np.asarray(peaks, dtype=np.float64))),
        min_margin=min(m.min_margin for m in parts), feasible=all(m.feasible for m in parts),
        groups=tuple(parts), cross_sync_ms=float(cross_sync_ms))


def group_cluster(cluster: Cluster, used: Sequence[int]) -> Cluster:
    """The sub-cluster of the GPUs a group uses: `used[i]` GPUs of node i (nodes with none dropped),
    same name and network. First-fit placement of the group on it reproduces the joint placement."""
    nodes = tuple(dataclasses.replace(n, count=u, gpus_per_nic=_nic_gpus(n, u)) for n, u in zip(cluster.nodes, used) if u > 0)
    return dataclasses.replace(cluster, nodes=nodes)


def _nic_gpus(node: Node, used: int) -> int | None:
    """GPUs per NIC of the part of `node` a group uses (its NICs stay with the GPUs they serve)."""
    if node.gpus_per_nic is None:
        return None
    return math.gcd(node.gpus_per_nic, used)


def group_clusters(plan: AnyPlan, cluster: Cluster, where: list[list[list[int]]]) -> list[Cluster]:
    """Each group's sub-cluster from the joint placement."""
    out = []
    for p, w in zip(group_plans(plan), where):
        used = [0] * len(cluster.nodes)
        for r in range(p.dp):
            for s, st in enumerate(p.stages):
                used[w[r][s]] += st.tp
        out.append(group_cluster(cluster, used))
    return out


def estimate_grouped(plan: GroupedPlan, cluster: Cluster, model: ModelArch, predictor: StagePredictor, *,
                     reserve_gib: float = 1.0, pipeline_assembly: str | None = None) -> PlanMetrics:
    """One schema-2 plan: every group through estimate_plans on its sub-cluster of the joint placement
    (so its in-group links are the ones it really gets), combined with T_x; pipeline_assembly as estimate_plans."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    where = place_groups(plan, cluster)
    parts = [estimate_plans([gp], sub, model, predictor, reserve_gib=reserve_gib, pipeline_assembly=pipeline_assembly)[0]
             for gp, sub in zip(group_plans(plan), group_clusters(plan, cluster, where))]
    return combine(plan, parts, replica_sync_ms(plan, parts, cluster, model, where))


def estimate_any_plans(plans: list[AnyPlan], cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                       reserve_gib: float = 1.0, pipeline_assembly: str | None = None) -> list[PlanMetrics]:
    """estimate_plans for plans of either schema: schema-1 plans (and one-group schema-2 plans, as the
    schema-1 plan they equal) in one estimate_plans call, unchanged; schema-2 plans group by group.
    pipeline_assembly: the search space's (SearchSpace.pipeline_assembly), so a plan scores as its search scored it."""
    out: list[PlanMetrics | None] = [None] * len(plans)
    flat = [(i, simplest(p)) for i, p in enumerate(plans)]
    ones = [(i, p) for i, p in flat if isinstance(p, Plan)]
    if ones:
        for (i, _), m in zip(ones, estimate_plans([p for _, p in ones], cluster, model, predictor,
                                                  reserve_gib=reserve_gib, pipeline_assembly=pipeline_assembly)):
            out[i] = m if plans[i] is m.plan else dataclasses.replace(m, plan=plans[i])
    for i, p in flat:
        if isinstance(p, GroupedPlan):
            validate_any_plan(p, cluster, model, source=f"plan[{i}]")
            out[i] = estimate_grouped(p, cluster, model, predictor, reserve_gib=reserve_gib,
                                      pipeline_assembly=pipeline_assembly)
    return out  # type: ignore[return-value]
