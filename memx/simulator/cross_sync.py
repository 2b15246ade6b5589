"""Cross-group gradient synchronisation of a schema-2 plan on the virtual cluster (issue #15).

A schema-2 plan's replica groups may split the layers differently (docs/architecture.md §Plan JSON,
schema 2). After a group's own data-parallel step every replica of that group holds the group's summed
gradient; each layer's gradient is then all-reduced across the G groups. The simulator's own model of
that exchange (it never reads the planner's closed form):

- Units: the embedding, every transformer layer, the output layer. Consecutive units held by the same
  stage in every group form a *segment*; a segment is exchanged as one collective.
- Lanes: the segment's fp32 gradient is cut into L = max_g dp_g chunks; lane r exchanges chunk r among
  replica r mod dp_g of every group g. Every replica holds its group's sum, so the lanes run at once on
  chunks, then each group all-gathers within itself the chunks its replicas did not exchange (replica r
  took part in lanes r, r + dp_g, …: 1/dp_g of them) — the 2D (hierarchical) all-reduce: the in-group
  step, the all-reduce across the other dimension on chunks, the in-group all-gather (Mikami et al. 2018,
  "Massively distributed SGD", 2D-torus all-reduce).
- In a lane, the chunk is ring all-reduced over the G participants in group order (Patarasuk & Yuan
  2009, `physics.ring_allreduce_ms`), split over the participating stages' smallest tp (that many
  concurrent rings, each carrying chunk / tp). The ring runs at its slowest hop: a hop inside one node
  at the sender GPU's intra-node link, a hop between nodes at the network link shared by every ring that
  leaves the sender's node (simulator assumption, as for the in-group DP step). The all-gather runs over
  the group's own DP links (`links.dp_ring`, `physics.ring_collective_ms`); the groups' all-gathers
  run at once.
- Time: a segment starts when every participating stage has finished its in-group DP step and is not
  busy with another segment (segments are issued in order of readiness); a stage's optimizer step
  starts after its last segment.

With the distributed optimizer (ZeRO-1, Rajbhandari et al. 2020 §5) the in-group step has already
reduce-scattered the gradient: replica r of a group owns the summed shard it will update, and the lanes
exchange exactly those shards (lane r's chunk is part of the shard of replica r mod dp_g), so there is no
in-group all-gather of gradients afterwards: each replica updates its own shard and the parameter
all-gather of the in-group step follows the optimizer step as in schema 1. Without it, every replica
needs the whole summed gradient, hence the all-gather.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from memx.domain.plan import Plan
from memx.domain.specs import Cluster, ModelArch
from memx.simulator import links
from memx.simulator.links import dp_ring
from memx.simulator.physics import BF16_BYTES, GRAD_BYTES_OF, Dims, layer_params, ring_allreduce_ms, ring_collective_ms
from memx.simulator.traits import GpuTraits


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Consecutive units held by the same stage of every group: `stages[g]` is group g's stage."""

    stages: tuple[int, ...]
    params: float  # parameters of the units (whole, not divided by tp)


def _unit_params(model: ModelArch, plans: Sequence[Plan]) -> list[float]:
    """Parameters of the embedding, each layer and the output layer, whole (physics.py's counts at tp = 1). Tied
    embeddings with every group one stage deep: the output layer has no weight of its own (physics.output_cost,
    owns_weight), its gradient is the embedding unit's; a group more than one stage deep keeps a copy on its last
    stage, exchanged as the output unit."""
    plan = plans[0]
    d = Dims(micro_batch=plan.micro_batch, seq_len=plan.seq_len, hidden=model.hidden, ffn_hidden=model.ffn_hidden,
             heads=model.heads, query_groups=model.query_groups, vocab=model.vocab, mlp=model.mlp, tp=1)
    positions = plan.seq_len * model.hidden if model.mlp == "gelu" else 0  # physics.embedding_cost
    shared = model.tied_embeddings and all(p.pp == 1 for p in plans)
    return [model.vocab * model.hidden + positions, *[layer_params(d)] * model.layers,
            (0 if shared else model.vocab * model.hidden) + model.hidden]  # physics.output_cost


def _holders(plan: Plan) -> list[int]:
    """Stage index holding each unit (embedding, layers…, output) of one group's pipeline."""
    layers = [s for s, st in enumerate(plan.stages) for _ in range(st.layers)]
    return [0, *layers, plan.pp - 1]


