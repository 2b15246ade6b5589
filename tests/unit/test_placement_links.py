"""First-fit placement and the slowest-hop link search (issue #26, session 6: the deep case's layout enumeration)
against their direct forms on random clusters and plans: the same nodes, the same free GPUs left (also when a
plan does not fit), the same (GB/s, latency)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter

import pytest

from memx.domain.catalog import load_gpu
from memx.domain.plan import Plan, Stage, place_plan
from memx.domain.specs import Cluster, Node
from memx.planner.network import slowest_hop

GPUS = ("h100-80g", "a100-80g", "mi300x-192g")


def _direct_place(plan: Plan, cluster: Cluster, free: list[int]) -> list[list[int]] | None:
    """First fit replica by replica, every node scanned from the first (the form before session 6)."""
    where = [[-1] * plan.pp for _ in range(plan.dp)]
    for s, stage in enumerate(plan.stages):
        for r in range(plan.dp):
            for i, node in enumerate(cluster.nodes):
                if node.gpu.name == stage.gpu and free[i] >= stage.tp:
                    free[i] -= stage.tp
                    where[r][s] = i
                    break
            else:
                return None
    return where


def _direct_hop(cluster: Cluster, hops, flows: int) -> tuple[float, float]:
    """Every hop in turn with Cluster's own per-node accessors (the form before session 6)."""
    out = Counter(a for a, b in hops if a != b)
    into = Counter(b for a, b in hops if a != b)
    bw, lat = math.inf, 0.0
    for a, b in hops:
        if a == b:
            link_bw, link_lat = cluster.nodes[a].gpu.intra_node_bandwidth_gbps, 0.0
        else:
            link_bw = min(cluster.nic_gbps(a), cluster.nic_gbps(b))
            link_lat = max(cluster.nic_latency(a), cluster.nic_latency(b))
            if cluster.cross_vendor(a, b):
                link_bw = min(link_bw, cluster.cross_vendor_bandwidth_gbps or math.inf)
                link_lat = cluster.cross_vendor_latency_ms or link_lat
            for node, k in ((a, out[a]), (b, into[b])):
                link_bw = min(link_bw, cluster.nic_gbps(node) * min(1.0, cluster.nodes[node].nics / (flows * k)))
        bw, lat = min(bw, link_bw), max(lat, link_lat)
    return bw, lat


def _cluster(rng: random.Random) -> Cluster:
    gpus = {n: load_gpu(n) for n in GPUS}
    nodes = []
    for _ in range(rng.randint(1, 12)):
        count = rng.choice([2, 4, 8])
        nodes.append(Node(gpu=gpus[rng.choice(GPUS)], count=count,
                          nic_bandwidth_gbps=rng.choice([None, 12.5, 50.0]), nic_latency_ms=rng.choice([None, 0.02]),
                          gpus_per_nic=rng.choice([None, 1, count // 2])))
    return Cluster(name="random", inter_node_bandwidth_gbps=25.0, nodes=tuple(nodes),
                   cross_vendor_bandwidth_gbps=rng.choice([None, 2.0]), cross_vendor_latency_ms=rng.choice([None, 0.5]))


@pytest.fixture(scope="module")
def clusters() -> list[Cluster]:
    rng = random.Random(5)
    return [_cluster(rng) for _ in range(12)]


def test_place_plan_is_first_fit(clusters):
    rng = random.Random(1)
    for i in range(600):
        cl = clusters[i % len(clusters)]
        types = sorted({n.gpu.name for n in cl.nodes})
        tp = {g: rng.choice([1, 2, 4]) for g in types}  # one tp per type, as the layouts have
        gpus = [rng.choice(types) for _ in range(rng.randint(1, 4))]
        plan = Plan(model="m", cluster=cl.name, global_batch=64, micro_batch=1, seq_len=128, dp=rng.randint(1, 4),
                    stages=tuple(Stage(gpu=g, tp=rng.choice([tp[g], 1]), layers=1) for g in gpus))
        start = [rng.randint(0, n.count) for n in cl.nodes] if rng.random() < 0.5 else [n.count for n in cl.nodes]
        free_fast, free_direct = list(start), list(start)
        assert place_plan(plan, cl, free=free_fast) == _direct_place(plan, cl, free_direct)
        assert free_fast == free_direct  # also what a failed placement leaves (memx.domain.groups.place_groups)


def test_slowest_hop_is_the_direct_form(clusters):
    rng = random.Random(7)
    for i in range(300):
        cl = clusters[i % len(clusters)]
        n = len(cl.nodes)
        hops = [(rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(1, 20))]
        hops += hops[: rng.randint(0, len(hops))]  # repeated hops: counted, each link searched once
        flows = rng.randint(1, 4)
        assert slowest_hop(cl, hops, flows) == _direct_hop(cl, hops, flows)
    # a cluster that changes (a new object) is read afresh
    cl = clusters[0]
    faster = dataclasses.replace(cl, inter_node_bandwidth_gbps=400.0)
    hops = [(i, (i + 1) % len(cl.nodes)) for i in range(len(cl.nodes))]
    assert slowest_hop(faster, hops) == _direct_hop(faster, hops, 1)
