"""Links between the GPUs of a placed plan: what the p2p transfers, the in-group DP step and the
cross-group exchange of the virtual cluster run over (docs/simulator.md)."""

from __future__ import annotations

from memx.domain.plan import Plan
from memx.domain.specs import Cluster
from memx.simulator.traits import GpuTraits


def link(cluster: Cluster, node_a: int, node_b: int) -> tuple[float, float]:
    """(bytes per ms nominal, latency ms) between two nodes' GPUs."""
    if node_a == node_b:
        return cluster.nodes[node_a].gpu.intra_node_bandwidth_gbps * 1e6, 0.0
    return cluster.inter_node_bandwidth_gbps * 1e6, cluster.inter_node_latency_ms


def dp_ring(plan: Plan, cluster: Cluster, where: list[list[int]], s: int, traits: GpuTraits) -> tuple[float, float]:
    """(bytes per ms of one ring, ms per ring step) of stage s's data-parallel rings over its replicas: the
    intra-node link when every replica sits on one node; else the network link, shared by the stage's tp
    concurrent rings (simulator assumption)."""
    nodes = {where[r][s] for r in range(plan.dp)}
    if len(nodes) == 1:
        bw, lat = link(cluster, where[0][s], where[0][s])
        per_ring = bw * traits.link_efficiency
    else:
        bw, lat = link(cluster, -1, -2)
        per_ring = bw * traits.link_efficiency / plan.stages[s].tp
    return per_ring, traits.collective_step_latency_ms + lat
