"""What every planner in this package shares: predictor wrappers, the `Pick` result and the
`TimeOnlyPlanner` that AMP-, Metis-, HexiScale- and FaSOP-like planners are configurations of.

Every planner searches the SAME plan space (memx.planner.space) with the SAME stage predictions (one
`StagePredictor`, usually the learned MemX predictor) through the same vectorised engine
(memx.planner.search). They differ only in decision logic:

* which recompute levels they search (and whether per stage or one level for the whole plan),
* which memory estimate decides fits-or-not (none, a formula, a formula × a safety factor, or the
  shared predictor), and
* the objective (time only — weights 1,0,0 — or MemX's Φ).

A baseline's memory estimate replaces the predictor's `peak_mem_mib` / `static_mem_mib` columns via
`OwnMemory`; the search then prunes with that estimate exactly as MemX prunes with its own. Time
always comes from the shared predictor, so time differences between methods come from the plans
they choose (and, in prediction experiments, from the plan the method *thinks* it is running — a
method without a recompute model predicts a recomputing plan as if it did not recompute).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memx.domain.errors import InfeasibleError
from memx.domain.groups import AnyPlan
from memx.domain.plan import Plan, Recompute
from memx.domain.specs import Cluster, ModelArch, SearchSpace, Weights
from memx.planner.estimate import estimate_plans
from memx.planner.metrics import PlanMetrics
from memx.planner.network import nic_figure
from memx.planner.objective import EPSILON_MIB2, log_score, parse_weights
from memx.planner.replica_search import search_replicas
from memx.planner.result import SearchResult
from memx.planner.search import search
from memx.planner.stage_dp_search import floor_then_fastest
from memx.planner.signatures import StagePredictor

MemoryModel = Callable[[pd.DataFrame], pd.DataFrame]  # sigs → DataFrame(peak_mem_mib, static_mem_mib)
TIME_ONLY = "1,0,0"
SAVING_ORDER = {r: i for i, r in enumerate(Recompute)}  # declaration order: none < selective < full
NO_RECOMPUTE = ((Recompute.NONE,),)  # level_sets of a planner that does not search recomputation


class OwnMemory:
    """StagePredictor: time (and static memory, which only sets the optimizer-step time) from `inner`,
    peak memory from the planner's own `memory` estimate.

    `memory=None` means the planner has no memory model at all (AMP): every stage "fits" (1 MiB;
    not 0 so that log M stays finite; with w_M = 0 it has no effect on the ranking)."""

    def __init__(self, inner: StagePredictor, memory: MemoryModel | None, name: str = "own-memory"):
        self.inner, self.memory = inner, memory
        self.name = f"{name}({getattr(inner, 'name', type(inner).__name__)})"

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.inner.predict(sigs).copy()
        if self.memory is None:
            out["peak_mem_mib"] = 1.0
        else:
            out["peak_mem_mib"] = self.memory(sigs)["peak_mem_mib"].to_numpy(float)
        return out  # static_mem_mib stays the shared predictor's: it only feeds the optimizer-step time

    def nic_efficiency(self, gpu_types) -> float | None:
        return nic_figure(self.inner, gpu_types)  # time from `inner`: its network too (memx.planner.network)


class StaticScaled:
    """StagePredictor: `inner` with the static part (weights, grads, optimizer) scaled by `factor`:
    peak' = peak − static + factor·static. Used for Table 1, where the optimizer state is offloaded
    (4 instead of 18 B/param on the GPU, as tests/validation/test_simulator_table1.py simulates)."""

    def __init__(self, inner: StagePredictor, factor: float):
        self.inner, self.factor = inner, factor
        self.name = f"static×{factor:.3g}({getattr(inner, 'name', type(inner).__name__)})"

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.inner.predict(sigs).copy()
        static = out["static_mem_mib"].to_numpy(float)
        out["peak_mem_mib"] = out["peak_mem_mib"].to_numpy(float) - (1.0 - self.factor) * static
        out["static_mem_mib"] = self.factor * static
        return out

    def nic_efficiency(self, gpu_types) -> float | None:
        return nic_figure(self.inner, gpu_types)  # as OwnMemory


@dataclass(frozen=True, kw_only=True)
class Pick:
    """One planner's recommendation and what the planner itself believes about it."""

    method: str
    plan: AnyPlan | None  # None: the planner found nothing that fits by its own estimate (schema 2: replica groups)
    predicted_time_ms: float | None
    predicted_peak_mib: tuple[float, ...] | None  # per GPU, the planner's own estimate; None = no memory model
    search_s: float
    configurations: int  # plans the planner scored (after its pruning bounds)
    space_total: int  # plan space it searched, counting its recompute choices
    note: str = ""
    candidates: list[PlanMetrics] = field(default_factory=list, repr=False)  # best first


