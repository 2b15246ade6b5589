"""Interleaved 1F1B in the closed form (issue #27; docs/planner.md §Interleaved 1F1B).

Megatron-LM's interleaved schedule (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", §2.2.2) splits each pipeline rank's layers into v model chunks; rank s
holds virtual stages s, s + pp, …, s + (v − 1)·pp. On a mixed cluster every rank keeps its own layer share
(the uneven split), cut into v equal chunks. Three terms change against plain 1F1B:

- the bubble shrinks v-fold: (p − 1)/(v·m) of the ideal time instead of (p − 1)/m (§2.2.2);
- every micro batch crosses v·pp − 1 chunk boundaries instead of pp − 1: v× the p2p traffic, plus the
  v − 1 hops from the last rank back to the first (§2.2.2: "the amount of communication also increases by v");
- early ranks hold more activations: Megatron's warm-up runs (pp − s − 1)·2 + (v − 1)·pp forward chunks
  on rank s before its first backward (megatron/core/pipeline_parallel/schedules.py,
  `get_pp_rank_microbatches`, with `microbatch_group_size_per_vp_stage` = pp), so at its peak rank s holds
  k_s = min(that + 1, v·m) chunks, i.e. k_s / v micro batches of its stage's activations.

A stage predictor takes an integer `inflight`; an interleaved stage context asks for plain twin contexts
(⌊k/v⌋ and ⌊k/v⌋ + 1; the last stage also without its output layer, whose logits are held once) and
combines their peaks (`context_twins`: exact for every predictor whose memory is linear in `inflight`, as
the closed forms' static + inflight·activations + workspace is).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from memx.domain.plan import place_plan
from memx.planner.network import p2p_link


def inflight_chunks(pp: int, s: int, micro_batches: int, v: int) -> int:
    """Model chunks rank s holds at its peak under the interleaved schedule: Megatron's warm-up forwards
    (pp − s − 1)·2 + (v − 1)·pp, plus the one forward of the first 1F1B step, at most all v·m chunks
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches)."""
    return min((pp - s - 1) * 2 + (v - 1) * pp + 1, v * micro_batches)


def pipeline_compute_ms(tmax, tsum, m: int, v: int):
    """The compute part of T from the bottleneck stage time tmax and Σ_s t_s: plain 1F1B (m − 1)·tmax + tsum
    (paper §3.1.2), interleaved m·tmax + (tsum − tmax)/v. The fill and drain of plain 1F1B cost tsum − tmax;
    with v chunks per rank every fill/drain step is a chunk, t_s / v, so the bubble shrinks v-fold
    (Narayanan et al. 2021 §2.2.2: bubble (p − 1)/(v·m)). Increasing in both tmax (m − 1/v > 0) and tsum, so
    lower bounds of both give a lower bound of T (memx.planner.bounds)."""
    if v == 1:
        return (m - 1) * tmax + tsum
    return m * tmax + (tsum - tmax) / v


def interleaved_time_ms(stage_ms: np.ndarray, total_ms: np.ndarray, m: int, v: int) -> np.ndarray:
    """pipeline_compute_ms of (pp, N) stage times with total_ms = Σ_s t_s (N,)."""
    return pipeline_compute_ms(stage_ms.max(axis=0), total_ms, m, v)


def p2p_hops(pp: int, v: int) -> tuple[int, int]:
    """(hops over each boundary s → s+1, hops over the wrap pp−1 → 0) one micro batch makes through the
    v·pp virtual stages: v and v − 1 (Narayanan et al. 2021 §2.2.2)."""
    return v, v - 1


def context_twins(ctx) -> list[tuple[object, float]]:
    """The plain contexts (a stage predictor knows them) and weights whose predicted peaks, summed, give an
    interleaved context's peak (memx.planner.tables.StageContext with virtual_stages > 1; exact for a peak
    linear in `inflight`). Layers' activations are held x = k/v times: the peaks at ⌊x⌋ and ⌊x⌋ + 1,
    interpolated. The output layer's (logits) are held once: in Megatron's table the last rank's k chunks
    include a single one of its last chunk, so the last stage's peak is P(1) + (x − 1)·(Q(2) − Q(1)) with Q the
    same context without the output layer."""
    v, k = ctx.virtual_stages, ctx.inflight_chunks
    base = dataclasses.replace(ctx, virtual_stages=1, inflight_chunks=0, inflight=k // v)
    x = k / v
    if ctx.last and x > 1:
        q = dataclasses.replace(base, last=False)
        return [(dataclasses.replace(base, inflight=1), 1.0), (dataclasses.replace(q, inflight=2), x - 1.0),
                (dataclasses.replace(q, inflight=1), 1.0 - x)]
    if k % v == 0:
        return [(base, 1.0)]
    frac = (k % v) / v
    return [(base, 1.0 - frac), (dataclasses.replace(base, inflight=k // v + 1), frac)]


def combine(peaks: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """Σ_i w_i·peak_i: an interleaved stage's peak from its twins' (context_twins)."""
    out = peaks[0] * weights[0]
    for p, w in zip(peaks[1:], weights[1:]):
        out = out + p * w
    return out


def allowed_layers(n: int, code: int, v: int) -> bool:
    """A stage of n layers with recompute option `code` (memx.planner.tables codes) can be interleaved v ways:
    n a multiple of v and a block recompute's layer count too (Megatron applies --recompute-num-layers
    per chunk; memx.domain.plan.interleave_problems)."""
    return n % v == 0 and (code < 1 or code >= n or code % v == 0)


def wrap_gbps(cluster, plan) -> float:
    """Bandwidth of the hop from the last stage back to the first (replica 0's first-fit placement,
    memx.domain.plan.place_plan) on the links between those two stages' nodes, the replicas sharing the NICs
    they cross (memx.planner.network.p2p_link) — the same rule as memx.planner.space.plan_links for
    consecutive stages."""
    where = place_plan(plan, cluster)
    if where is None:
        return cluster.inter_node_bandwidth_gbps
    return p2p_link(cluster, [(w[-1], w[0]) for w in where])[0]
