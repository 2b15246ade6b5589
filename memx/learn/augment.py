"""R²-gated linear interpolation inside measured intervals (paper §3.2 "estimate much").

1. Gate: for every dense interval in the profile (rows tagged ``design:dense:<param>``: 5–7 points of one
   parameter on one representative GPU type, everything else fixed), fit a line of the gated target
   against the parameter. Interpolation of that parameter is allowed inside the interval only when
   R² > threshold (paper: 0.95). A failing interval is narrowed (the widest run of ≥ 3 consecutive dense
   points that passes) or, failing that, skipped. The table of R² values is part of the result.
2. Generate: in every group of measured rows that differ only in a gated parameter, new rows are
   interpolated linearly between neighbouring measured values, strictly inside the allowed interval —
   never beyond a measured point. They carry ``source = "interpolated"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memx.domain.moe_records import MOE_DEFAULTS, moe_derived
from memx.domain.records import with_record_defaults
from memx.planner.signatures import SIGNATURE_COLUMNS

# What each parameter is gated on (paper §3.2: layers vs memory and micro batch vs throughput are
# nearly linear; sequence length vs iteration time is superlinear, R² 0.78).
GATED = {"layers": "peak_mem_mib", "micro_batch": "time_ms", "seq_len": "time_ms"}
R2_THRESHOLD = 0.95  # paper §3.2
MIN_POINTS = 3  # our choice: a line through fewer points says nothing
TARGETS = ("time_ms", "peak_mem_mib", "static_mem_mib")
INTERPOLATED = "interpolated"


@dataclass(frozen=True, kw_only=True)
class AugmentResult:
    stage_runs: pd.DataFrame  # measured rows followed by interpolated rows
    gates: pd.DataFrame  # param, target, gpu, lo, hi, points, r2, allowed_lo, allowed_hi, passed, note
    rows_before: int
    rows_after: int

    @property
    def growth(self) -> float:
        return self.rows_after / max(self.rows_before, 1)


def r_squared(x: np.ndarray, y: np.ndarray) -> float:
    """Coefficient of determination of the least-squares line y ≈ a + b·x."""
    if len(x) < 2 or np.ptp(x) == 0:
        return float("nan")
    b, a = np.polyfit(x, y, 1)
    ss_res = float(np.sum((y - (a + b * x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 if ss_tot == 0 else 1.0 - ss_res / ss_tot


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if "status" not in df.columns:
        return df
    return df[df["status"].fillna("ok").astype(str) == "ok"]


def _widest_passing(x: np.ndarray, y: np.ndarray, threshold: float) -> tuple[float, float] | None:
    """The widest run of ≥ MIN_POINTS consecutive points (sorted by x) whose line passes the gate."""
    n = len(x)
    for width in range(n - 1, MIN_POINTS - 1, -1):
        best = None
        for i in range(n - width + 1):
            if r_squared(x[i:i + width], y[i:i + width]) > threshold:
                span = (float(x[i]), float(x[i + width - 1]))
                best = best if best and best[1] - best[0] >= span[1] - span[0] else span
        if best:
            return best
    return None


def interpolation_gates(stage_runs: pd.DataFrame, *, r2_threshold: float = R2_THRESHOLD) -> pd.DataFrame:
    """The R² table: one row per dense interval found in `source`."""
    rows = []
    src = stage_runs.get("source", pd.Series("", index=stage_runs.index)).fillna("").astype(str)
    for param, target in GATED.items():
        dense = _ok(stage_runs[src == f"design:dense:{param}"])
        dense = dense[np.isfinite(pd.to_numeric(dense[target], errors="coerce"))]
        if dense.empty:
            continue
        for gpu, grp in dense.groupby("gpu", sort=True):
            pts = grp.groupby(param)[target].mean().sort_index()
            x, y = pts.index.to_numpy(dtype=float), pts.to_numpy(dtype=float)
            r2 = r_squared(x, y)
            row = {"param": param, "target": target, "gpu": str(gpu), "lo": x.min(), "hi": x.max(), "points": len(x),
                   "r2": r2, "allowed_lo": np.nan, "allowed_hi": np.nan, "passed": False, "note": "skipped"}
            if len(x) >= MIN_POINTS and r2 > r2_threshold:
                row.update(allowed_lo=x.min(), allowed_hi=x.max(), passed=True, note="whole interval")
            elif len(x) >= MIN_POINTS and (span := _widest_passing(x, y, r2_threshold)):
                row.update(allowed_lo=span[0], allowed_hi=span[1], passed=True, note="narrowed")
            rows.append(row)
    cols = ["param", "target", "gpu", "lo", "hi", "points", "r2", "allowed_lo", "allowed_hi", "passed", "note"]
    return pd.DataFrame(rows, columns=cols)


def _new_values(x0: float, x1: float, max_new: int) -> np.ndarray:
    """Integer values strictly between two measured neighbours, at most max_new, evenly spread."""
    inner = np.arange(int(x0) + 1, int(x1))
    if len(inner) <= max_new:
        return inner
    return np.unique(np.round(np.linspace(x0, x1, max_new + 2)[1:-1]).astype(int))


def _interpolate_param(measured: pd.DataFrame, param: str, lo: float, hi: float, max_new: int) -> list[pd.DataFrame]:
    keys = [c for c in (*SIGNATURE_COLUMNS, *MOE_DEFAULTS) if c != param]  # a MoE stage's expert columns too (#27)
    frame = measured.assign(recompute_layers=measured["recompute_layers"].astype("Float64").fillna(-1.0))
    out = []
    for _, grp in frame.groupby(keys, sort=False, dropna=False):
        pts = grp.groupby(param)[list(TARGETS)].mean().sort_index()
        xs = pts.index.to_numpy(dtype=float)
        for (x0, x1), (_, r0), (_, r1) in zip(zip(xs[:-1], xs[1:]), pts.iloc[:-1].iterrows(), pts.iloc[1:].iterrows()):
            if x0 < lo or x1 > hi:
                continue
            new = _new_values(x0, x1, max_new)
            if not len(new):
                continue
            w = (new - x0) / (x1 - x0)
            rows = pd.DataFrame([grp.iloc[0]] * len(new)).reset_index(drop=True)
            rows[param] = new.astype(np.int64)
            for t in TARGETS:
                rows[t] = (1 - w) * float(r0[t]) + w * float(r1[t])  # NaN stays NaN (time-only rows)
            out.append(rows)
    return out


def augment(stage_runs: pd.DataFrame, *, r2_threshold: float = R2_THRESHOLD, max_new_per_gap: int = 6) -> AugmentResult:
    """Gate, then interpolate; `max_new_per_gap` (our choice) bounds growth to the paper's 5–10×."""
    stage_runs = with_record_defaults(stage_runs)  # older tables: option columns at their defaults
    gates = interpolation_gates(stage_runs, r2_threshold=r2_threshold)
    measured = _ok(stage_runs)
    measured = measured[pd.to_numeric(measured["time_ms"], errors="coerce") > 0]
    parts = []
    for param, grp in gates.loc[gates["passed"].astype(bool)].groupby("param"):
        lo, hi = float(grp["allowed_lo"].min()), float(grp["allowed_hi"].max())
        parts += _interpolate_param(measured, str(param), lo, hi, max_new_per_gap)
    out = stage_runs
    if parts:
        new = pd.concat(parts, ignore_index=True)
        new["recompute_layers"] = new["recompute_layers"].astype("Float64").replace(-1.0, pd.NA).astype("Int64")
        new = new.assign(source=INTERPOLATED, status="ok", reason="", **moe_derived(new))  # tokens per expert
        key = [*SIGNATURE_COLUMNS, *MOE_DEFAULTS]
        seen = set(map(tuple, measured[key].astype(str).to_numpy()))
        new = new[[tuple(r) not in seen for r in new[key].astype(str).to_numpy()]]
        new = new.drop_duplicates(subset=key)
        out = pd.concat([stage_runs, new.astype(stage_runs.dtypes.to_dict(), errors="ignore")], ignore_index=True)
    return AugmentResult(stage_runs=out, gates=gates, rows_before=len(stage_runs), rows_after=len(out))