def segments(plans: Sequence[Plan], model: ModelArch) -> list[Segment]:
    """The groups' units merged into segments, first unit to last."""
    params = _unit_params(model, plans)
    holders = [_holders(p) for p in plans]
    out: list[Segment] = []
    for u, n in enumerate(params):
        key = tuple(h[u] for h in holders)
        if out and out[-1].stages == key:
            out[-1] = Segment(stages=key, params=out[-1].params + n)
        else:
            out.append(Segment(stages=key, params=n))
    return out


def segment_ms(seg: Segment, plans: Sequence[Plan], where: Sequence[list[list[int]]], cluster: Cluster,
               tr: dict[str, GpuTraits]) -> float:
    """One segment's exchange across the groups (module doc): the slowest lane's ring all-reduce of its
    chunk, then the slowest group's all-gather of the chunks its replicas did not exchange."""
    groups = len(plans)
    tp = min(p.stages[s].tp for p, s in zip(plans, seg.stages))
    lanes = max(p.dp for p in plans)
    nbytes = GRAD_BYTES_OF[plans[0].precision] * seg.params / tp  # per ring: the segment split over the smallest tp
    nodes = [[where[g][r % plans[g].dp][seg.stages[g]] for g in range(groups)] for r in range(lanes)]
    traits = [tr[p.stages[s].gpu] for p, s in zip(plans, seg.stages)]
    flows = [links.ring_flows(lane, tp) for lane in nodes]
    total = sum(flows, Counter())
    ring = 0.0
    for lane, own in zip(nodes, flows):  # the lanes run at once: the other lanes' flows share the NICs too
        bw, step = links.ring(cluster, lane, traits, tp, total - own)
        ring = max(ring, ring_allreduce_ms(nbytes / lanes, groups, bw, step))
    if plans[0].distributed_optimizer:
        return ring  # each replica keeps the shard it updates (module docstring)
    gather = 0.0
    for p, w, s in zip(plans, where, seg.stages):  # replica r holds the chunks of lanes r, r + dp, …: 1/dp of them
        per_ring, step = dp_ring(p, cluster, w, s, tr[p.stages[s].gpu])
        gather = max(gather, ring_collective_ms(nbytes, p.dp, per_ring, step))
    return ring + gather


def flat_stage_ms(plans: Sequence[Plan], where: Sequence[list[list[int]]], s: int, params: float, cluster: Cluster,
                  tr: dict[str, GpuTraits]) -> float:
    """Stage s's ONE data-parallel collective over the replicas of every group, for groups that share a layer
    partition (memx.domain.groups.shared_partition; module docstring of memx.simulator.schedule): tp concurrent
    rings over all N = Σ dp_g replicas in group-then-replica order, at the slowest hop (links.ring); an fp32
    all-reduce, or with the distributed optimizer an fp32 reduce-scatter plus a bf16 all-gather (ZeRO-1,
    Rajbhandari et al. 2020 §5). `params`: the stage's parameters per rank."""
    nodes = [w[r][s] for p, w in zip(plans, where) for r in range(p.dp)]
    traits = [tr[p.stages[s].gpu] for p in plans for _ in range(p.dp)]
    bw, step = links.ring(cluster, nodes, traits, plans[0].stages[s].tp)
    n = len(nodes)
    grad = GRAD_BYTES_OF[plans[0].precision]  # fp32 main grads, fp16 grads under fp16 (physics.GRAD_BYTES_OF)
    if plans[0].distributed_optimizer:
        return ring_collective_ms(grad * params, n, bw, step) + ring_collective_ms(BF16_BYTES * params, n, bw, step)
    return ring_allreduce_ms(grad * params, n, bw, step)


def schedule_sync(segs: Sequence[Segment], seg_ms: Sequence[float], ready: Sequence[Sequence[float]]) -> list[list[float]]:
    """When each stage [group][stage] is done with the cross-group exchange: segments issued in order
    of readiness (ties: unit order), each starting when its stages are ready and free."""
    done = [list(r) for r in ready]
    start_of = [max(ready[g][s] for g, s in enumerate(seg.stages)) for seg in segs]
    for i in sorted(range(len(segs)), key=lambda k: (start_of[k], k)):
        seg = segs[i]
        start = max(done[g][s] for g, s in enumerate(seg.stages))
        for g, s in enumerate(seg.stages):
            done[g][s] = start + seg_ms[i]
    return done
