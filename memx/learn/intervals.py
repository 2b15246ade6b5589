"""Prediction intervals of the stage predictor (issue #12 "Uncertainty").

Split-conformal (Vovk et al. 2005; Lei et al. 2018 "Distribution-free predictive inference for
regression" §2.2): on rows the model never trained on, the residual r = log(measured / predicted) of each
head; the interval is predicted × [exp(q_lo), exp(q_hi)] with q_lo, q_hi the finite-sample-corrected
α/2 and 1 − α/2 quantiles of r (α = 0.1 for the default 90 % interval). Residuals are taken in log space
because stage times and memories span three orders of magnitude and errors are relative.

Memory is conformalised on its dynamic part (issue #14): r = log((measured − static) / (predicted − static)),
with `static` the predictor's static memory (weights, gradients, optimizer states), and the interval is
static + (predicted − static) × [exp(q_lo), exp(q_hi)] (`Band.scale` "dynamic"). The distributed optimizer
changes the static part only (ZeRO-1 shards the optimizer states, Rajbhandari et al. 2020 §5.1; the learned
model applies it as an additive shift, memx.learn.model.prepare), so residuals learned on profile rows without
it stay exchangeable with plans that have it on; and activation errors, which grow with the micro batches
held in flight, are not diluted by a static part that differs between profile rows and plans. On the total
scale the band was too narrow for plans whose activations outweigh their profile rows' (coverage 83 % →
see docs/benchmarks.md §Interval coverage). Bands stored without a scale are "total" (older predictors).

A band is a pair of multiplicative factors (low ≤ 1 ≤ high) per head ("time", "memory") and per GPU
type, with GLOBAL for every type without its own. Where a head's number does not come from measured data
the band is a documented default instead (CLOSED_FORM_BANDS: memory from the closed form on a GPU type
without memory labels; UNPROFILED_BANDS: a GPU type never profiled), and `source` says which.

Group-conditional (Mondrian) memory bands (Vovk et al. 2005 §4.5 "Mondrian conformal predictors"; Romano
et al. 2019 "Conformalized quantile regression" §6 on conditional coverage): the held-out rows are split by
`memory_group` — the recompute level (full, including block recompute, or not) × micro batches in flight (1
or more) — and each group with MIN_RESIDUALS rows gets its own memory band, per GPU type where that type has
the rows, else pooled over types (GLOBAL); a group with fewer rows falls back to the plain per-type band.
Why: activation memory, and the predictor's error on it, grows with the micro batches held and with what full
recompute keeps (its checkpoints); plans hold up to pp micro batches on their first stages while most held-out
rows hold one, so one band per type, dominated by one-in-flight rows, was too narrow where plans need it
(docs/benchmarks.md §Interval coverage: 86 % on three-vendor-20). Within a group the usual split-conformal
guarantee holds for rows exchangeable with that group's held-out rows.

Plan level: the planner assembles stages into a plan (memx.planner.estimate); `bound_view(pred, "high")`
is a StagePredictor whose time and memory are the upper ends, so the same assembly gives the plan's upper
bound (comonotone stage errors: conservative when stage errors are independent). Feasibility and margins
should use `bound_view(pred, "high")` for memory (the planner's wiring; docs/predictor.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from memx.planner.signatures import CLOSED_FORM_BANDS  # noqa: F401  (defined beside the closed form; re-exported)

GLOBAL = "*"
HEADS = ("time", "memory")
COVERAGE = 0.9  # issue #12: the 90 % interval
MIN_RESIDUALS = 10  # our choice: fewer held-out rows than this → the documented default band
GROUPED_HEADS = ("memory",)  # heads with group-conditional bands (time covers ≥ 96 % per type already)


def memory_group(recompute: np.ndarray, inflight: np.ndarray) -> np.ndarray:
    """The Mondrian group of each stage signature (module docstring): "full" (full or block recompute) or
    "stored" (none, selective) × "inflight=1" or "inflight>1"."""
    rc = np.where(np.asarray(recompute).astype(str) == "full", "full", "stored")
    fl = np.where(np.asarray(inflight, dtype=np.int64) > 1, "inflight>1", "inflight=1")
    return np.char.add(np.char.add(rc.astype(str), ","), fl.astype(str))

# A GPU type never profiled (issue #16 "hardware added"): time from spec sheets scaled by what other types
# taught (memx.learn.unprofiled) — leave-one-type-out errors of 30–60 % in tests/unit/test_predictor.py.
UNPROFILED_BANDS = {"time": (0.5, 2.0), "memory": (0.7, 1.7)}


@dataclass(frozen=True, kw_only=True)
class Band:
    """Multiplicative factors around a prediction: [predicted × low, predicted × high]."""

    low: float
    high: float
    source: str  # "held-out residuals", "training rows (optimistic)", "closed form (default)", ...
    n: int = 0  # residuals it came from (0: a documented default)
    scale: str = "total"  # SCALES: the factors multiply the prediction, or its part above the static memory

    def widened(self, low: float, high: float, why: str) -> Band:
        """Another independent multiplicative uncertainty on top (conservative: factors multiply)."""
        return Band(low=self.low * low, high=self.high * high, source=f"{self.source} + {why}", n=self.n,
                    scale=self.scale)


SCALES = ("total", "dynamic")  # Band.scale: on the prediction, or on prediction − static memory (memory only)


@dataclass(frozen=True, kw_only=True)
class Intervals:
    """Bands per GPU type (GLOBAL for the rest) and head; `coverage` is the nominal level."""

    coverage: float = COVERAGE
    bands: dict[str, dict[str, Band]] = field(default_factory=dict)
    # group-conditional bands, "gpu|head|group" (gpu GLOBAL: pooled over types); empty for older predictors
    grouped: dict[str, Band] = field(default_factory=dict)
    fixed: frozenset[str] = frozenset()  # "gpu|head" set by with_gpu: a documented band, no group band applies

    def band(self, gpu: str, head: str, group: str | None = None) -> Band:
        """The band of a GPU type and head; with `group`, its group's band where one was fitted (per type,
        then pooled), else the per-type band."""
        if group is not None and f"{gpu}|{head}" not in self.fixed:
            for key in (f"{gpu}|{head}|{group}", f"{GLOBAL}|{head}|{group}"):
                if key in self.grouped:
                    return hull(self.grouped[key], self.band(gpu, head))
        per = self.bands.get(gpu) or {}
        if head in per:
            return per[head]
        glob = self.bands.get(GLOBAL) or {}
        return glob.get(head) or default_band(head)

    def with_gpu(self, gpu: str, head: str, band: Band) -> Intervals:
        bands = {k: dict(v) for k, v in self.bands.items()}
        bands.setdefault(gpu, {})[head] = band
        return replace(self, bands=bands, fixed=self.fixed | {f"{gpu}|{head}"})

    def to_json(self) -> dict[str, Any]:
        out = {"coverage": self.coverage,
               "bands": {g: {h: vars(b) for h, b in sorted(per.items())} for g, per in sorted(self.bands.items())}}
        if self.grouped:  # absent without groups: the JSON (and version hash) of ungrouped predictors is unchanged
            out["grouped"] = {k: vars(b) for k, b in sorted(self.grouped.items())}
        return out


def hull(a: Band, b: Band) -> Band:
    """The smallest band holding both (same scale)."""
    return Band(low=min(a.low, b.low), high=max(a.high, b.high), source=f"{a.source} ∪ {b.source}", n=a.n, scale=a.scale)


def intervals_from_json(meta: Mapping[str, Any] | None) -> Intervals | None:
    if meta is None:
        return None
    return Intervals(coverage=float(meta["coverage"]),
                     bands={g: {h: Band(**b) for h, b in per.items()} for g, per in meta["bands"].items()},
                     grouped={k: Band(**b) for k, b in (meta.get("grouped") or {}).items()})


def default_band(head: str) -> Band:
    lo, hi = CLOSED_FORM_BANDS[head]
    return Band(low=lo, high=hi, source="closed form (default)")


def conformal_band(log_residuals: np.ndarray, coverage: float, source: str, scale: str = "total") -> Band | None:
    """Split-conformal factors from log residuals (Lei et al. 2018 §2.2: the ⌈(n+1)(1−α/2)⌉-th order
    statistic for the upper end, the ⌊(n+1)α/2⌋-th for the lower); None below MIN_RESIDUALS."""
    r = np.sort(np.asarray(log_residuals, dtype=np.float64)[np.isfinite(log_residuals)])
    n = len(r)
    if n < MIN_RESIDUALS:
        return None
    alpha = 1.0 - coverage
    k_hi = min(math.ceil((n + 1) * (1.0 - alpha / 2.0)), n)
    k_lo = max(math.floor((n + 1) * alpha / 2.0), 1)
    lo, hi = min(float(r[k_lo - 1]), 0.0), max(float(r[k_hi - 1]), 0.0)
    return Band(low=math.exp(lo), high=math.exp(hi), source=source, n=n, scale=scale)


def _dynamic(mem_mib: np.ndarray, static_mem_mib: np.ndarray) -> np.ndarray:
    """Memory above the static part, MiB, at least MIN_DYNAMIC_MIB (a peak at or below the static estimate is
    an error of the static estimate; the floor keeps its log residual finite and large)."""
    return np.maximum(np.asarray(mem_mib, np.float64) - np.asarray(static_mem_mib, np.float64), MIN_DYNAMIC_MIB)


MIN_DYNAMIC_MIB = 1.0  # our choice: 1 MiB, far below any stage's activations


def fit_intervals(gpu: np.ndarray, pred_time_ms: np.ndarray, time_ms: np.ndarray, pred_mem_mib: np.ndarray,
                  mem_mib: np.ndarray, *, coverage: float = COVERAGE, source: str = "held-out residuals",
                  static_mem_mib: np.ndarray | None = None, group: np.ndarray | None = None) -> Intervals:
    """GLOBAL bands from every held-out row, per-GPU bands where a type has MIN_RESIDUALS rows of its own.
    With `static_mem_mib` (the predictor's static memory per row) memory is conformalised on its dynamic part
    (scale "dynamic", module docstring); without it on the total (the paper's, scale "total"). With `group`
    (memory_group of each row) the GROUPED_HEADS also get group-conditional bands (Mondrian, module docstring)."""
    gpu = np.asarray(gpu).astype(str)
    if static_mem_mib is None:
        mem_res, mem_scale = np.log(mem_mib / pred_mem_mib), "total"
    else:
        mem_res = np.log(_dynamic(mem_mib, static_mem_mib) / _dynamic(pred_mem_mib, static_mem_mib))
        mem_scale = "dynamic"
    res = {"time": np.log(time_ms / pred_time_ms), "memory": mem_res}
    scale = {"time": "total", "memory": mem_scale}
    bands: dict[str, dict[str, Band]] = {GLOBAL: {}}
    for head, r in res.items():
        b = conformal_band(r, coverage, source, scale[head])
        if b is not None:
            bands[GLOBAL][head] = b
        for g in np.unique(gpu):
            bg = conformal_band(r[gpu == g], coverage, source, scale[head])
            if bg is not None:
                bands.setdefault(str(g), {})[head] = bg
    grouped: dict[str, Band] = {}
    if group is not None:
        group = np.asarray(group).astype(str)
        for head in GROUPED_HEADS:
            for k in np.unique(group):
                sel = group == k
                for g, rows in [(GLOBAL, sel)] + [(str(t), sel & (gpu == t)) for t in np.unique(gpu)]:
                    b = conformal_band(res[head][rows], coverage, f"{source}, group {k}", scale[head])
                    if b is not None:
                        grouped[f"{g}|{head}|{k}"] = b
    return Intervals(coverage=coverage, bands=bands, grouped=grouped)


def interval_columns(intervals: Intervals | None, gpu: np.ndarray, time_ms: np.ndarray,
                     mem_mib: np.ndarray, static_mem_mib: np.ndarray | None = None,
                     group: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """INTERVAL_COLUMNS for predictions of the given rows (documented defaults without intervals). A memory
    band of scale "dynamic" applies to mem − static (`static_mem_mib`, 0 where not given): static + (mem −
    static) × factor. `group` (memory_group per row): group-conditional bands where fitted."""
    iv = intervals or Intervals()
    names = np.asarray(gpu).astype(str)
    groups = np.full(len(names), "") if group is None else np.asarray(group).astype(str)
    keys = np.char.add(np.char.add(names, "\x00"), groups)
    uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    picked = {h: [iv.band(names[i], h, groups[i] or None) for i in first] for h in HEADS}
    f = {(h, e): np.array([getattr(b, e) for b in picked[h]])[inv] if len(uniq) else np.ones(0)
         for h in HEADS for e in ("low", "high")}
    dyn = np.array([b.scale == "dynamic" for b in picked["memory"]], dtype=bool)[inv] if len(uniq) \
        else np.zeros(0, dtype=bool)
    mem = np.asarray(mem_mib, np.float64)
    base = np.where(dyn, np.zeros_like(mem) if static_mem_mib is None else np.minimum(static_mem_mib, mem), 0.0)
    return {"time_ms_low": time_ms * f["time", "low"], "time_ms_high": time_ms * f["time", "high"],
            "peak_mem_mib_low": base + (mem - base) * f["memory", "low"],
            "peak_mem_mib_high": base + (mem - base) * f["memory", "high"]}


def widened(out: pd.DataFrame, rows: np.ndarray, head: str) -> pd.DataFrame:
    """`out` with the `head` ("time" or "memory") band of `rows` widened to at least the closed form's documented
    band (CLOSED_FORM_BANDS) around the prediction: for predictions that rest on a transfer through the closed
    form (an option or micro batch the profiles did not cover, memx.learn.model)."""
    col = "time_ms" if head == "time" else "peak_mem_mib"
    if not np.any(rows) or f"{col}_low" not in out.columns:
        return out
    lo, hi = CLOSED_FORM_BANDS[head]
    mid = out.loc[rows, col].to_numpy(np.float64)
    out = out.copy()
    out.loc[rows, f"{col}_low"] = np.minimum(out.loc[rows, f"{col}_low"].to_numpy(np.float64), mid * lo)
    out.loc[rows, f"{col}_high"] = np.maximum(out.loc[rows, f"{col}_high"].to_numpy(np.float64), mid * hi)
    return out


@dataclass(frozen=True, kw_only=True)
class BoundView:
    """A StagePredictor whose time and memory are one end of `inner`'s interval ("low" or "high"), so the
    planner's own assembly gives plan-level bounds."""

    inner: Any
    end: str = "high"

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', type(self.inner).__name__)}[{self.end}]"

    def predict_columns(self, cols) -> pd.DataFrame:
        """`predict` on the search's numpy columns, a MoE stage's expert columns kept (memx.learn.experts)."""
        from memx.learn.experts import predict_columns  # memx.learn.experts imports the planner; this module need not

        return predict_columns(self, cols)

    def nic_efficiency(self, gpu_types) -> float | None:
        from memx.planner.network import nic_figure  # as predict_columns

        return nic_figure(self.inner, gpu_types)  # one end of `inner`'s interval: its network (memx.planner.network)

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.inner.predict(sigs)
        return pd.DataFrame({"time_ms": out[f"time_ms_{self.end}"], "peak_mem_mib": out[f"peak_mem_mib_{self.end}"],
                             "static_mem_mib": out["static_mem_mib"]}, index=out.index)


def bound_view(predictor: Any, end: str = "high") -> BoundView:
    if end not in ("low", "high"):
        raise ValueError(f"end {end!r}; allowed: low, high")
    return BoundView(inner=predictor, end=end)


def layered(intervals: Intervals | None, *, closed_form_memory: list[str], forward_time: Mapping[str, tuple[float, float]],
            unprofiled: list[str]) -> Intervals:
    """The bands a prediction uses: conformal (or default) bands, then per GPU type the documented band
    where a head's number is not learned from its own measurements (closed-form memory; a type never
    profiled), and the backward model's spread on time derived from forward-only rows (memx.learn.phases)."""
    iv = intervals or Intervals()
    for g in closed_form_memory:
        iv = iv.with_gpu(g, "memory", default_band("memory"))
    for g, (lo, hi) in forward_time.items():
        iv = iv.with_gpu(g, "time", iv.band(g, "time").widened(lo, hi, "backward/forward ratio"))
    for g in unprofiled:
        for head, (lo, hi) in UNPROFILED_BANDS.items():
            iv = iv.with_gpu(g, head, Band(low=lo, high=hi, source="unprofiled GPU type (documented default)"))
    return iv
