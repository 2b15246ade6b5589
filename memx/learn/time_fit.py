"""The time part of a plan calibration (memx.learn.calibration): the uncalibrated estimates of n plans as arrays, the
calibrated iteration time T' they assemble to, and its robust least-squares fit.

    T' = (m − 1)·P(t'_s, c·2·p2p_s) + Σ_s t'_s + c·(T − S) + o + d·blocking_transfers(pp, m),
    t'_s = a_{g_s}·b_{tp_s}·t_s + e·L_s

(the module docstring of memx.learn.calibration says what each term stands for; P: memx.planner.schedule.
steady_period_ms, max_s where the loops are 0). e is a cost per layer and micro batch on each stage (L_s its layers):
the host dispatch, kernel launches and small-message latencies a layer pays whatever its size — what the closed
form's per-operator terms undercount on small, latency-bound layers (docs/results.md §The closed form on vTrain
single-node) and what none of a, c, o, d can stand for (a scales, o is paid once per iteration, d once per transfer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from memx.learn.peak_calibration import LOSS_SCALE
from memx.planner.metrics import PlanMetrics
from memx.planner.schedule import blocking_transfers, steady_period_ms

D_UNIT = 0.01  # d's parameter unit: 1 % of the median measured iteration per transfer
E_UNIT = 1e-3  # e's parameter unit: 0.1 % of the median measured iteration per layer and micro batch
TIME_KEYS = ("time_scale", "tp_time_scale", "comm_scale", "overhead_ms", "p2p_per_transfer_ms", "layer_overhead_ms")


@dataclass(frozen=True, kw_only=True)
class TimeBase:
    """The uncalibrated estimates of n plans as arrays (stages padded with 0 to the largest pp): stage times
    t (n, P), their layer counts, micro batches m, the assembly's p2p + tail terms T − S, blocking transfers, and
    each stage's GPU type and tp (None on padding) — so a fit evaluates T' for all plans at once."""

    t: np.ndarray
    layers: np.ndarray  # (n, P) L_s, 0 on padding
    m: np.ndarray
    rest: np.ndarray
    transfers: np.ndarray
    loop: np.ndarray  # (n, P − 1) 2·p2p_s in the steady-state loops (0: the paper's assembly, and on padding)
    gpu: list[list[str | None]]
    tp: list[list[int | None]]

    def index(self, keys, of: str) -> np.ndarray:
        """(n, P) positions of each stage's GPU type / tp in `keys` (len(keys) on padding: a neutral slot)."""
        rows = self.gpu if of == "gpu" else self.tp
        return np.asarray([[keys.get(x, len(keys)) for x in r] for r in rows], dtype=np.int64)


def time_base(est: list[PlanMetrics]) -> TimeBase:
    width = max((e.plan.pp for e in est), default=1)
    t, layers = np.zeros((len(est), width)), np.zeros((len(est), width))
    loop = np.zeros((len(est), max(width - 1, 0)))
    for i, e in enumerate(est):
        t[i, :e.plan.pp] = e.stage_time_ms
        layers[i, :e.plan.pp] = [st.layers for st in e.plan.stages]
        loop[i, :len(e.loop_p2p_ms)] = 2.0 * np.asarray(e.loop_p2p_ms)
    m, pad = np.asarray([e.plan.micro_batches for e in est], dtype=np.float64), [[None] * (width - e.plan.pp) for e in est]
    compute = (m - 1) * steady_period_ms(t.T, loop.T) + t.sum(axis=1)
    return TimeBase(t=t, layers=layers, m=m, rest=np.asarray([e.iteration_time_ms for e in est]) - compute, loop=loop,
                    transfers=np.asarray([blocking_transfers(e.plan.pp, e.plan.micro_batches) for e in est], dtype=np.float64),
                    gpu=[[st.gpu for st in e.plan.stages] + p for e, p in zip(est, pad)],
                    tp=[[st.tp for st in e.plan.stages] + p for e, p in zip(est, pad)])


def stage_times(b: TimeBase, a: np.ndarray, e: float = 0.0) -> np.ndarray:
    """t'_s = a_s·t_s + e·L_s per plan and stage (padding stays 0)."""
    return b.t * a + e * b.layers


