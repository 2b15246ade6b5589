"""A layout ready to search: its stacked stage tables, per-stage layer caps, and the vectorised scoring of
a batch of its splits (step 1 fit, step 2 refine, log Φ) — the one evaluation every search path uses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from memx.domain.specs import Cluster, ModelArch, SearchSpace, Weights
from memx.planner.candidates import Scored
from memx.planner.compositions import count_splits
from memx.planner.objective import log_score
from memx.planner.predictions import PredictedTables
from memx.planner.recompute import fit, refine
from memx.planner.schedule import IDENTITY_ASSEMBLY, AssemblyCalibration, Pipeline, pipeline
from memx.planner.space import Layout, splits
from memx.planner.tables import LayoutTables, StackedTables, StageContext, StageTable


def layout_contexts(layouts: list[Layout], n_layers: int) -> dict[StageContext, int]:
    """Every stage context of the layouts, with the most layers any layout may give it."""
    out: dict[StageContext, int] = {}
    for lay in layouts:
        for c in lay.contexts():
            out[c] = max(out.get(c, 0), n_layers - lay.pp + 1)
    return out


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A layout, its stage tables (shared with every layout of the same contexts) and layer caps.

    The stacked LayoutTables (pp × layers × ladder floats) are built when needed and not kept, so the
    memory of a search does not grow with the number of layouts; `tables` caches them for callers
    that look at one layout (tests, benchmarks)."""

    lay: Layout
    stages: tuple[StageTable, ...]
    pipe: Pipeline
    hi: np.ndarray  # per-stage layer cap

    def build(self) -> LayoutTables:
        return LayoutTables.stack(list(self.stages), self.pipe)

    @cached_property
    def tables(self) -> LayoutTables:
        return self.build()

    def allowed(self, *, feasible: bool) -> np.ndarray:
        """(pp, rows) layer counts each stage may take: within the caps, and (feasible) fitting at some level
        (read-only: built once per layout, a search asks three times)."""
        return self._allowed[feasible]

    @cached_property
    def _allowed(self) -> tuple[np.ndarray, np.ndarray]:
        fit = np.stack([st.fit for st in self.stages])
        n = np.arange(fit.shape[1])
        ok = (n[None, :] >= 1) & (n[None, :] <= self.hi[:, None])
        out = (ok, ok & (fit >= 0))
        for a in out:
            a.flags.writeable = False
        return out

    def counts(self, total: int) -> tuple[int, int]:
        """(splits within the caps, feasible plans among them), exactly."""
        return count_splits(total, self.allowed(feasible=False)), count_splits(total, self.allowed(feasible=True))


def prepare(lay: Layout, pt: PredictedTables, cluster: Cluster, model: ModelArch, seq: int,
            slowdown: float, assembly: AssemblyCalibration = IDENTITY_ASSEMBLY) -> Prepared | None:
    return prepare_many([lay], pt, cluster, model, seq, slowdown, assembly)[0]


def prepare_many(lays: list[Layout], pt: PredictedTables, cluster: Cluster, model: ModelArch, seq: int,
                 slowdown: float, assembly: AssemblyCalibration = IDENTITY_ASSEMBLY) -> list[Prepared | None]:
    """`prepare` of every layout (None where a stage context has no table), the slowdown caps of all of them
    at once (`slowdown_caps_many`)."""
    found = []
    for lay in lays:
        ctxs = lay.contexts()
        stages = tuple(pt.tables.get(c) for c in ctxs)  # one lookup per stage context
        found.append(None if any(st is None for st in stages) else (ctxs, stages))
    live = [f[1] for f in found if f is not None]
    caps = iter(slowdown_caps_many(live, model.layers, slowdown) if slowdown > 0 and live else [None] * len(live))
    return [None if f is None else _prepared(lay, f[0], f[1], next(caps), pt, cluster, model, seq, assembly)
            for lay, f in zip(lays, found)]


