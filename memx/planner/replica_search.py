"""The search over data-parallel replica groups (plan schema 2; issue #15; docs/planner.md §Replica groups).

`SearchSpace.max_replica_groups = 1` (the default) is today's schema-1 search exactly (`replica_search`
calls memx.planner.search.search and returns its result unchanged). With G_max ≥ 2:

1. Formations — which GPUs each group takes. The rule: groups take WHOLE NODES (a node's GPUs share its
   intra-node links, and Megatron-LM-style launchers give a replica whole nodes), so a formation gives
   each (GPU type, node size) class's nodes to the groups; formations that differ only by swapping nodes
   of one class, or by renaming groups, are one formation. Every node is used unless `use_all_gpus` is
   false (then nodes may stay idle). Each group runs on its sub-cluster: its nodes, the cluster's network.
2. The batch split — the groups' shares of `global_batch`, in granules of `granule` sequences. When the
   formations × splits are at most `exact_max`, every split is evaluated (EXACT: property test
   tests/unit/test_replica_search.py against brute force over every formation × split × exhaustive
   per-group search). Otherwise the split starts proportional to predicted throughput (each group's
   share / its picked plan's time at a GPU-proportional probe share) and is refined by moving one
   granule from the slowest group to another while the plan's time improves (a local search: exact
   only in the enumerable case).
3. Per group, today's search (memx.planner.search.search) on the group's sub-cluster with
   `global_batch` = its share and the one-group search's Φ medians (no sample of its own: the pick never
   needs them); its pick rule and margin floor apply per group (memx.planner.pick), so the
   combined pick clears the floor on every GPU. Combined: memx.planner.replicas.combine with the
   cross-group term over the joint placement (memx.domain.groups.place_groups).

The same bound prunes: a split is abandoned as soon as one group's picked time, less its own DP step,
reaches the best plan's time (T ≥ max_g (T_g − own DP step): groups that share a layer partition run one
flat collective instead of their own DP steps, memx.planner.replicas.replica_sync_ms; so no plan of that
split can be better). Job options (distributed optimizer,
sequence parallelism) are plan-wide in schema 2, so each setting the space allows is searched separately.
The best schema-2 plan (the fastest found) joins the one-group search's kept candidates and the configured
pick rule chooses among them all (memx.planner.pick.with_candidate): the pick is the rule's over a superset of
the one-group candidates, never a plan another kept plan dominates; with a one-group pick the best grouped plan
is shown beside it.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from memx.domain.errors import InfeasibleError
from memx.domain.groups import GroupedPlan, ReplicaGroup, group_plans, place_groups
from memx.domain.precision import resolve_precision
from memx.domain.plan import with_idle_gpus
from memx.domain.specs import Cluster, ModelArch, Node, SearchSpace
from memx.planner.metrics import PlanMetrics
from memx.planner.network import achieved
from memx.planner.pick import phi_on, with_candidate
from memx.planner.replicas import combine, group_clusters, own_dp_ms, replica_sync_ms
from memx.planner.result import SearchResult, plan_key
from memx.planner.search import search

EXACT_MAX = 64  # formations × batch splits evaluated exhaustively up to this many
Formation = tuple[tuple[int, ...], ...]  # per group: nodes taken of each (GPU type, node size) class
Scored = tuple[PlanMetrics, float]  # a schema-2 plan and its smallest margin (upper bound where given)


@dataclass(frozen=True, kw_only=True)
class GroupPick:
    """A group's search at one share: its pick, the pick's margin (upper bound where given), the result."""

    metrics: PlanMetrics
    margin: float
    result: SearchResult


@dataclass(kw_only=True)
class ReplicaOutcome:
    """What `search_replicas` found: the answer, the one-group search, the best schema-2 plan (None if
    none), and the work done."""

    result: SearchResult
    one_group: SearchResult
    grouped: PlanMetrics | None
    formations: int = 0
    splits: int = 0
    group_searches: int = 0
    exact: bool = True
    timings: dict[str, float] = field(default_factory=dict)


def _classes(cluster: Cluster) -> dict[Node, int]:
    """Identical nodes (GPU type, size, NICs) → how many, in order of first appearance."""
    counts: dict[Node, int] = {}
    for n in cluster.nodes:
        counts[n] = counts.get(n, 0) + 1
    return counts


def node_classes(cluster: Cluster) -> list[tuple[str, int, int]]:
    """(GPU type, node size, nodes) classes of identical nodes (same NICs too), in order of first appearance."""
    return [(n.gpu.name, n.count, k) for n, k in _classes(cluster).items()]


def _splits(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write total as `parts` non-negative integers."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in _splits(total - first, parts - 1):
            yield (first, *rest)


def formations(cluster: Cluster, groups: int, use_all_gpus: bool = True) -> list[Formation]:
    """Every formation of exactly `groups` non-empty groups of whole nodes (module docstring, step 1),
    canonical (groups sorted, largest first), in a deterministic order."""
    classes = node_classes(cluster)
    buckets = groups + (0 if use_all_gpus else 1)  # the last bucket: idle nodes
    per_class = [list(_splits(k, buckets)) for _, _, k in classes]
    seen: dict[Formation, None] = {}
    for choice in itertools.product(*per_class):
        form = tuple(tuple(choice[c][g] for c in range(len(classes))) for g in range(groups))
        if all(any(f) for f in form):
            seen.setdefault(tuple(sorted(form, reverse=True)), None)
    return list(seen)


def formation_cluster(cluster: Cluster, nodes: Sequence[int]) -> Cluster:
    """A group's sub-cluster: `nodes[c]` nodes of each class c, in class order, the cluster's network."""
    out = tuple(n for n, k in zip(_classes(cluster), nodes) for _ in range(k))
    return dataclasses.replace(cluster, nodes=out)


def batch_splits(global_batch: int, groups: int, granule: int) -> list[tuple[int, ...]]:
    """Every split of global_batch into `groups` positive multiples of `granule` (the remainder, when
    granule does not divide it, goes to the first group)."""
    units, rest = divmod(global_batch, granule)
    return [tuple(u * granule + (rest if g == 0 else 0) for g, u in enumerate(s))
            for s in _splits(units, groups) if all(u > 0 for u in s)]


class _Groups:
    """Per-group searches, cached by (formation row, share)."""

    def __init__(self, cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, exhaustive: bool,
                 refs: tuple[float, float, float]):
        self.cluster, self.model, self.space, self.predictor, self.exhaustive = cluster, model, space, predictor, exhaustive
        self.refs = refs  # the one-group search's medians: Φ on one scale, no medians per group (the pick needs none)
        self.cache: dict[tuple[tuple[int, ...], int], GroupPick | None] = {}

    def pick(self, nodes: tuple[int, ...], share: int) -> GroupPick | None:
        key = (nodes, share)
        if key not in self.cache and not any(share % mb == 0 for mb in self.space.micro_batch_options):
            self.cache[key] = None  # no micro batch divides the share: no plan (search would refuse the input)
        if key not in self.cache:
            sp = dataclasses.replace(self.space, global_batch=share, max_replica_groups=1,
                                     context_parallel_options=(1,))  # a schema-2 plan has no cp (its groups' dp)
            try:
                r = search(formation_cluster(self.cluster, nodes), self.model, sp, self.predictor,
                           exhaustive=self.exhaustive, refs=self.refs)
            except InfeasibleError:
                self.cache[key] = None
            else:
                m = r.chosen
                self.cache[key] = GroupPick(metrics=m, margin=r.margins_high.get(plan_key(m.plan), m.min_margin), result=r)
        return self.cache[key]


def _plan(cluster: Cluster, model: ModelArch, space: SearchSpace, picks: Sequence[GroupPick]) -> GroupedPlan:
    first = picks[0].metrics.plan
    groups = tuple(ReplicaGroup(dp=p.metrics.plan.dp, micro_batch=p.metrics.plan.micro_batch,
                                micro_batches=p.metrics.plan.micro_batches, stages=p.metrics.plan.stages) for p in picks)
    plan = GroupedPlan(model=model.name, cluster=cluster.name, global_batch=space.global_batch, seq_len=first.seq_len,
                       groups=groups, distributed_optimizer=first.distributed_optimizer,
                       sequence_parallel=first.sequence_parallel, precision=first.precision)
    return plan if space.use_all_gpus else with_idle_gpus(plan, cluster)


def _placed(cluster: Cluster, form: Formation, plan: GroupedPlan, order: Sequence[int]):
    """The joint placement of the groups in `order` when it gives every group the nodes its search
    assumed (same node sizes per type), else None."""
    reordered = dataclasses.replace(plan, groups=tuple(plan.groups[g] for g in order))
    where = place_groups(reordered, cluster)
    if where is None:
        return None
    for g, sub in zip(order, group_clusters(reordered, cluster, where)):
        if sorted(map(repr, sub.nodes)) != sorted(map(repr, formation_cluster(cluster, form[g]).nodes)):
            return None
    return reordered, where


def evaluate_split(groups: _Groups, form: Formation, shares: Sequence[int], best_ms: float
                   ) -> tuple[Scored | None, float]:
    """((the schema-2 plan of this formation and split, its smallest margin at the groups' upper bounds)
    or None; the largest group time seen, inf if a group has no plan clearing the floor). Stops early
    once a group's time reaches best_ms (the bound)."""
    picks, worst = [], 0.0
    for nodes, share in zip(form, shares):
        p = groups.pick(nodes, share)
        if p is None or p.margin < groups.space.margin_floor:
            return None, float("inf")
        # the bound: T ≥ T_g, or T ≥ T_g − its own DP step where the groups share a partition (flat collective)
        lower = p.metrics.iteration_time_ms - own_dp_ms(p.metrics.plan, formation_cluster(groups.cluster, nodes), groups.model)
        worst = max(worst, lower)
        if worst >= best_ms:
            return None, worst
        picks.append(p)
    plan = _plan(groups.cluster, groups.model, groups.space, picks)
    for order in itertools.permutations(range(len(form))):
        placed = _placed(groups.cluster, form, plan, order)
        if placed is not None:
            break
    else:
        return None, worst
    plan, where = placed
    parts = [dataclasses.replace(picks[g].metrics, plan=gp, phi=None) for g, gp in zip(order, group_plans(plan))]
    m = combine(plan, parts, replica_sync_ms(plan, parts, groups.cluster, groups.model, where))
    return (m, min(p.margin for p in picks)), worst


def _proportional(total: int, weights: Sequence[float], granule: int) -> tuple[int, ...]:
    """Shares ∝ weights in granules, each ≥ one granule, largest remainder (remainder of total to group 0)."""
    units, rest = divmod(total, granule)
    raw = [units * w / sum(weights) for w in weights]
    base = [max(1, int(r)) for r in raw]
    while sum(base) > units:
        base[max(range(len(base)), key=lambda i: base[i])] -= 1
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)[:units - sum(base)]:
        base[i] += 1
    return tuple(b * granule + (rest if i == 0 else 0) for i, b in enumerate(base))