def assembled(b: TimeBase, a: np.ndarray, c: float, o: float, d: float = 0.0, e: float = 0.0) -> np.ndarray:
    """T' of each plan from its base estimate (the module docstring; a: (n, P) stage-time multipliers, padding 0) —
    what memx.planner.schedule.Pipeline computes with the calibration."""
    t = stage_times(b, a, e)
    return (b.m - 1) * steady_period_ms(t.T, c * b.loop.T) + t.sum(axis=1) + c * b.rest + o + d * b.transfers


def fit_time(est: list[PlanMetrics], y: np.ndarray, ridge: float, per_tp: bool = False, per_transfer: bool = True,
             per_layer: bool = False) -> dict:
    """θ = (log a_g per type seen, [log b_tp per tp degree seen], log c, o / median y, [d / (median y · D_UNIT) ≥ 0],
    [e / (median y · E_UNIT) ≥ 0]); residuals: soft-L1 relative errors + ridge."""
    if not est:
        return {}
    b = time_base(est)
    types = sorted({st.gpu for e in est for st in e.plan.stages})
    tps = sorted({st.tp for e in est for st in e.plan.stages}) if per_tp else []
    idx, tdx = {g: j for j, g in enumerate(types)}, {t: j for j, t in enumerate(tps)}
    gi, ti = b.index(idx, "gpu"), b.index(tdx, "tp")
    scale = float(np.median(y))
    k, q = len(types), len(tps)
    n = k + q + 2 + int(per_transfer) + int(per_layer)
    at_d, at_e = k + q + 2, n - 1  # positions of d and e where fitted

    def d_of(theta: np.ndarray) -> float:
        return float(theta[at_d] * scale * D_UNIT) if per_transfer else 0.0

    def e_of(theta: np.ndarray) -> float:
        return float(theta[at_e] * scale * E_UNIT) if per_layer else 0.0

    def residuals(theta: np.ndarray) -> np.ndarray:
        a = np.append(np.exp(theta[:k]), 1.0)[gi] * np.append(np.exp(theta[k:k + q]), 1.0)[ti]
        pred = assembled(b, a, float(np.exp(theta[k + q])), float(theta[k + q + 1] * scale), d_of(theta), e_of(theta))
        return np.concatenate([(pred - y) / y, np.sqrt(ridge) * theta])

    lower, start = np.full(n, -np.inf), np.zeros(n)
    lower[k + q + 2:] = 0.0  # a transfer and a layer cost time: d, e ≥ 0
    start[k + q + 2:] = 1e-3  # strictly inside the bound: from the bound itself the bounded solver does not move
    th = least_squares(residuals, start, bounds=(lower, np.inf), loss="soft_l1", f_scale=LOSS_SCALE, x_scale="jac").x
    return {"time_scale": {g: float(np.exp(th[j])) for g, j in idx.items()},
            "tp_time_scale": {t: float(np.exp(th[k + j])) for t, j in tdx.items()}, "comm_scale": float(np.exp(th[k + q])),
            "overhead_ms": float(th[k + q + 1] * scale), "p2p_per_transfer_ms": d_of(th), "layer_overhead_ms": e_of(th)}


def time_parts(fit: dict, est: list[PlanMetrics]) -> tuple[list[np.ndarray], np.ndarray]:
    """(each plan's calibrated stage times t'_s, its T') under a time fit ({}: the identity)."""
    b = time_base(est)
    ts, tt = fit.get("time_scale", {}), fit.get("tp_time_scale", {})
    a = np.asarray([[ts.get(g, 1.0) if g is not None else 1.0 for g in r] for r in b.gpu])
    a = a * np.asarray([[tt.get(x, 1.0) if x is not None else 1.0 for x in r] for r in b.tp])
    e = fit.get("layer_overhead_ms", 0.0)
    T = assembled(b, a, fit.get("comm_scale", 1.0), fit.get("overhead_ms", 0.0), fit.get("p2p_per_transfer_ms", 0.0), e)
    t = stage_times(b, a, e)
    return [t[i, :p.plan.pp] for i, p in enumerate(est)], T


def time_predictions(fit: dict, est: list[PlanMetrics]) -> np.ndarray:
    """T' of each plan under a time fit ({}: the identity)."""
    return time_parts(fit, est)[1]


def time_errors(fit: dict, est: list[PlanMetrics], y: np.ndarray) -> np.ndarray:
    """|T' − y| / y of each plan under a time fit ({}: the identity)."""
    return np.abs(time_predictions(fit, est) - y) / y
