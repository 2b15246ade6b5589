"""Context parallelism in the closed form (issue #27; docs/planner.md §Context parallelism).

A plan with context parallelism cp is scored as its rank-equivalent plan (memx.domain.context_parallel:
dp·cp replicas at seq_len s/cp — every per-token term per GPU: GEMMs, elementwise kernels, TP collectives,
the p2p message b·(s/cp)·h, the activations of Korthikanti et al. 2022 Eq. 4 with s/cp, the dp·cp gradient
all-reduce and optimizer shards) plus what the ring attention adds, per layer and micro batch:

- attention compute: each rank's s/cp queries attend all s keys (Megatron-LM / Transformer Engine p2p ring,
  `--cp-comm-type p2p`; Liu et al. 2023, "Ring Attention with Blockwise Transformers", §3): cp blocks of
  (s/cp)² each; with the load-balanced causal split every block costs what the causal diagonal block costs
  (each rank holds chunks i and 2cp − 1 − i, Megatron-LM docs "Context parallelism"), so the per-rank attention
  is cp × the attention of an s/cp sequence = (causal FLOPs of s) / cp. The stage predictor sees the s/cp
  sequence and so its one block; this adds the other cp − 1.
- the K/V exchange: cp − 1 ring steps, each sending the rank's K and V chunk, 2·b·(s/cp)·h_kv/t · 2 B (h_kv =
  g·h/a; heads split over tp), so 2·(cp − 1)/cp·b·s·h_kv/t · 2 B forward, a step taking chunk / (link · link
  efficiency) + collective step latency + network latency (conf/runtime, as the TP ring's ring_ms; where the cluster gives
  `nic_efficiency`, a ring bound by a NIC hop runs at that NIC's achieved rate instead, memx.planner.network); the backward sends K, V and their
  gradients dK, dV: twice that (TE's AttnFuncWithCPAndKVP2P). TE posts step i + 1's send/recv before it
  computes block i (double-buffered), so a step takes max(block compute, transfer): what is charged is the
  non-overlapped part, (cp − 1)·max(0, transfer − block) per pass — a slower link only shows where it is
  slower than the attention block it hides behind, which is why the same cp is free inside an NVLink node
  and costly over a NIC.
- memory: the ring's receive buffers, double-buffered K, V (forward) and K, V, dK, dV (backward):
  2 · 4 · b·(s/cp)·h_kv/t · 2 B while a layer's backward runs (our accounting of TE's buffers).

A recomputed forward (full, or the attention core under selective, Korthikanti 2022 §5) redoes its ring.
The ring's link (`cp_links`): the cp ranks of a stage and TP rank in ring order on their nodes (the ranks
ordered tp, cp, dp, pp: memx.domain.context_parallel.cp_groups), one ring per TP rank, every group of the
stage at once — the slowest hop, the rings sharing the NICs they cross (memx.planner.network.slowest_hop).
The same terms reach every stage predictor (closed form or learned): they are added to its predictions
(`add_ring_terms`), so a learned model trained on cp = 1 profiles is not silently used beyond them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from memx.domain.attention import has_flash_attention
from memx.domain.context_parallel import cp_groups, rank_equivalent
from memx.domain.plan import place_plan
from memx.domain.records import signature_arrays
from memx.domain.runtime import RuntimeProfile, load_runtime
from memx.domain.specs import Cluster, GpuType
from memx.planner.cost import MIB, recomputed_layers
from memx.planner.network import slowest_hop
from memx.planner.runtime_terms import BF16, RuntimeColumns, attention_core_ms, shapes

RING_BUFFERS = 2 * 4  # double-buffered K, V, dK, dV chunks (module docstring)


def launcher_runs_cp(launcher: str, gpus: Sequence[GpuType]) -> bool:
    """Whether `launcher` (SearchSpace.launcher; memx.planner.launcher) starts cp > 1 on these GPUs: megatron only
    where every GPU has fused attention (Transformer Engine's context-parallel attention; memx.domain.attention),
    flagscale never (its heterogeneous ParallelContext asserts cp == 1), any always."""
    if launcher == "flagscale":
        return False
    return launcher != "megatron" or all(has_flash_attention(g) for g in gpus)


def cp_links(cluster: Cluster, plan) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Per stage, (GB/s, latency ms) of its cp ring (module docstring); None when the plan does not fit."""
    cp = plan.context_parallel
    where = place_plan(rank_equivalent(plan), cluster)
    if where is None:
        return None
    bw, lat = [], []
    for s, st in enumerate(plan.stages):
        hops = [(g[i], g[(i + 1) % cp]) for g in cp_groups(where, cp, s) for i in range(cp)]
        b, t = slowest_hop(cluster, hops, st.tp)
        bw.append(b)
        lat.append(t)
    return tuple(bw), tuple(lat)


def ring_terms(sigs, cp: np.ndarray, link_gbps: np.ndarray, latency_ms: np.ndarray,
               gpus: Mapping[str, GpuType], profiles: Mapping[str, RuntimeProfile], *,
               nic_achieved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(ms, MiB) the ring adds to each signature row's time (forward + backward of one micro batch) and peak;
    rows are per-rank signatures (seq_len s/cp), cp = 1 rows add nothing (module docstring). `nic_achieved`: the
    cluster gives `nic_efficiency`, so a ring whose slowest hop is a NIC (slower than the GPU's intra-node link)
    already runs at that NIC's achieved rate, and the NVLink efficiency applies to NVLink-bound rings only."""
    c = signature_arrays(sigs)
    cp = np.asarray(cp, dtype=np.float64)
    on = cp > 1
    if not on.any():
        z = np.zeros(len(cp))
        return z, z
    rc = RuntimeColumns.of(c["gpu"], gpus, profiles)
    x = shapes(c, np.asarray(c["sequence_parallel"], dtype=bool))
    a_f, a_b, _ = attention_core_ms(x, rc)  # one (s/cp)² causal block: what the predictor already counts
    chunk = BF16 * 2.0 * x.b * x.s * x.kv / x.t  # one rank's K and V chunk per TP rank
    # one ring step: the chunk at the link's achieved rate (the GPU's link efficiency, conf/runtime) plus the
    # collective step latency and the network latency (memx.planner.runtime_terms.ring_ms's terms)
    eff = np.array([profiles[str(g)].link_efficiency for g in c["gpu"]], dtype=np.float64)
    gbps = np.maximum(np.asarray(link_gbps, dtype=np.float64), 1e-9)
    if nic_achieved:
        intra = np.array([gpus[str(g)].intra_node_bandwidth_gbps for g in c["gpu"]], dtype=np.float64)
        eff = np.where(gbps < intra, 1.0, eff)
    step = chunk / (gbps * 1e6 * eff) + rc.step_ms + np.asarray(latency_ms)
    steps = np.maximum(cp - 1.0, 0.0)
    fwd = steps * (a_f + np.maximum(0.0, step - a_f))
    bwd = steps * (a_b + np.maximum(0.0, 2.0 * step - a_b))
    L = c["layers"].astype(np.float64)
    n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
    selective = np.asarray(c["recompute"]) == "selective"
    ms = (L + n_rec + selective * L) * fwd + L * bwd
    mib = (L > 0) * RING_BUFFERS * chunk / 2.0 / MIB * (1.0 + rc.frag)  # chunk holds K and V: 4 tensors × 2
    return np.where(on, ms, 0.0), np.where(on, mib, 0.0)


def runtime_profiles(cluster: Cluster) -> dict[str, RuntimeProfile]:
    return {g.name: load_runtime(g.name, g.vendor) for g in cluster.gpu_types}


def add_ring_terms(pred: dict[str, np.ndarray], sigs, contexts: Sequence, ctx_index: np.ndarray,
                   cluster: Cluster) -> dict[str, np.ndarray]:
    """`pred` (a predictor's columns for `sigs`) with the ring's time and memory added to every time and peak
    column (intervals shift with the point), for rows whose context (`contexts[ctx_index]`) has cp > 1."""
    cp = np.array([c.context_parallel for c in contexts])[ctx_index] if len(contexts) else np.ones(0)
    if not (cp > 1).any():
        return pred
    gbps = np.array([c.cp_gbps for c in contexts])[ctx_index]
    lat = np.array([c.cp_latency_ms for c in contexts])[ctx_index]
    ms, mib = ring_terms(sigs, cp, gbps, lat, {g.name: g for g in cluster.gpu_types}, runtime_profiles(cluster),
                         nic_achieved=cluster.nic_efficiency is not None)
    out = dict(pred)
    for col in [k for k in out if k.startswith("time_ms")]:
        out[col] = np.asarray(out[col], dtype=np.float64) + ms
    for col in [k for k in out if k.startswith("peak_mem_mib")]:
        out[col] = np.asarray(out[col], dtype=np.float64) + mib
    return out