def _prepared(lay: Layout, ctxs: tuple[StageContext, ...], stages: tuple[StageTable, ...], caps: np.ndarray | None,
              pt: PredictedTables, cluster: Cluster, model: ModelArch, seq: int, assembly: AssemblyCalibration) -> Prepared:
    cp = lay.context_parallel  # the rank-equivalent pipeline: dp·cp replicas of s/cp (memx.planner.context_parallel)
    pipe = pipeline(cluster, model, stage_gpus=lay.stage_gpus, stage_tp=lay.stage_tp, dp=lay.dp * cp,
                    micro_batch=lay.micro_batch, micro_batches=lay.micro_batches, seq_len=seq // cp, p2p_gbps=lay.p2p_gbps,
                    dp_gbps=lay.dp_gbps, p2p_latency_ms=lay.p2p_latency_ms, dp_latency_ms=lay.dp_latency_ms,
                    embedding_link=lay.embedding_link, distributed_optimizer=lay.distributed_optimizer,
                    assembly=assembly, virtual_stages=lay.virtual_stages, wrap_gbps=lay.wrap_gbps, precision=lay.precision,
                    expert_parallel=lay.expert_parallel, expert_links=lay.a2a_links)
    hi = np.array([pt.max_layers[c] for c in ctxs])
    if caps is not None:
        hi = np.minimum(hi, caps)
    return Prepared(lay=lay, stages=stages, pipe=pipe, hi=hi)


def slowdown_caps_many(layouts: list[tuple[StageTable, ...]], total: int, factor: float) -> list[np.ndarray]:
    """`_slowdown_caps` of many layouts, the same caps: the layouts whose stages hold no NaN and some finite time
    together — B* of each as the total-th smallest entry of its stages' envelopes (one np.partition over the
    layouts, missing stages and counts beyond a layout's entries +inf: then min(+inf, largest) is the largest
    fitted time, as `_slowdown_caps` takes it), each stage's cap the number of its envelope entries ≤ x (the
    envelope is non-decreasing: np.searchsorted's count); the others one by one."""
    plain = [i for i, stages in enumerate(layouts)
             if not any(st.fitted_summary[1] for st in stages) and any(st.fitted_summary[0] is not None for st in stages)]
    out: list[np.ndarray | None] = [None] * len(layouts)
    for i in set(range(len(layouts))) - set(plain):
        out[i] = _slowdown_caps(layouts[i], total, factor)
    if not plain:
        return out
    uniq: dict[int, int] = {}
    tables: list[StageTable] = []
    for i in plain:
        for st in layouts[i]:
            if id(st) not in uniq:
                uniq[id(st)] = len(tables)
                tables.append(st)
    env = np.stack([st.fitted_envelope[1:] for st in tables] + [np.full(len(tables[0].fitted_envelope) - 1, np.inf)])
    P = max(len(layouts[i]) for i in plain)
    idx = np.full((len(plain), P), len(tables))  # the +inf row for a missing stage
    largest = np.empty(len(plain))
    for r, i in enumerate(plain):
        idx[r, :len(layouts[i])] = [uniq[id(st)] for st in layouts[i]]
        largest[r] = max(st.fitted_summary[0] for st in layouts[i] if st.fitted_summary[0] is not None)
    E = env[idx]  # (layouts, P, n − 1)
    flat = E.reshape(len(plain), -1)
    kth = np.partition(flat, total - 1, axis=1)[:, total - 1] if total <= flat.shape[1] else np.full(len(plain), np.inf)
    x = np.minimum(kth, largest) * factor
    caps = np.maximum((E <= x[:, None, None]).sum(axis=2), 1)
    for r, i in enumerate(plain):
        out[i] = caps[r, :len(layouts[i])].astype(np.int64)
    return out


