"""Predict given plans (not a search): iteration time, per-GPU peaks, M, V, margin, feasibility.

Uses the same signatures, stage predictor and 1F1B assembly as the search, so the search's pick and
`estimate_plans([pick])` agree exactly; `memx evaluate` and `memx plan --check` use this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memx.planner.cost import stage_params_per_rank
from memx.planner.schedule import dp_allreduce_ms, iteration_time_ms, memory_stats, optimizer_ms, p2p_ms
from memx.domain.plan import Plan, validate_plan
from memx.planner.signatures import SIGNATURE_COLUMNS, StagePredictor, signature_frame
from memx.planner.space import plan_links
from memx.domain.specs import Cluster, ModelArch
from memx.planner.tables import NONE, SELECTIVE, StageContext


@dataclass(frozen=True, kw_only=True)
class Estimate:
    plan: Plan
    iteration_time_ms: float
    stage_time_ms: tuple[float, ...]
    stage_peak_mib: tuple[float, ...]
    peak_mem_mib: tuple[float, ...]  # per GPU: replica-major, then stage, then tp rank
    max_mem_mib: float
    mem_variance_mib2: float
    min_margin: float
    feasible: bool  # every GPU's peak ≤ capacity − reserve


def _code(stage) -> int:
    if stage.recompute == "none":
        return NONE
    if stage.recompute == "selective":
        return SELECTIVE
    return stage.recomputed_layers


def estimate_plans(plans: list[Plan], cluster: Cluster, model: ModelArch, predictor: StagePredictor, *,
                   reserve_gib: float = 1.0) -> list[Estimate]:
    """One predictor call for all stages of all plans."""
    for i, p in enumerate(plans):
        validate_plan(p, cluster, model, source=f"plan[{i}]")
    ctxs, layers, codes = [], [], []
    for p in plans:
        m = p.micro_batches
        for s, st in enumerate(p.stages):
            ctxs.append(StageContext(gpu=st.gpu, tp=st.tp, micro_batch=p.micro_batch, first=s == 0,
                                     last=s == p.pp - 1, inflight=min(p.pp - s, m)))
            layers.append(st.layers)
            codes.append(_code(st))
    seq = plans[0].seq_len if plans else model.seq_len
    if any(p.seq_len != seq for p in plans):
        raise ValueError("estimate_plans needs plans of one sequence length")
    sigs = signature_frame(ctxs, np.asarray(layers), np.asarray(codes), np.arange(len(ctxs)), model, seq)
    pred = predictor.predict(sigs.loc[:, list(SIGNATURE_COLUMNS)])
    t_all, m_all = pred["time_ms"].to_numpy(float), pred["peak_mem_mib"].to_numpy(float)
    s_all = pred["static_mem_mib"].to_numpy(float)
    out, k = [], 0
    for p in plans:
        sl = slice(k, k + p.pp)
        k += p.pp
        out.append(_assemble(p, cluster, model, t_all[sl], m_all[sl], s_all[sl], reserve_gib))
    return out


def _assemble(p: Plan, cluster: Cluster, model: ModelArch, t: np.ndarray, mem: np.ndarray, static: np.ndarray,
              reserve_gib: float) -> Estimate:
    gpus = [cluster.gpu(st.gpu) for st in p.stages]
    p2p_gbps, dp_gbps = plan_links(cluster, p)
    p2p_total = float(2.0 * p2p_ms(p.micro_batch, p.seq_len, model.hidden, np.asarray(p2p_gbps),
                                   cluster.inter_node_latency_ms).sum())
    params = np.array([stage_params_per_rank(st.layers, st.tp, s == 0, s == p.pp - 1, model.hidden, model.ffn_hidden,
                                             model.heads, model.query_groups, model.vocab, model.mlp)
                       for s, st in enumerate(p.stages)])
    tail = optimizer_ms(static, np.array([g.memory_bandwidth_gbps for g in gpus])) + dp_allreduce_ms(
        params, p.dp, np.asarray(dp_gbps))
    T = iteration_time_ms(t[:, None], p.micro_batches, p2p_total, tail[:, None])
    cap = np.array([g.memory_mib for g in gpus])
    stats = memory_stats(mem[:, None], np.array([st.tp for st in p.stages], dtype=float), cap)
    per_gpu = tuple(float(mem[s]) for _ in range(p.dp) for s, st in enumerate(p.stages) for _ in range(st.tp))
    return Estimate(
        plan=p, iteration_time_ms=float(T[0]), stage_time_ms=tuple(map(float, t)), stage_peak_mib=tuple(map(float, mem)),
        peak_mem_mib=per_gpu, max_mem_mib=float(stats.max_mib[0]), mem_variance_mib2=float(stats.variance_mib2[0]),
        min_margin=float(stats.min_margin[0]), feasible=bool(np.all(mem <= cap - reserve_gib * 1024.0)),
    )
