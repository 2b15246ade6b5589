"""The links a plan's messages cross, in the closed form (issue #23; docs/planner.md §Network).

The cluster YAML gives every node a NIC bandwidth and latency (its own, else the cluster-wide
`inter_node_bandwidth_gbps` / `inter_node_latency_ms`), a count of NICs (`gpus_per_nic`; one per node
by default) and, optionally, a cross-vendor link for traffic between GPUs of different makers (NCCL ↔
RCCL/HCCL have no GPUDirect RDMA path between them: the bytes are staged through host memory and sent
over TCP or a cross-vendor library, e.g. UCC; so the link is usually far slower than either NIC). The
closed form reads that as:

- one flow between GPUs of nodes a ≠ b runs at min(NIC_a, NIC_b) (the cross-vendor bandwidth instead
  when given and the vendors differ) and pays max(latency_a, latency_b) (the cross-vendor latency);
  inside one node, at the GPU type's intra-node bandwidth, without network latency;
- the flows that leave (or enter) a node at once share its NICs: k flows over n NICs get
  NIC · min(1, n / k) each (our assumption: the flows spread evenly over the NICs, as NCCL binds each
  GPU to its nearest NIC);
- the dp replicas' p2p transfers across one stage boundary run at once, each one flow (`p2p_link`);
- a NIC runs at `nic_efficiency` × its line rate (what nccl-tests measures across nodes ÷ the NIC's bandwidth;
  e.g. Calculon's 0.9 for Selene's HDR InfiniBand, Isaev et al. SC'23, realdata/calculon/systems/a100_80g.json):
  the cluster YAML's where it gives one, else the predictor's runtime catalog's (`achieved`: the closed form with
  conf/runtime, default.yaml 0.9), else line rate (the paper's B: the closed form with runtime "none", the learned
  predictor, whose communication terms were fit at line rate); the cross-vendor link is a measured figure already
  and is not scaled again (below the NICs it is the smaller anyway);
- a ring collective runs at its slowest hop (NCCL's ring: every rank sends and receives each step,
  so a step takes as long as its slowest transfer; Patarasuk & Yuan 2009 §3). With several concurrent
  rings (one per tensor-parallel rank) every ring's hop out of a node is one flow through that node.

Nothing here reads the simulator (which has its own model of the same network: memx/simulator/links.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memx.domain.specs import Cluster

_ACHIEVED: dict[tuple[int, float], tuple[Cluster, Cluster]] = {}  # (id(cluster), x) → (the cluster, with x)


@dataclass(frozen=True)
class _Nodes:
    """A cluster's per-node figures as tuples (read once per cluster: the link searches of a layout enumeration
    ask for them hundreds of thousands of times)."""

    nic_gbps: tuple[float, ...]
    latency_ms: tuple[float, ...]
    nics: tuple[int, ...]
    vendor: tuple[str, ...]
    intra_gbps: tuple[float, ...]


_NODES: dict[int, tuple[Cluster, _Nodes]] = {}  # id(cluster) → (the cluster, its columns); a few clusters at most


def _nodes(cluster: Cluster) -> _Nodes:
    hit = _NODES.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    n = range(len(cluster.nodes))
    eff = 1.0 if cluster.nic_efficiency is None else cluster.nic_efficiency  # module docstring
    cols = _Nodes(nic_gbps=tuple(cluster.nic_gbps(i) * eff for i in n), latency_ms=tuple(cluster.nic_latency(i) for i in n),
                  nics=tuple(node.nics for node in cluster.nodes), vendor=tuple(node.gpu.vendor for node in cluster.nodes),
                  intra_gbps=tuple(node.gpu.intra_node_bandwidth_gbps for node in cluster.nodes))
    if len(_NODES) >= 8:
        _NODES.clear()
    _NODES[id(cluster)] = (cluster, cols)
    return cols


def achieved(cluster: Cluster, predictor) -> Cluster:
    """`cluster` as `predictor` sees its NICs (module docstring): unchanged where the cluster gives its own
    `nic_efficiency` or the predictor has none to give (`predictor.nic_efficiency(gpu_types)`, the closed form's
    runtime catalog), else the cluster with the predictor's figure. The same object for the same cluster and
    figure, so the link caches here keep hitting. Every planner entry (search, estimate) calls it first."""
    x = nic_figure(predictor, cluster.gpu_types) if cluster.nic_efficiency is None else None
    if x is None:
        return cluster
    hit = _ACHIEVED.get((id(cluster), x))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_ACHIEVED) >= 8:
        _ACHIEVED.clear()
    out = replace(cluster, nic_efficiency=x)
    _ACHIEVED[(id(cluster), x)] = (cluster, out)
    return out


def nic_figure(predictor, gpu_types) -> float | None:
    """`predictor.nic_efficiency(gpu_types)` where the predictor has one (the closed form; wrappers that take their
    time from an inner predictor pass it on), else None: line rate."""
    find = getattr(predictor, "nic_efficiency", None)
    return find(gpu_types) if callable(find) else None


def pair_link(cluster: Cluster, node_a: int, node_b: int) -> tuple[float, float]:
    """(GB/s, latency ms) of one flow between a GPU of node_a and one of node_b (module docstring)."""
    return _pair(cluster, _nodes(cluster), node_a, node_b)


def _pair(cluster: Cluster, nodes: _Nodes, a: int, b: int) -> tuple[float, float]:
    if a == b:
        return nodes.intra_gbps[a], 0.0
    bw = min(nodes.nic_gbps[a], nodes.nic_gbps[b])
    lat = max(nodes.latency_ms[a], nodes.latency_ms[b])
    if nodes.vendor[a] != nodes.vendor[b]:  # Cluster.cross_vendor
        if cluster.cross_vendor_bandwidth_gbps is not None:
            bw = min(bw, cluster.cross_vendor_bandwidth_gbps)
        if cluster.cross_vendor_latency_ms is not None:
            lat = cluster.cross_vendor_latency_ms
    return bw, lat


def nic_gbps(cluster: Cluster, node: int) -> float:
    """GB/s one NIC of node `node` achieves (its line rate × the cluster's `nic_efficiency`, module docstring)."""
    return _nodes(cluster).nic_gbps[node]


def nic_share_gbps(cluster: Cluster, node: int, flows: int) -> float:
    """GB/s per flow when `flows` flows cross node `node`'s NICs at once: NIC · min(1, NICs / flows)."""
    return _share(_nodes(cluster), node, flows)


def _share(nodes: _Nodes, node: int, flows: int) -> float:
    return nodes.nic_gbps[node] * min(1.0, nodes.nics[node] / max(flows, 1))


def slowest_hop(cluster: Cluster, hops: Sequence[tuple[int, int]], flows_per_hop: int = 1) -> tuple[float, float]:
    """(GB/s, latency ms) of the slowest of `hops` (sender node, receiver node) running at once, each crossing
    between nodes `flows_per_hop` flows through both nodes' NICs."""
    each = Counter(hops)  # a hop's link depends only on its two nodes and the counts: each distinct hop once
    out, into = Counter(), Counter()
    for (a, b), k in each.items():
        if a != b:
            out[a] += k
            into[b] += k
    nodes = _nodes(cluster)
    bw, lat = math.inf, 0.0
    for a, b in each:
        link_bw, link_lat = _pair(cluster, nodes, a, b)
        if a != b:
            link_bw = min(link_bw, _share(nodes, a, flows_per_hop * out[a]), _share(nodes, b, flows_per_hop * into[b]))
        bw, lat = min(bw, link_bw), max(lat, link_lat)
    return bw, lat


def ring_link(cluster: Cluster, nodes: Sequence[int], rings: int = 1) -> tuple[float, float]:
    """(GB/s, latency ms of one step) of each of `rings` concurrent rings whose members sit on `nodes`, in
    ring order: the slowest hop, where every ring's hop out of (into) a node is one flow through its NICs."""
    n = len(nodes)
    if n <= 1:
        return cluster.nodes[nodes[0]].gpu.intra_node_bandwidth_gbps, 0.0
    return slowest_hop(cluster, [(nodes[i], nodes[(i + 1) % n]) for i in range(n)], rings)


def p2p_link(cluster: Cluster, hops: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(GB/s, latency ms) of a stage boundary's p2p transfer: `hops` (sender node, receiver node), one per dp
    replica, all at once (1F1B runs the replicas in lockstep), each one flow; the slowest replica's link."""
    return slowest_hop(cluster, hops)