def uniform_view(plan: Plan) -> Plan:
    """The plan with one recompute setting for every stage: the most memory-saving level any stage
    uses (stock Megatron-LM has one --recompute-* setting for all stages)."""
    level = max((s.recompute for s in plan.stages), key=SAVING_ORDER.__getitem__)
    stages = tuple(dataclasses.replace(s, recompute=level, recompute_layers=None) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def no_recompute_view(plan: Plan) -> Plan:
    """The plan as a planner without a recompute model sees it: no recomputation anywhere."""
    stages = tuple(dataclasses.replace(s, recompute=Recompute.NONE, recompute_layers=None) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def same_view(plan: Plan) -> Plan:
    return plan


@dataclass(frozen=True, kw_only=True)
class MethodEstimate:
    """A method's prediction for one given plan (prediction/ranking experiments)."""

    time_ms: float
    peak_mem_mib: tuple[float, ...] | None  # None: no memory model
    feasible: bool  # by the method's own memory estimate (always True without one)
    score: float  # the method's ranking key (lower is better), before the feasibility rule


def _run_search(cluster, model, space, predictor, weights, top_k):
    try:
        return search(cluster, model, space, predictor, weights=weights, top_k=top_k), ""
    except InfeasibleError as exc:
        return None, str(exc)


@dataclass(frozen=True, kw_only=True)
class Planner:
    """A planner = recompute level sets searched × memory estimate × objective.

    `level_sets`: each tuple is searched separately with `space.recompute_levels` set to it, and the
    best pick over the sets wins. (("none",),) = no recompute; (("none",), ("full",)) = one uniform
    level for the whole plan; None = MemX's own per-stage levels (`space.recompute_levels`).
    `memory`: a factory gpus → MemoryModel (None: no memory model; "shared": the predictor's).
    `weights`: TIME_ONLY for the baselines, a profile for MemX ("space": the search YAML's).
    `view`: how the method sees a given plan when predicting it (prediction experiments).
    `distributed_optimizer` / `sequence_parallel`: the settings the original system can run (its paper /
    code, cited in each baseline's module); the planner searches the space's settings among them, or, when the
    space lists none of them, the original's own (a system without the distributed optimizer runs without it
    whatever the space lists). None: as the space lists them (MemX and its ablations).
    """

    name: str
    label: str
    level_sets: tuple[tuple[str, ...], ...] | None
    memory: Callable[[dict], MemoryModel] | str | None
    weights: str
    view: Callable[[Plan], Plan] = same_view
    doc: str = ""
    replica_groups: int = 1
    """> 1: also search plans of up to this many data-parallel replica groups (plan schema 2) with the
    planner's own memory estimate and objective (memx.planner.replica_search; issue #15), for the
    baselines whose originals search such forms (AMP, Metis). The faster of the two picks wins."""
    distributed_optimizer: tuple[bool, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    stage_data_parallel: bool = False
    """True: also search a dp per GPU type (issue #27, memx.planner.stage_dp_search) when the space asks for it
    (`SearchSpace.stage_data_parallel`), with the planner's own memory estimate and a time objective — for the
    baselines whose originals search per-stage dp (Metis)."""

    def job_options(self, space: SearchSpace) -> dict[str, tuple[bool, ...]]:
        """The `distributed_optimizer` / `sequence_parallel` settings this planner searches in `space`."""
        out = {}
        for name in ("distributed_optimizer", "sequence_parallel"):
            listed, original = getattr(space, name), getattr(self, name)
            out[name] = listed if original is None else tuple(v for v in listed if v in original) or original
        return out

    def predictor_for(self, cluster: Cluster, predictor: StagePredictor) -> StagePredictor:
        if self.memory == "shared":
            return predictor
        gpus = {g.name: g for g in cluster.gpu_types}
        return OwnMemory(predictor, None if self.memory is None else self.memory(gpus), name=self.name)

    def resolved_weights(self, space: SearchSpace) -> str:
        return space.weights if self.weights == "space" else self.weights

    def plan(self, cluster: Cluster, model: ModelArch, space: SearchSpace, predictor: StagePredictor, *,
             top_k: int = 10) -> Pick:
        """Run the planner; the pick is the lowest objective over all searched level sets."""
        t0 = time.perf_counter()
        pred = self.predictor_for(cluster, predictor)
        w_spec = self.resolved_weights(space)
        sets = self.level_sets or (space.recompute_levels,)
        results: list[SearchResult] = []
        notes = []
        for levels in sets:
            sp = dataclasses.replace(space, recompute_levels=tuple(levels), weights=w_spec,
                                     max_time_ratio=0.0 if w_spec == TIME_ONLY else space.max_time_ratio,
                                     **self.job_options(space))
            res, note = _run_search(cluster, model, sp, pred, w_spec, top_k)
            if res is not None:
                results.append(res)
            elif note:
                notes.append(f"{'/'.join(levels)}: {note}")
        configs = sum(r.space.evaluated for r in results)
        total = sum(r.space.total for r in results)
        if not results:
            return Pick(method=self.name, plan=None, predicted_time_ms=None, predicted_peak_mib=None,
                        search_s=time.perf_counter() - t0, configurations=configs, space_total=total,
                        note="; ".join(notes) or "no feasible plan")
        cands = _select(results, space)
        if self.replica_groups > 1:
            cands = self._with_groups(cands, cluster, model, space, pred, w_spec, sets)
        if self.stage_data_parallel and space.stage_data_parallel:
            cands = self._with_stage_dp(cands, cluster, model, space, pred, sets)
        best = cands[0]
        return Pick(method=self.name, plan=best.plan, predicted_time_ms=best.iteration_time_ms,
                    predicted_peak_mib=None if self.memory is None else tuple(best.peak_mem_mib),
                    search_s=time.perf_counter() - t0, configurations=configs, space_total=total,
                    note="; ".join(notes), candidates=cands)

    def _with_groups(self, cands: list[PlanMetrics], cluster: Cluster, model: ModelArch, space: SearchSpace,
                     pred: StagePredictor, w_spec: str, sets) -> list[PlanMetrics]:
        """The candidates with the best schema-2 plan first when it is faster (a time-only objective)."""
        best = None
        for levels in sets:
            sp = dataclasses.replace(space, recompute_levels=tuple(levels), weights=w_spec, max_time_ratio=0.0,
                                     max_replica_groups=self.replica_groups, **self.job_options(space))
            try:
                g = search_replicas(cluster, model, sp, pred, weights=w_spec).grouped
            except InfeasibleError:
                continue
            if g is not None and (best is None or g.iteration_time_ms < best.iteration_time_ms):
                best = g
        return [best, *cands] if best is not None and best.iteration_time_ms < cands[0].iteration_time_ms else cands

    def _with_stage_dp(self, cands: list[PlanMetrics], cluster: Cluster, model: ModelArch, space: SearchSpace,
                       pred: StagePredictor, sets) -> list[PlanMetrics]:
        """The candidates with the fastest feasible per-stage-dp plan first when it is faster (a time objective)."""
        best = None
        for levels in sets:
            sp = dataclasses.replace(space, recompute_levels=tuple(levels), **self.job_options(space))
            # its time objective: the fastest plan that fits (no floor), faster than the incumbent
            plan, _ = floor_then_fastest(cluster, model, sp, pred, (tuple(levels),), clear_below=-np.inf,
                                         fit_below=cands[0].iteration_time_ms)
            for e in estimate_plans([plan], cluster, model, pred, reserve_gib=space.reserve_gib,
                                    pipeline_assembly=space.pipeline_assembly) if plan else []:
                if e.feasible and (best is None or e.iteration_time_ms < best.iteration_time_ms):
                    best = e
        return [best, *cands] if best is not None and best.iteration_time_ms < cands[0].iteration_time_ms else cands

    def estimate(self, plans: Sequence[Plan], cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                 *, reserve_gib: float = 1.0, weights: Weights | None = None) -> list[MethodEstimate]:
        """The method's predictions for given plans and its ranking key (time, or Φ's log score)."""
        viewed = [self.view(p) for p in plans]
        est = estimate_plans(viewed, cluster, model, self.predictor_for(cluster, predictor), reserve_gib=reserve_gib)
        w = weights or parse_weights(self.weights if self.weights not in ("space", "auto", TIME_ONLY) else "default")
        out = []
        for e in est:
            score = (float(np.log(e.iteration_time_ms)) if self.weights == TIME_ONLY else
                     float(log_score(e.iteration_time_ms, e.max_mem_mib, e.mem_variance_mib2, w, EPSILON_MIB2)))
            out.append(MethodEstimate(time_ms=e.iteration_time_ms,
                                      peak_mem_mib=None if self.memory is None else tuple(e.peak_mem_mib),
                                      feasible=True if self.memory is None else e.feasible, score=score))
        return out


def _select(results: list[SearchResult], space: SearchSpace) -> list[PlanMetrics]:
    """Candidates of all searches, best first by the (median-free) log score of the searches' weights,
    within max_time_ratio of the overall fastest when the objective is Φ."""
    w = results[0].weights
    pool = {}
    for r in results:
        for c in (*r.top, *r.top_time, *r.pareto):
            pool[id(c)] = c
    cands = list(pool.values())
    if (w.w_mem, w.w_var) != (0.0, 0.0) and space.max_time_ratio > 0:
        fastest = min(c.iteration_time_ms for r in results for c in r.top_time)
        cands = [c for c in cands if c.iteration_time_ms <= space.max_time_ratio * fastest] or cands
    eps = results[0].epsilon_mib2
    key = [float(log_score(c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, w, eps)) for c in cands]
    order = np.argsort(key, kind="stable")
    seen, out = set(), []
    for i in order:
        k = cands[i].plan
        if k not in seen:
            seen.add(k)
            out.append(cands[i])
    return out
