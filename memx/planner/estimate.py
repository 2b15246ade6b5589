"""Predict given plans (not a search): iteration time, per-GPU peaks, M, V, margin, feasibility.

Uses the same stage contexts, signatures, stage predictor and 1F1B assembly (memx.planner.schedule)
as the search, so the search's pick and `estimate_plans([pick])` agree; `memx evaluate` and
`memx plan --check` use this.
"""

from __future__ import annotations

from itertools import groupby

import numpy as np

from memx.domain.context_parallel import rank_equivalent
from memx.domain.plan import Plan, plan_model, validate_plan
from memx.domain.specs import Cluster, ModelArch
from memx.domain.stage_dp import has_stage_dp
from memx.planner import moe, stage_dp
from memx.planner.context_parallel import add_ring_terms, cp_links
from memx.planner.interleave import context_twins, wrap_gbps
from memx.planner.metrics import PlanMetrics, corrected_plans, plan_metrics
from memx.planner.moe_dense import measured_dense_shift
from memx.planner.network import achieved
from memx.planner.predictions import params_per_rank
from memx.planner.schedule import AssemblyCalibration, assembly_of, pipeline
from memx.planner.signatures import StagePredictor, predict_arrays, signature_columns
from memx.planner.space import plan_links
from memx.planner.tables import option_code, plan_contexts