def _refine(groups: _Groups, form: Formation, total: int, granule: int, best_ms: float,
            count: Callable[[], None]) -> Scored | None:
    """Proportional start, then move one granule from the slowest group while the plan's time improves."""
    gpus = [formation_cluster(groups.cluster, f).total_gpus for f in form]
    probe = _proportional(total, gpus, granule)
    rates = []
    for nodes, share in zip(form, probe):
        p = groups.pick(nodes, share)
        if p is None:
            return None
        rates.append(share / p.metrics.iteration_time_ms)
    shares = _proportional(total, rates, granule)
    count()
    best, _ = evaluate_split(groups, form, shares, float("inf"))
    while best is not None:
        times = [g.iteration_time_ms for g in best[0].groups]
        slow = max(range(len(times)), key=lambda i: times[i])
        if shares[slow] - granule < granule:
            break
        moves = []
        for other in range(len(form)):
            if other != slow:
                s = list(shares)
                s[slow], s[other] = s[slow] - granule, s[other] + granule
                count()
                m, _ = evaluate_split(groups, form, s, best[0].iteration_time_ms)
                if m is not None and m[0].iteration_time_ms < best[0].iteration_time_ms:  # strictly better: ends
                    moves.append((m[0].iteration_time_ms, tuple(s), m))
        if not moves:
            break
        _, shares, best = min(moves, key=lambda x: x[0])
    return best if best is not None and best[0].iteration_time_ms < best_ms else None


