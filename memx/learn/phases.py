"""What a stage_runs row measured, and the backward model for forward-only rows (issue #16).

A row may say what its `time_ms` is (`phase`, docs/architecture.md §Measurement records):
- ``forward_backward`` (or no `phase` column / an empty value): one micro batch, forward + backward — the
  stage time every predictor returns;
- ``forward``: the forward pass only (AMP-style per-layer profiles); its stage time is forward × (1 + r)
  with r = backward / forward;
- ``iteration``: a whole iteration of `micro_batches` micro batches — a plan-level number, not a stage
  label; such rows are left out of stage training (memx.learn.model.training_rows).
Rows may also carry `forward_ms` and `backward_ms` (both measured): they give r directly.

r per recompute level: learned (median) from every row that measured both phases (forward_ms and
backward_ms, or a forward row paired with a forward_backward row of the same signature), else a documented
default:
- none: 2.0 — backward GEMMs cost twice the forward (Narayanan et al. 2021 §5.1, 6·params FLOPs per token
  of which 2 forward, 4 backward);
- full: 3.0 — the backward of a fully recomputed layer runs its forward once more (Chen et al. 2016;
  Narayanan 2021 §5.1 "8·params" with recomputation);
- selective: 2.0 × 13.2 / 11.9 ≈ 2.22 — Korthikanti et al. 2022 Table 4 (22B layer: backward 11.9 ms
  without recomputation, 13.2 ms with selective; ../shared/realdata/papers/korthikanti2022_table4_layer_time_22B.csv).
The stage time of a forward-only row is then uncertain by the ratio's spread: `time_band` gives the
multiplicative factors on (1 + r) — the 5th–95th percentile of learned ratios, or for a default ±25 %
on r (Korthikanti Table 4 measures r = 1.55 without recomputation where the FLOP count says 2.0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memx.domain.moe_records import MOE_DEFAULTS
from memx.planner.signatures import SIGNATURE_COLUMNS

FORWARD, FORWARD_BACKWARD, ITERATION = "forward", "forward_backward", "iteration"
PHASES = (FORWARD, FORWARD_BACKWARD, ITERATION)
DEFAULT_RATIO = {"none": 2.0, "full": 3.0, "selective": 2.0 * 13.2 / 11.9}
DEFAULT_SOURCE = {"none": "Narayanan 2021 §5.1", "full": "Narayanan 2021 §5.1 + one recomputed forward",
                  "selective": "Korthikanti 2022 Table 4"}
DEFAULT_RATIO_SPREAD = (0.75, 1.25)  # on r; see the module docstring
MIN_PAIRS = 3  # our choice: fewer measured ratios than this → the documented default


def phase_of(df: pd.DataFrame) -> np.ndarray:
    """The `phase` of each row (forward_backward where the column is absent or empty); ValueError names
    unknown values."""
    if "phase" not in df.columns:
        return np.full(len(df), FORWARD_BACKWARD, dtype=object)
    ph = df["phase"].astype("string").fillna(FORWARD_BACKWARD).replace("", FORWARD_BACKWARD).to_numpy(dtype=object)
    bad = sorted(set(ph) - set(PHASES))
    if bad:
        raise ValueError(f"stage_runs field 'phase': {bad}; allowed: {', '.join(PHASES)}")
    return ph


@dataclass(frozen=True, kw_only=True)
class BackwardModel:
    """backward / forward per recompute level, where each ratio came from, and its spread."""

    ratio: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIO))
    source: dict[str, str] = field(default_factory=lambda: {k: f"default ({v})" for k, v in DEFAULT_SOURCE.items()})
    spread: dict[str, list[float]] = field(default_factory=lambda: {k: list(DEFAULT_RATIO_SPREAD) for k in DEFAULT_RATIO})

    def factor(self, recompute: np.ndarray) -> np.ndarray:
        """1 + r per row: stage time / forward time."""
        return 1.0 + np.array([self.ratio.get(str(r), DEFAULT_RATIO["full"]) for r in recompute], dtype=np.float64)

    def time_band(self, level: str) -> tuple[float, float]:
        """Multiplicative factors on a stage time derived from a forward time at this recompute level."""
        r = self.ratio.get(level, DEFAULT_RATIO["full"])
        lo, hi = self.spread.get(level, DEFAULT_RATIO_SPREAD)
        return (1.0 + r * lo) / (1.0 + r), (1.0 + r * hi) / (1.0 + r)


def _measured_ratios(df: pd.DataFrame, phase: np.ndarray) -> pd.DataFrame:
    """(recompute, gpu, ratio) from rows with forward_ms and backward_ms, and from forward rows paired with a
    forward_backward row of the same signature."""
    parts = []
    if {"forward_ms", "backward_ms"} <= set(df.columns):
        f = pd.to_numeric(df["forward_ms"], errors="coerce")
        b = pd.to_numeric(df["backward_ms"], errors="coerce")
        ok = (f > 0) & (b > 0)
        parts.append(pd.DataFrame({"recompute": df.loc[ok, "recompute"].astype(str), "gpu": df.loc[ok, "gpu"].astype(str),
                                   "ratio": (b[ok] / f[ok]).to_numpy()}))
    fwd, fb = df[phase == FORWARD], df[phase == FORWARD_BACKWARD]
    if len(fwd) and len(fb):
        keys = [c for c in (*SIGNATURE_COLUMNS, *MOE_DEFAULTS) if c in df]  # a MoE stage's expert columns too (#27)
        k = lambda d: ["|".join(map(str, row)) for row in d.loc[:, keys].itertuples(index=False)]
        a = pd.DataFrame({"key": k(fwd), "f": pd.to_numeric(fwd["time_ms"], errors="coerce").to_numpy(),
                          "recompute": fwd["recompute"].astype(str).to_numpy(), "gpu": fwd["gpu"].astype(str).to_numpy()})
        b = pd.DataFrame({"key": k(fb), "fb": pd.to_numeric(fb["time_ms"], errors="coerce").to_numpy()})
        m = a.groupby("key").first().join(b.groupby("key")["fb"].median(), how="inner")
        m = m[(m["f"] > 0) & (m["fb"] > m["f"])]
        parts.append(pd.DataFrame({"recompute": m["recompute"], "gpu": m["gpu"], "ratio": (m["fb"] - m["f"]) / m["f"]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["recompute", "gpu", "ratio"])


def fit_backward(df: pd.DataFrame) -> BackwardModel:
    """Ratios learned from any GPU type that measured both phases; documented defaults for the rest."""
    base = BackwardModel()
    ratios = _measured_ratios(df, phase_of(df))
    ratio, source, spread = dict(base.ratio), dict(base.source), dict(base.spread)
    for level, grp in ratios.groupby("recompute"):
        r = grp["ratio"].to_numpy(np.float64)
        if len(r) < MIN_PAIRS:
            continue
        med = float(np.median(r))
        ratio[str(level)] = med
        source[str(level)] = f"learned: median of {len(r)} measured ratios on {', '.join(sorted(set(grp['gpu'])))}"
        spread[str(level)] = [float(np.quantile(r, 0.05)) / med, float(np.quantile(r, 0.95)) / med]
    return BackwardModel(ratio=ratio, source=source, spread=spread)


def stage_time_labels(df: pd.DataFrame, backward: BackwardModel) -> np.ndarray:
    """time_ms per row as a forward + backward stage time (forward rows × (1 + r); others as measured)."""
    t = pd.to_numeric(df["time_ms"], errors="coerce").to_numpy(np.float64)
    fwd = phase_of(df) == FORWARD
    if fwd.any():
        t = t.copy()
        t[fwd] = t[fwd] * backward.factor(df["recompute"].astype(str).to_numpy()[fwd])
    return t


def forward_only_gpus(df: pd.DataFrame) -> dict[str, list[str]]:
    """GPU type → recompute levels whose stage times come only from forward rows (their band widens)."""
    ph = phase_of(df)
    out: dict[str, list[str]] = {}
    for (g, r), grp in pd.DataFrame({"gpu": df["gpu"].astype(str), "rec": df["recompute"].astype(str), "ph": ph}
                                    ).groupby(["gpu", "rec"]):
        if (grp["ph"] == FORWARD).all():
            out.setdefault(str(g), []).append(str(r))
    return out
