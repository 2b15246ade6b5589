"""Plan residual: a boosted-tree correction of the calibrated iteration time, learned from measured plans
(issue #16; docs/architecture.md §Plan calibration).

The parametric calibration (memx.learn.calibration: a_g, b_tp, c, o, d) corrects the terms of the 1F1B
assembly that a handful of plans can pin down. With many measured plans (a platform team's history, vTrain's
180 per model) what is left is structured — a kernel that is slower at one per-rank GEMM size, a pipeline
depth whose send/recv costs more than d — and a regression on the plan's shape can learn it ("Δ-learning":
a learned model of the residual of a physical model, as in Ipek et al., ASPLOS 2006, and the hybrid
analytical + learned cost models of Kaufman et al., MLSys 2021):

    T'' = T' · exp(r(x)),   r: gradient-boosted trees (Chen & Guestrin 2016) on log(measured / T'),

with x the plan's shape and its calibrated estimate (FEATURES): log₂ of pp, micro batches m, dp, micro batch
and the bottleneck stage's tp; the bottleneck stage's time per layer and sample (a proxy for its GEMM sizes
that exists for any model); the communication share (T' − S)/T' and the bubble share (pp − 1)/(m + pp − 1)
(Narayanan et al. 2021 §2.2.1); log T'. No model name, hidden size or GPU-type identity: the features are
defined for any plan of any model, so a residual learned on some models applies to another.

Model selection and guard: the depth and number of rounds come from GRID by cross-validation over the
measured plans only — grouped by `groups` (e.g. one group per model) when there are at least three, else
CV_FOLDS folds by plan — and the residual is kept only when the chosen setting's held-out error is at least
10 % below the error of T' on the same plans (memx.learn.guard, as the parametric parts; T' there is fitted on those
very plans, so the comparison favours *not* keeping the residual). Below MIN_RESIDUAL_PLANS timed plans
nothing is fitted: with a few dozen plans a tree ensemble chases noise (bench/learning_curve.py).

Where it applies: plan-level scores only — `estimate_plans` (evaluate, rank, --check, the experiments) and the
search's kept candidates (memx.planner.metrics.corrected_plans: the branch-and-bound ranks with T', then the
kept top-k candidates are re-scored with T'' and re-ranked). A schema-2 plan (replica groups) is estimated group
by group, so each group gets it as the pipeline it is; its cross-group exchange is not corrected, and
`PlanResidual.correct` leaves a schema-2 PlanMetrics as it is. Stored as data: the booster's UBJ bytes, base64
in calibration.json (memx.pipeline.registry checks its sha256 before parsing).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from memx.domain.plan import Plan
from memx.learn.guard import Guard
from memx.planner.metrics import PlanMetrics

FEATURES = ("log2_pp", "log2_micro_batches", "log2_dp", "log2_micro_batch", "log2_bottleneck_tp",
            "log_bottleneck_ms_per_layer_sample", "comm_share", "bubble_share", "log_time_ms")
GRID = tuple((depth, rounds) for depth in (2, 4, 6) for rounds in (150, 400))  # (max_depth, boosting rounds)
LEARNING_RATE = 0.05
SUBSAMPLE = 0.8
MIN_RESIDUAL_PLANS = 40  # fewer timed plans: no residual (bench/learning_curve.py, docs/results.md §9)
CV_FOLDS = 5


@dataclass(frozen=True, kw_only=True)
class PlanResidual:
    """A fitted plan residual r(x) (its cross-validation: the Guard fit_residual returns with it)."""

    booster_ubj: bytes = field(repr=False)  # xgboost Booster.save_raw("ubj"): data, never code
    max_depth: int
    rounds: int
    plans: int  # timed plans it was fitted on

    def factors(self, plans: Sequence[Plan], stage_ms: Sequence[Sequence[float]], time_ms: np.ndarray) -> np.ndarray:
        """exp(r(x)) of each plan from its calibrated stage times and iteration time."""
        return np.exp(_predict(_load(self.booster_ubj), features(plans, stage_ms, time_ms)))

    def correct(self, metrics: Sequence[PlanMetrics]) -> list[PlanMetrics]:
        """The metrics with iteration_time_ms × exp(r(x)) on schema-1 plans; schema-2 ones unchanged."""
        idx = [i for i, m in enumerate(metrics) if isinstance(m.plan, Plan)]
        out = list(metrics)
        if not idx:
            return out
        sel = [metrics[i] for i in idx]
        f = self.factors([m.plan for m in sel], [m.stage_time_ms for m in sel],
                         np.asarray([m.iteration_time_ms for m in sel], float))
        for i, k in zip(idx, f):
            out[i] = replace(metrics[i], iteration_time_ms=float(metrics[i].iteration_time_ms * k))
        return out

    def to_dict(self) -> dict:
        return {"booster_ubj_base64": base64.b64encode(self.booster_ubj).decode("ascii"), "max_depth": self.max_depth,
                "rounds": self.rounds, "plans": self.plans, "features": list(FEATURES)}


def residual_from_dict(d) -> PlanResidual:
    """The inverse of PlanResidual.to_dict (KeyError / ValueError / TypeError on anything else: the caller names
    the file). Refuses a residual trained on other features."""
    if list(d["features"]) != list(FEATURES):
        raise ValueError(f"residual features {d['features']} are not {list(FEATURES)}")
    return PlanResidual(booster_ubj=base64.b64decode(d["booster_ubj_base64"], validate=True), max_depth=int(d["max_depth"]),
                        rounds=int(d["rounds"]), plans=int(d["plans"]))


def features(plans: Sequence[Plan], stage_ms: Sequence[Sequence[float]], time_ms: np.ndarray) -> np.ndarray:
    """(n, len(FEATURES)) for schema-1 plans with their calibrated stage times (one micro batch, forward +
    backward) and iteration times; S = (m − 1)·max t + Σ t is the estimate's stage part (paper §3.1.2)."""
    rows = []
    for p, t, T in zip(plans, stage_ms, np.asarray(time_ms, float)):
        t = np.asarray(t, float)
        b = int(t.argmax())
        m = p.micro_batches
        stage_part = (m - 1) * t[b] + t.sum()
        rows.append((np.log2(p.pp), np.log2(m), np.log2(p.dp), np.log2(p.micro_batch), np.log2(p.stages[b].tp),
                     np.log(t[b] / p.stages[b].layers / p.micro_batch), (T - stage_part) / T,
                     (p.pp - 1) / (m + p.pp - 1), np.log(T)))
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURES))