def _slowdown_caps(stages: tuple[StageTable, ...], total: int, factor: float) -> np.ndarray:
    """Per-stage layer caps: a stage whose fitted time exceeds factor × B* (B* = the smallest
    achievable bottleneck stage time of this layout) makes the plan ≥ factor× slower in the
    steady 1F1B phase than the balanced split; such splits are pruned before evaluation.
    From each context's fitted times, envelope and largest finite time (StageTable.fitted_envelope,
    fitted_summary: computed once per context, a search has many layouts per context)."""
    most = [st.fitted_summary[0] for st in stages]
    if all(m is None for m in most):
        return np.zeros(len(stages), dtype=np.int64)
    largest = max(m for m in most if m is not None)
    # The smallest B with Σ_s max{n : t_s(n) ≤ B} ≥ total: max{n : t_s(n) ≤ B} counts the n ≥ 1 whose suffix
    # minimum is ≤ B, so B is the total-th smallest suffix minimum (memx.planner.bounds.MinMax); the largest
    # fitted time when no B reaches total.
    env = np.sort(np.concatenate([st.fitted_envelope[1:] for st in stages]))
    x = (min(env[total - 1], largest) if total <= env.size else largest) * factor
    n = np.arange(len(stages[0].fit))
    caps = [n[st.fitted_ms <= x].max(initial=0) if st.fitted_summary[1]  # a NaN: the envelope does not order
            else int(np.searchsorted(st.fitted_envelope[1:], x, side="right")) for st in stages]
    return np.maximum(np.array(caps, dtype=np.int64), 1)


def chunks(prep: Prepared, total: int, chunk: int):
    """Every split within the caps, in lexicographic order, at most `chunk` rows at a time (memory
    bounded: a prefix of stage layer counts is fixed until the splits under it fit in one chunk)."""
    allowed = prep.allowed(feasible=False)

    def under(prefix: tuple[int, ...], left: int):
        s = len(prefix)
        if count_splits(left, allowed[s:, : left + 1]) <= chunk or s == prep.lay.pp - 1:
            S = splits(left, np.ones(prep.lay.pp - s, dtype=np.int64), prep.hi[s:])
            if len(S):
                yield np.concatenate([np.tile(np.asarray(prefix, dtype=np.int16), (len(S), 1)), S], axis=1)
            return
        for v in range(1, min(int(prep.hi[s]), left) + 1):
            yield from under(prefix + (v,), left - v)

    buf, size = [], 0
    for S in under((), total):
        buf.append(S)
        size += len(S)
        if size >= chunk:
            yield from _rechunk(np.concatenate(buf), chunk)
            buf, size = [], 0
    if buf:
        yield from _rechunk(np.concatenate(buf), chunk)


def _rechunk(S: np.ndarray, chunk: int):
    for i in range(0, len(S), chunk):
        yield S[i:i + chunk]


def score_splits(lt: LayoutTables, layout: int, S: np.ndarray, weights: Weights | None,
                 space: SearchSpace) -> Scored | None:
    """Step 1 and (with weights) step 2 and log Φ for splits S (N, pp) of one layout's tables; None when
    none is feasible."""
    return _scored(lt, lt.base(S), layout, S, weights, space)


def score_rows(st: StackedTables, layouts: np.ndarray, S: np.ndarray, weights: Weights | None,
               space: SearchSpace, keys: np.ndarray | None = None) -> Scored | None:
    """score_splits for splits of many layouts at once: S (N, st.pp) padded with 0, layouts (N,) indices
    into `st`; `keys` maps them to the layout keys of the search (default: the same). Same values."""
    sc = _scored(st, st.base(S, layouts), layouts, S, weights, space)
    if sc is None:
        return None
    li = sc.layout
    return dataclasses.replace(sc, layout=li if keys is None else keys[li], stages=st.stages[li])


def _scored(tables, base: np.ndarray, layout, S: np.ndarray, weights: Weights | None, space: SearchSpace):
    ok, base, a = fit(tables, base)
    if not ok.any():
        return None
    layout = layout[ok] if isinstance(layout, np.ndarray) else layout
    if weights is None:
        return Scored(layout=layout, splits=S[ok], assignment=a, score=None)
    a = refine(tables, base, a, weights, epsilon_mib2=space.epsilon_mib2, target_margin=space.target_margin)
    score = log_score(a.time_ms, a.stats.max_mib, a.stats.variance_mib2, weights, space.epsilon_mib2)
    return Scored(layout=layout, splits=S[ok], assignment=a, score=score, margin_high=tables.high_margin(base, a.level))
