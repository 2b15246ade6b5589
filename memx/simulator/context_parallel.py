"""Context parallelism in the virtual cluster (issue #27; docs/simulator.md §Context parallelism).

The simulator's own model of Megatron-LM's `--context-parallel-size` (it never reads the planner): a plan
with cp runs as its rank-equivalent plan (memx.domain.context_parallel: dp·cp replicas of s/cp tokens, the
placement and gradient group Megatron uses) and every stage's layers run Transformer Engine's p2p ring
attention, simulated step by step (`ring_pass_ms`): step k computes the attention of the local queries
against the K/V block that arrived last while the next block is in flight (double-buffered, TE
AttnFuncWithCPAndKVP2P); a step ends when both are done. The forward circulates K and V, the backward K, V,
dK and dV (twice the bytes). Each block is one causal (s/cp)² attention of the stage's own kernels
(physics._attention_core): with the load-balanced split (each rank holds sequence chunks i and 2cp − 1 − i,
Megatron-LM docs "Context parallelism") every step does the same causal share of work.

The ring's link: the cp ranks of one stage and TP rank on their nodes, one ring per TP rank, while every
other cp group of the stage runs its rings at once (their flows share the NICs: links.ring extra_flows).
Memory: the ring's receive buffers, two of each of K, V, dK, dV chunk (the backward's), held while a
layer's backward runs (workspace).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from memx.domain.context_parallel import cp_groups
from memx.domain.plan import Plan
from memx.domain.specs import Cluster
from memx.simulator.links import ring, ring_flows
from memx.simulator.physics import BF16_BYTES, Device, _attention_core
from memx.simulator.stage import MIB, StageCost, StageSignature
from memx.simulator.traits import GpuTraits


def ring_pass_ms(block_ms: float, transfer_ms: float, cp: int) -> float:
    """One pass of the ring over cp blocks: cp steps, each the longer of its block's compute and the next
    block's transfer (none after the last)."""
    total = 0.0
    for k in range(cp):
        total += max(block_ms, transfer_ms) if k < cp - 1 else block_ms
    return total


def cp_ring_links(plan: Plan, cluster: Cluster, where: list[list[int]], tr: dict[str, GpuTraits],
                  cp: int) -> list[tuple[float, float]]:
    """Per stage (bytes per ms of one ring, ms per step) of its slowest cp group, every group's rings at once."""
    out = []
    for s, st in enumerate(plan.stages):
        groups = cp_groups(where, cp, s)
        worst = (float("inf"), 0.0)
        for g, nodes in enumerate(groups):
            others = sum((ring_flows(o, st.tp) for i, o in enumerate(groups) if i != g), Counter())
            bw, step = ring(cluster, nodes, [tr[st.gpu]] * cp, st.tp, others)
            worst = (min(worst[0], bw), max(worst[1], step))
        out.append(worst)
    return out


def with_ring(cost: StageCost, sig: StageSignature, cp: int, dev: Device, bytes_per_ms: float,
              step_ms: float, recompute_penalty: float) -> StageCost:
    """`cost` (of the rank's s/cp signature, which already counts one block per layer and pass) with the
    rest of the ring: cp − 1 more steps per layer forward (and per recomputed forward) and backward, and the
    receive buffers in the workspace."""
    if cp == 1 or not sig.layers:
        return cost
    d = sig.dims()
    blk_f, blk_b, _ = _attention_core(dev, d)
    kv = BF16_BYTES * d.micro_batch * d.seq_len * d.kv_hidden / d.tp  # one of K, V (heads split over tp)
    xfer = 2.0 * kv / bytes_per_ms + step_ms
    fwd = ring_pass_ms(blk_f, xfer, cp) - blk_f
    bwd = ring_pass_ms(blk_b, 2.0 * xfer, cp) - blk_b
    n_again = sig.recomputed_layers + (sig.layers if sig.recompute == "selective" else 0)
    return dataclasses.replace(cost, fwd_ms=cost.fwd_ms + sig.layers * fwd,
                               bwd_ms=cost.bwd_ms + sig.layers * bwd + recompute_penalty * n_again * fwd,
                               workspace_mem_mib=cost.workspace_mem_mib + 2 * 4 * kv / MIB)