def search_replicas(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, *, weights: str | None = None,
                    top_k: int = 10, exhaustive: bool = False, granule: int | None = None, exact_max: int = EXACT_MAX,
                    **search_kw) -> ReplicaOutcome:
    """The one-group search (`search_kw`: search's mapper, shard_by, on_progress, …) and, with
    max_replica_groups ≥ 2, the schema-2 search (module docstring). `granule`: sequences moved at a time
    (default global_batch // 32, at least 1)."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    t0 = time.perf_counter()
    one = search(cluster, model, space, predictor, weights=weights, top_k=top_k, exhaustive=exhaustive, **search_kw)
    out = ReplicaOutcome(result=one, one_group=one, grouped=None, timings={"one_group_s": time.perf_counter() - t0})
    if space.max_replica_groups <= 1:
        return out
    q = granule or max(1, space.global_batch // 32)
    best: Scored | None = None
    options = list(itertools.product(space.distributed_optimizer, space.sequence_parallel))
    plan_forms = [(G, f) for G in range(2, space.max_replica_groups + 1)
                  for f in formations(cluster, G, space.use_all_gpus)]
    splits = {G: batch_splits(space.global_batch, G, q) for G in {G for G, _ in plan_forms}}
    out.formations = len(plan_forms)
    out.exact = len(options) * sum(len(splits[G]) for G, _ in plan_forms) <= exact_max
    # one precision for every group: the space's, resolved over the whole cluster (memx.domain.precision)
    precision = resolve_precision(space.precision, cluster.gpu_types, f"search space {space.name}")
    for do, sp_on in options:
        groups = _Groups(cluster, model, dataclasses.replace(space, distributed_optimizer=(do,), sequence_parallel=(sp_on,),
                                                             precision=precision), predictor, exhaustive, one.refs)
        for G, form in plan_forms:
            bound = best[0].iteration_time_ms if best is not None else float("inf")
            if out.exact:
                for shares in splits[G]:
                    out.splits += 1
                    m, _ = evaluate_split(groups, form, shares, bound)
                    if m is not None and m[0].iteration_time_ms < bound:
                        best, bound = m, m[0].iteration_time_ms
            else:
                m = _refine(groups, form, space.global_batch, q, bound, lambda: setattr(out, "splits", out.splits + 1))
                if m is not None:
                    best = m
        out.group_searches += len(groups.cache)
    out.timings["replica_groups_s"] = time.perf_counter() - t0 - out.timings["one_group_s"]
    if best is None:
        return out
    best, high = best
    out.grouped = best = phi_on(best, one, space)
    # the grouped plan joins the kept candidates and the pick rule chooses among them all (pick.with_candidate)
    merged = with_candidate(one, best, high, space, model, predictor)
    if plan_key(merged.chosen.plan) == plan_key(best.plan):
        out.result = dataclasses.replace(merged, search_s=time.perf_counter() - t0, timings={**one.timings, **out.timings})
    else:  # a one-group pick: the best grouped plan is shown beside it (issue #22)
        out.result = dataclasses.replace(merged, best_grouped=best)
    return out


def replica_search(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, **kw) -> SearchResult:
    """`search` with replica groups when space.max_replica_groups ≥ 2 (else exactly `search`)."""
    return search_replicas(cluster, model, space, predictor, **kw).result
