"""Schema-2 plans in the planner: the cross-group gradient term, the combined metrics, estimates.

Iteration time of a plan of replica groups (issue #15; docs/architecture.md §Plan JSON, schema 2):

    T = max_g T_g + T_x

where T_g is group g's own schema-1 iteration (its 1F1B with its m and micro batch, its in-group DP
step and optimizer step: memx.planner.schedule) and T_x the cross-group gradient synchronisation,
which runs after every group's in-group reduction and before the optimizer step (so it adds to the
slowest group; no overlap is assumed). Memory is each group's schema-1 memory; M = max, V = variance,
margin = min over all GPUs of all groups. With one group T_x = 0 and everything equals schema 1.

T_x, closed form (`cross_group_sync_ms`). Groups may partition the layers differently, so the
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
exchanges its whole fp32 gradient through that node's link. A ring's bandwidth is the GPU type's intra-node bandwidth when all
its ranks share one node in the joint placement (memx.domain.groups.place_groups), else the cluster's
inter-node bandwidth; each message also pays the inter-node latency when it crosses nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from memx.domain.groups import AnyPlan, GroupedPlan, group_plans, place_groups, simplest, validate_any_plan
from memx.domain.plan import Plan
from memx.domain.specs import Cluster, ModelArch, Node
from memx.planner.cost import GRAD_BYTES_PER_PARAM, ring_allreduce_ms, stage_params_per_rank
from memx.planner.estimate import estimate_plans
from memx.planner.metrics import PlanMetrics
from memx.planner.signatures import StagePredictor


def _segment_params(model: ModelArch, lo: int, hi: int) -> float:
    """Parameters of layers [lo, hi) with the embedding (lo = 0) and the output layer (hi = L)."""
    return float(stage_params_per_rank(hi - lo, 1, lo == 0, hi == model.layers, model.hidden, model.ffn_hidden,
                                       model.heads, model.query_groups, model.vocab, model.mlp))


def _stage_of(plan: Plan) -> list[tuple[int, int]]:
    """(first layer, end layer) of every stage of a schema-1 plan."""
    out, k = [], 0
    for st in plan.stages:
        out.append((k, k + st.layers))
        k += st.layers
    return out


def cross_group_sync_ms(plan: AnyPlan, cluster: Cluster, model: ModelArch,
                        where: list[list[list[int]]] | None = None) -> float:
    """T_x of a schema-2 plan (module docstring; 0 for one group). `where`: the joint placement
    (memx.domain.groups.place_groups), computed when not given; a plan that cannot be placed raises ValueError."""
    parts = group_plans(plan)
    G = len(parts)
    if G <= 1:
        return 0.0
    where = place_groups(plan, cluster) if where is None else where
    if where is None:
        raise ValueError(f"the groups of the plan cannot be placed on {cluster.name} together")
    do = plan.distributed_optimizer
    bounds = sorted({b for p in parts for a, e in _stage_of(p) for b in (a, e)})
    ranges = [_stage_of(p) for p in parts]
    intra = {g.name: g.intra_node_bandwidth_gbps for g in cluster.gpu_types}
    load: dict[tuple, float] = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        stage = [next(s for s, (a, e) in enumerate(r) if a <= lo < e) for r in ranges]
        k = min((p.dp if do else 1) * p.stages[s].tp for p, s in zip(parts, stage))
        nodes = {where[g][0][s] for g, s in enumerate(stage)}
        same = len(nodes) == 1
        bw = min(intra[p.stages[s].gpu] for p, s in zip(parts, stage)) if same else cluster.inter_node_bandwidth_gbps
        lat = 0.0 if same else 2.0 * (G - 1) * cluster.inter_node_latency_ms  # ring: 2(G−1) steps
        nbytes = GRAD_BYTES_PER_PARAM * _segment_params(model, lo, hi)
        ms = float(ring_allreduce_ms(nbytes / k, G, bw)) + lat
        for g, s in enumerate(stage):
            load[(g, s)] = load.get((g, s), 0.0) + ms
            if not same:  # the k rings' ranks of this group leave their nodes through one network link each
                reps = range(parts[g].dp) if do else (0,)
                for r in reps:
                    node = ("node", where[g][r][s])
                    share = float(ring_allreduce_ms(nbytes / len(reps), G, bw)) + lat
                    load[node] = load.get(node, 0.0) + share
    if not do:  # plain: each group broadcasts the global sum from replica 0 to its other replicas
        for g, p in enumerate(parts):
            for s, (a, e) in enumerate(ranges[g]):
                if p.dp > 1:
                    nodes = {where[g][r][s] for r in range(p.dp)}
                    bw = intra[p.stages[s].gpu] if len(nodes) == 1 else cluster.inter_node_bandwidth_gbps
                    nbytes = GRAD_BYTES_PER_PARAM * _segment_params(model, a, e) / p.stages[s].tp
                    load[(g, s)] += 0.5 * float(ring_allreduce_ms(nbytes, p.dp, bw))
    return max(load.values())


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
    nodes = tuple(Node(gpu=n.gpu, count=u) for n, u in zip(cluster.nodes, used) if u > 0)
    return dataclasses.replace(cluster, nodes=nodes)


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
                     reserve_gib: float = 1.0) -> PlanMetrics:
    """One schema-2 plan: every group through estimate_plans on its sub-cluster of the joint placement
    (so its in-group links are the ones it really gets), combined with T_x."""
    where = place_groups(plan, cluster)
    parts = [estimate_plans([gp], sub, model, predictor, reserve_gib=reserve_gib)[0]
             for gp, sub in zip(group_plans(plan), group_clusters(plan, cluster, where))]
    return combine(plan, parts, cross_group_sync_ms(plan, cluster, model, where))


def estimate_any_plans(plans: list[AnyPlan], cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                       reserve_gib: float = 1.0) -> list[PlanMetrics]:
    """estimate_plans for plans of either schema: schema-1 plans (and one-group schema-2 plans, as the
    schema-1 plan they equal) in one estimate_plans call, unchanged; schema-2 plans group by group."""
    out: list[PlanMetrics | None] = [None] * len(plans)
    flat = [(i, simplest(p)) for i, p in enumerate(plans)]
    ones = [(i, p) for i, p in flat if isinstance(p, Plan)]
    if ones:
        for (i, _), m in zip(ones, estimate_plans([p for _, p in ones], cluster, model, predictor,
                                                  reserve_gib=reserve_gib)):
            out[i] = m if plans[i] is m.plan else dataclasses.replace(m, plan=plans[i])
    for i, p in flat:
        if isinstance(p, GroupedPlan):
            validate_any_plan(p, cluster, model, source=f"plan[{i}]")
            out[i] = estimate_grouped(p, cluster, model, predictor, reserve_gib=reserve_gib)
    return out  # type: ignore[return-value]