def estimate_plans(plans: list[Plan], cluster: Cluster, model: ModelArch, predictor: StagePredictor, *,
                   reserve_gib: float = 1.0, pipeline_assembly: str | None = None) -> list[PlanMetrics]:
    """One predictor call for all stages of all plans; the metrics are not scored (phi None). pipeline_assembly
    (SearchSpace.pipeline_assembly, as the search that found the plans used it): how plain 1F1B is assembled
    (memx.planner.schedule.steady_period_ms); None: as the predictor's assembly has it (the default
    DEFAULT_PIPELINE_ASSEMBLY without a calibration)."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    for i, p in enumerate(plans):
        validate_plan(p, cluster, model, source=f"plan[{i}]")
    ctxs, layers, pred = _predict_stages(plans, model, predictor, cluster)
    assembly = assembly_of(predictor, pipeline_assembly)  # a calibrated predictor's c, o and d, as in the search
    t_all, m_all, s_all = pred["time_ms"], pred["peak_mem_mib"], pred["static_mem_mib"]
    out, k = [], 0
    for p in plans:
        sl, trained = slice(k, k + p.pp), plan_model(p, model)  # the model the plan trains (heads, seq_len)
        params = np.array([params_per_rank(c, np.asarray(n), trained) for c, n in zip(ctxs[sl], layers[sl])])
        out.append(_assemble(p, cluster, trained, t_all[sl], m_all[sl], s_all[sl], params, reserve_gib, assembly))
        k += p.pp
    return corrected_plans(predictor, out)  # a calibrated predictor's plan residual (memx.learn.residual)


def _predict_stages(plans: list[Plan], model: ModelArch, predictor: StagePredictor, cluster: Cluster | None = None):
    """(stage contexts, layers per stage, the predictor's columns) for every stage of every plan, in order; each
    plan's stages carry the model it trains (`plan_model`: its heads, query groups, sequence length). A MoE
    model's stages carry their experts (memx.planner.moe; without `cluster`: memory only, no all-to-all link).
    `cluster` gives context-parallel plans their rings' links and terms (memx.planner.context_parallel); without
    it (upper_margins) the ring's small buffers are left out of the bound, the point peak still holds them."""
    ctxs = [c for p in plans for c in _contexts(p, model, cluster)]
    layers = np.asarray([st.layers for p in plans for st in p.stages])
    codes = np.asarray([option_code(st) for p in plans for st in p.stages])
    pred = _predict_rows(plans, model, predictor, ctxs, layers, codes, cluster)
    inter = [i for i, c in enumerate(ctxs) if c.virtual_stages > 1]
    if inter:  # interleaved: peaks from the twins' (memx.planner.interleave.context_twins)
        twins = {i: context_twins(ctxs[i]) for i in inter}
        cols = [c for c in ("peak_mem_mib", "peak_mem_mib_low", "peak_mem_mib_high") if c in pred]
        out = {col: np.array(pred[col], dtype=float) for col in cols}
        for t in range(max(len(tw) for tw in twins.values())):
            alt = [twins[i][t][0] if i in twins and t < len(twins[i]) else c for i, c in enumerate(ctxs)]
            got = _predict_rows(plans, model, predictor, alt, layers, codes, cluster)
            for col in cols:
                part = np.asarray(got[col], dtype=float)
                for i in inter:
                    w = twins[i][t][1] if t < len(twins[i]) else 0.0
                    out[col][i] = (0.0 if t == 0 else out[col][i]) + w * part[i]
        for col in cols:
            pred[col] = out[col]
    return ctxs, layers, pred


def _contexts(plan: Plan, model: ModelArch, cluster: Cluster | None):
    if has_stage_dp(plan):  # each stage at its per-rank micro batch, its own cp rings (memx.planner.stage_dp)
        return stage_dp.plan_stage_contexts(plan, cluster, model)
    ctxs = plan_contexts(plan, cp_links(cluster, plan) if plan.context_parallel > 1 and cluster else None)
    if not model.is_moe:
        return ctxs
    if cluster is None:  # memory only: the all-to-all link does not change it
        edp = moe.expert_dp_size(plan.dp, plan.context_parallel, plan.expert_parallel)
        return moe.with_experts(ctxs, plan.expert_parallel, edp, [(0.0, 0.0, 1.0)] * plan.pp)
    return moe.plan_expert_contexts(ctxs, plan, model, cluster)


def _predict_rows(plans: list[Plan], model: ModelArch, predictor: StagePredictor, ctxs, layers, codes,
                  cluster: Cluster | None = None):
    """The predictor's columns for one row per stage (contexts `ctxs`, in plan order; a MoE model's adjusted,
    memx.planner.moe.adjust; a context-parallel stage's with its ring's terms)."""
    frames, runs, k = [], [], 0
    for trained, group in groupby(plans, key=lambda p: plan_model(p, model)):  # consecutive runs keep the order
        n = sum(p.pp for p in group)
        sl = slice(k, k + n)
        frames.append(signature_columns(ctxs[sl], layers[sl], codes[sl], np.arange(n), trained, trained.seq_len))
        runs.append((sl, trained))
        k += n
    sigs = frames[0] if len(frames) == 1 else {c: np.concatenate([f[c] for f in frames]) for c in frames[0]}
    pred = predict_arrays(predictor, sigs)
    gpus = None if cluster is None else {g.name: g for g in cluster.gpu_types}
    if any(trained.is_moe for _, trained in runs):  # writable copies (a DataFrame's columns may be read-only)
        pred = {c: np.array(v, dtype=np.float64) for c, v in pred.items()}
    for (sl, trained), frame in zip(runs, frames):
        if trained.is_moe:  # each run's MoE terms with the model it trains (memx.planner.moe)
            part = moe.adjust({c: v[sl] for c, v in pred.items()}, frame, trained, gpus,
                              measured_dense_shift(predictor, frame, trained))
            for c, v in part.items():
                pred[c][sl] = v
    if cluster is None or all(c.context_parallel == 1 for c in ctxs):
        return pred
    return add_ring_terms(pred, sigs, ctxs, np.arange(len(ctxs)), cluster)  # cp > 1: the ring's terms


def upper_margins(cands: list[PlanMetrics], model: ModelArch, predictor: StagePredictor) -> list[float | None]:
    """Each plan's smallest margin at the predictor's upper memory bound (`peak_mem_mib_high`, the 90 %
    interval's top, memx.planner.signatures.INTERVAL_COLUMNS); None where the predictor gives no interval
    (the closed form): then the point margin stands. A stage's upper bound is max(high, point peak), the point
    peak where its interval is NaN — what the search's tables hold (memx.planner.predictions.ladder_highs), so
    the search bounds this margin per box (issue #22). Capacities are the plans' own (PlanMetrics)."""
    if not cands:
        return []
    _, _, pred = _predict_stages([c.plan for c in cands], model, predictor)
    if "peak_mem_mib_high" not in pred or np.isnan(pred["peak_mem_mib_high"]).all():
        return [None] * len(cands)
    high, out, k = pred["peak_mem_mib_high"], [], 0
    for c in cands:
        h, cap, peak = high[k:k + c.plan.pp], np.asarray(c.capacity_mib), np.asarray(c.stage_peak_mib)
        top = np.where(np.isnan(h), peak, np.maximum(h, peak))
        out.append(None if np.isnan(h).all() else float(np.min((cap - top) / cap)))
        k += c.plan.pp
    return out


def _assemble(p: Plan, cluster: Cluster, model: ModelArch, t: np.ndarray, mem: np.ndarray, static: np.ndarray,
              params: np.ndarray, reserve_gib: float, assembly: AssemblyCalibration) -> PlanMetrics:
    """One plan through the search's assembly, as a one-column batch."""
    if has_stage_dp(p):  # one pipeline, dp_s groups per stage (memx.planner.stage_dp)
        return stage_dp.assemble(p, cluster, model, t, mem, static, params, reserve_gib, assembly)
    plan, p = p, rank_equivalent(p)  # cp > 1: dp·cp replicas of s/cp (memx.domain.context_parallel)
    p2p_gbps, dp_gbps, p2p_latency_ms, dp_latency_ms, emb_link = plan_links(cluster, p)
    pipe = pipeline(cluster, model, stage_gpus=[st.gpu for st in p.stages], stage_tp=[st.tp for st in p.stages],
                    dp=p.dp, micro_batch=p.micro_batch, micro_batches=p.micro_batches, seq_len=p.seq_len,
                    p2p_gbps=p2p_gbps, dp_gbps=dp_gbps, p2p_latency_ms=p2p_latency_ms, dp_latency_ms=dp_latency_ms,
                    embedding_link=emb_link,
                    distributed_optimizer=p.distributed_optimizer, assembly=assembly, virtual_stages=p.virtual_stages,
                    wrap_gbps=wrap_gbps(cluster, p) if p.virtual_stages > 1 else None, precision=p.precision,
                    expert_parallel=p.expert_parallel,
                    expert_links=moe.a2a_links(cluster, p) if model.is_moe else None)
    T, stats = pipe.assemble(t[:, None], mem[:, None], pipe.tail_ms(static[:, None], params[:, None]))
    return plan_metrics(plan, iteration_time_ms=T, stage_time_ms=t, stage_peak_mib=mem, capacity_mib=pipe.capacity_mib,
                        stats=stats, feasible=bool(np.all(mem <= pipe.capacity_mib - reserve_gib * 1024.0)),
                        loop_p2p_ms=() if pipe.loop_ms() is None else pipe.boundary_p2p_ms)
