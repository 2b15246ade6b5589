"""Links between the GPUs of a placed plan: what the p2p transfers, the DP collectives and the
cross-group exchange of the virtual cluster run over (docs/simulator.md §Network).

The virtual cluster's own reading of the cluster YAML's network (it never reads the planner's):
- inside a node, the GPU type's intra-node link, no network latency;
- between nodes a ≠ b, the smaller of the two nodes' NIC bandwidths and the larger NIC latency; between
  nodes of different vendors the cross-vendor link instead where the cluster gives one (no GPUDirect path
  between NCCL and RCCL/HCCL: staged through host memory over TCP or a cross-vendor library);
- a node's NICs carry every flow that leaves (or enters) it at once: k flows over n NICs get
  NIC · min(1, n / k) each (simulator assumption: flows spread evenly over the NICs);
- a ring collective moves at its slowest hop, each hop at the sender GPU's link efficiency, and each of its
  steps waits for the slowest hop's latency (NCCL's ring: Patarasuk & Yuan 2009 §3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from memx.domain.plan import Plan
from memx.domain.specs import Cluster
from memx.simulator.traits import GpuTraits


def link(cluster: Cluster, node_a: int, node_b: int) -> tuple[float, float]:
    """(bytes per ms nominal, latency ms) of one flow between a GPU of node_a and one of node_b."""
    if node_a == node_b:
        return cluster.nodes[node_a].gpu.intra_node_bandwidth_gbps * 1e6, 0.0
    gbps = min(cluster.nic_gbps(node_a), cluster.nic_gbps(node_b))
    lat = max(cluster.nic_latency(node_a), cluster.nic_latency(node_b))
    if cluster.nodes[node_a].gpu.vendor != cluster.nodes[node_b].gpu.vendor:
        gbps = min(gbps, cluster.cross_vendor_bandwidth_gbps or gbps)
        lat = cluster.cross_vendor_latency_ms if cluster.cross_vendor_latency_ms is not None else lat
    return gbps * 1e6, lat


def shared_nic(cluster: Cluster, node: int, flows: int) -> float:
    """Bytes per ms of each of `flows` flows through node `node`'s NICs at once."""
    nics = cluster.nodes[node].nics
    return cluster.nic_gbps(node) * 1e6 * (1.0 if flows <= nics else nics / flows)


def ring_flows(nodes: Sequence[int], rings: int) -> Counter:
    """Flows out of ("out", node) and into ("in", node) each node of `rings` concurrent rings over `nodes`."""
    out: Counter = Counter()
    for i, a in enumerate(nodes):
        b = nodes[(i + 1) % len(nodes)]
        if a != b:
            out[("out", a)] += rings
            out[("in", b)] += rings
    return out


def ring(cluster: Cluster, nodes: Sequence[int], traits: Sequence[GpuTraits], rings: int,
         extra_flows: Counter | None = None) -> tuple[float, float]:
    """(bytes per ms of each ring, ms per ring step) of `rings` concurrent rings whose members sit on `nodes`
    (ring order; `traits[i]`: member i's GPU): the slowest hop, every ring's hop out of (into) a node one
    flow through its NICs (`extra_flows`: more flows per node from other collectives running at once)."""
    n = len(nodes)
    hops = [(i, (i + 1) % n) for i in range(n)] if n > 1 else []
    flows = ring_flows(nodes, rings) + Counter(extra_flows or {})
    bw, step = float("inf"), 0.0
    for i, j in hops:
        a, b = nodes[i], nodes[j]
        link_bw, lat = link(cluster, a, b)
        if a != b:
            link_bw = min(link_bw, shared_nic(cluster, a, flows[("out", a)]), shared_nic(cluster, b, flows[("in", b)]))
        bw = min(bw, link_bw * traits[i].link_efficiency)
        step = max(step, traits[i].collective_step_latency_ms + lat)
    if not hops:
        return cluster.nodes[nodes[0]].gpu.intra_node_bandwidth_gbps * 1e6 * traits[0].link_efficiency, \
            traits[0].collective_step_latency_ms
    return bw, step


def dp_ring(plan: Plan, cluster: Cluster, where: list[list[int]], s: int, traits: GpuTraits) -> tuple[float, float]:
    """(bytes per ms of one ring, ms per ring step) of stage s's data-parallel rings over its replicas (one
    ring per TP rank, replica order): `ring` over the replicas' nodes."""
    return ring(cluster, [where[r][s] for r in range(plan.dp)], [traits] * plan.dp, plan.stages[s].tp)