def fit_residual(plans: Sequence[Plan], stage_ms: Sequence[Sequence[float]], time_ms: np.ndarray, measured_ms: np.ndarray,
                 *, groups: Sequence[str] | None = None, seed: int = 0) -> tuple[PlanResidual, Guard] | None:
    """The residual of T' (time_ms) against measured_ms, GRID setting by cross-validation, and that setting's
    Guard (base: T' on the same plans); None below MIN_RESIDUAL_PLANS plans. The caller keeps it only when the
    guard is `accepted`."""
    n = len(plans)
    if n < MIN_RESIDUAL_PLANS:
        return None
    X, y = features(plans, stage_ms, time_ms), np.log(np.asarray(measured_ms, float) / np.asarray(time_ms, float))
    folds = _folds(n, groups, seed)
    best = None
    for depth, rounds in GRID:
        held = np.zeros(n)
        for test in folds:
            train = np.setdiff1d(np.arange(n), test)
            held[test] = _predict(_train(X[train], y[train], depth, rounds, seed), X[test])
        err = float(np.mean(np.abs(np.exp(held + np.log(time_ms)) - measured_ms) / measured_ms))
        if best is None or err < best[0]:
            best = (err, depth, rounds)
    err, depth, rounds = best
    base = float(np.mean(np.abs(np.asarray(time_ms) - measured_ms) / measured_ms))
    booster = _train(X, y, depth, rounds, seed)
    return (PlanResidual(booster_ubj=bytes(booster.save_raw("ubj")), max_depth=depth, rounds=rounds, plans=n),
            Guard(base_mape=base, cv_mape=err, folds=len(folds)))


def _folds(n: int, groups: Sequence[str] | None, seed: int) -> list[np.ndarray]:
    """One fold per group when there are ≥ 3 groups (a held-out model is the case a new job meets), else
    CV_FOLDS folds by plan after a fixed shuffle."""
    if groups is not None and len(set(groups)) >= 3:
        g = np.asarray(list(groups), dtype=object)
        return [np.flatnonzero(g == k) for k in sorted(set(groups))]
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[f::CV_FOLDS]) for f in range(CV_FOLDS)]


def _train(X: np.ndarray, y: np.ndarray, depth: int, rounds: int, seed: int):
    import xgboost as xgb  # heavy: only when a residual is fitted or applied

    params = {"objective": "reg:squarederror", "max_depth": depth, "eta": LEARNING_RATE, "subsample": SUBSAMPLE,
              "tree_method": "hist", "seed": seed, "nthread": 1}  # one thread: the same trees on every machine
    return xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=rounds)


def _load(raw: bytes):
    import xgboost as xgb

    b = xgb.Booster()
    b.load_model(bytearray(raw))
    return b


def _predict(booster, X: np.ndarray) -> np.ndarray:
    import xgboost as xgb

    return booster.predict(xgb.DMatrix(X))
