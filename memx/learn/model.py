"""The learned stage predictor: a calibrated analytic prior × a dual-output XGBoost correction.

Variants (all implement `memx.planner.signatures.StagePredictor`; `fit_variants` trains them on the same rows
and `select` keeps the one with the lowest held-out error):
- ``xgb``: trees on log(time), log(memory) directly (features include the analytic answer);
- ``hybrid``: trees on log(measured / analytic) — analytic prior × learned correction;
- ``calibrated``: the prior alone — per GPU type, non-negative weights of the physical time and memory
  bases (memx.learn.features), fitted by NNLS on relative error; linear in layers, recomputed layers
  and in-flight micro batches, so it extrapolates where trees cannot;
- ``hybrid-calibrated``: trees on log(measured / calibrated prior).
One booster, two outputs (`multi_strategy` one_output_per_tree or multi_output_tree, tree_method hist).

Each head trains on the rows that carry its label (issue #16): when every row has time and memory, one
dual-output booster (paper §3.2); otherwise a time booster on every time-bearing row and a memory booster
on the memory-bearing rows. A GPU type without memory labels takes memory from the closed form
(memx.planner.cost.AnalyticStageModel, runtime "catalog": with the runtime overheads) and
`memory_sources[gpu] == "closed-form"` says so; `memory_source` summarises ("learned", "analytic" when no
type measured memory, "mixed"). Forward-only rows become stage times through memx.learn.phases. A GPU
type in `gpus` with no training row is predicted from its spec-sheet features and what the other types
taught (`unprofiled`), with the documented wide bands of memx.learn.intervals.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from memx.planner.cost import (AnalyticStageModel, option_columns, precision_column, recomputed_layers,
                               static_bytes_per_param)
from memx.learn.intervals import Intervals, fit_intervals, interval_columns, intervals_from_json, layered, memory_group
from memx.learn.phases import ITERATION, BackwardModel, fit_backward, forward_only_gpus, phase_of, stage_time_labels
from memx.learn.transfer import (micro_batch_transfer, micro_batches_seen, seen_micro_batch, seen_value, seq_len_transfer,
                                  seq_lens_seen, sequence_parallel_seen, sequence_parallel_transfer,
                                  unseen_sequence_parallel)
from memx.learn.boosters import booster_from_b64 as _booster, columns_for, train as _train
from memx.learn.features import (feature_matrix, gpu_arrays, memory_bases, signature_arrays,
                                  static_basis, time_bases, without_distributed_optimizer)
from memx.learn.experts import (labels as moe_labels, predict_columns as expert_predict_columns, structures_seen,
                                with_structures, dense_layers_measured)
from memx.planner.signatures import PREDICTOR_INPUT_COLUMNS, SIGNATURE_COLUMNS
from memx.domain.moe_records import MOE_COLUMNS
from memx.domain.hashing import bytes_hash, stable_hash
from memx.domain.plan import Recompute
from memx.domain.runtime import RuntimeProfile
from memx.domain.specs import GpuType

VARIANTS = ("xgb", "hybrid", "calibrated", "hybrid-calibrated")
GLOBAL = "*"  # calibration used for GPU types that were not profiled
MIN_ROWS_PER_GPU = 12  # our choice: fewer rows than this → the GPU type uses the global calibration


@dataclass(frozen=True, kw_only=True)
class XgbParams:
    max_depth: int = 6
    learning_rate: float = 0.1
    n_rounds: int = 300
    min_child_weight: float = 1.0
    subsample: float = 0.9
    colsample_bytree: float = 0.9
    reg_lambda: float = 1.0
    multi_strategy: str = "one_output_per_tree"

    def booster_params(self, seed: int, outputs: int) -> dict[str, Any]:
        p = {"tree_method": "hist", "objective": "reg:squarederror", "max_depth": self.max_depth,
             "eta": self.learning_rate, "min_child_weight": self.min_child_weight, "subsample": self.subsample,
             "colsample_bytree": self.colsample_bytree, "lambda": self.reg_lambda, "seed": seed, "nthread": 1}
        if outputs > 1:
            p["multi_strategy"] = self.multi_strategy
        return p


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Per-GPU (and GLOBAL) non-negative weights of the time and memory bases; static memory ratio."""

    time_coef: dict[str, list[float]]
    mem_coef: dict[str, list[float]] = field(default_factory=dict)
    static_ratio: dict[str, float] = field(default_factory=dict)


def _nnls_relative(A: np.ndarray, y: np.ndarray) -> list[float]:
    """min Σ((A·θ − y)/y)² with θ ≥ 0 (relative error: stages span three orders of magnitude)."""
    from scipy.optimize import nnls

    Ar = A / y[:, None]
    scale = np.linalg.norm(Ar, axis=0)
    scale[scale == 0] = 1.0
    theta, _ = nnls(Ar / scale, np.ones_like(y), maxiter=50 * A.shape[1])
    return (theta / scale).tolist()


def _groups(names: np.ndarray) -> dict[str, np.ndarray]:
    out = {GLOBAL: np.ones(len(names), dtype=bool)}
    for u in np.unique(names):
        sel = names == u
        if sel.sum() >= MIN_ROWS_PER_GPU:
            out[str(u)] = sel
    return out


def fit_calibration(a, g, names: np.ndarray, y_time: np.ndarray, y_mem: np.ndarray, y_static: np.ndarray,
                    analytic_static: np.ndarray) -> Calibration:
    Tb, Mb = time_bases(a, g), memory_bases(a)
    if a["layers"].max() <= 1:  # per-layer profiles: a constant is not identifiable from a per-layer term
        Tb[:, -1] = 0.0
    tc, mc, sr = {}, {}, {}
    for key, sel in _groups(names).items():
        tc[key] = _nnls_relative(Tb[sel], y_time[sel])
        ok = sel & np.isfinite(y_mem)
        if ok.sum() >= min(MIN_ROWS_PER_GPU, sel.sum()) and ok.any():
            mc[key] = _nnls_relative(Mb[ok], y_mem[ok])
        oks = sel & np.isfinite(y_static) & (analytic_static > 0)
        if oks.any():
            sr[key] = float(np.median(y_static[oks] / analytic_static[oks]))
    return Calibration(time_coef=tc, mem_coef=mc, static_ratio=sr)


def _per_row(coef: Mapping[str, list[float]], groups: tuple[np.ndarray, np.ndarray], bases: np.ndarray) -> np.ndarray:
    uniq, inv = groups  # np.unique(names, return_inverse=True): row i's bases @ its GPU type's coefficients
    out = np.empty(len(inv))
    for i, u in enumerate(uniq):
        theta = np.asarray(coef.get(str(u), coef[GLOBAL]))
        sel = inv == i
        out[sel] = bases[sel] @ theta
    return out


def apply_calibration(cal: Calibration, a, g, names: np.ndarray, analytic: pd.DataFrame):
    """(time_ms, peak_mem_mib, static_mem_mib) of the calibrated prior; analytic memory without data."""
    groups = np.unique(names, return_inverse=True)  # once: a sort of the names, the costliest step here
    t = np.maximum(_per_row(cal.time_coef, groups, time_bases(a, g)), 1e-3)
    if cal.mem_coef:
        m = np.maximum(_per_row(cal.mem_coef, groups, memory_bases(a)), 1.0)
    else:
        m = analytic["peak_mem_mib"].to_numpy(dtype=np.float64)
    ratio = np.array([cal.static_ratio.get(str(n), cal.static_ratio.get(GLOBAL, 1.0)) for n in groups[0]])
    s = analytic["static_mem_mib"].to_numpy(dtype=np.float64) * (ratio[groups[1]] if len(ratio) else 1.0)
    return t, m, s


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Everything computed from signatures before the trees: features and the variant's prior."""

    X: np.ndarray
    prior_time_ms: np.ndarray
    prior_mem_mib: np.ndarray
    static_mem_mib: np.ndarray
    analytic_mem_mib: np.ndarray
    # added to the (corrected) peak: the prior's peak with the stage's distributed optimizer minus without
    # it (≤ 0; 0 on rows without it; `hybrid`: the flat closed form's, which leaves out the allocator).
    # Issue #14: profiles measure stages without the distributed optimizer (docs/profiling.md), so the
    # trees and their features see each stage as it would be without it and its static-memory saving
    # comes from the prior: additive, as it changes static bytes only.
    mem_offset_mib: np.ndarray


def _prior(cal: Calibration | None, a, g, names: np.ndarray, an: pd.DataFrame):
    """(time, peak, static) of the calibrated prior, or of the closed form without a calibration."""
    if cal is not None:
        return apply_calibration(cal, a, g, names, an)
    return tuple(an[c].to_numpy(dtype=np.float64) for c in ("time_ms", "peak_mem_mib", "static_mem_mib"))


def prepare(sigs: pd.DataFrame, gpus: Mapping[str, GpuType], variant: str, cal: Calibration | None,
            moe: bool = False) -> Prepared:
    """The rows' features and prior; `moe`: the predictor learned MoE stages (memx.learn.experts), so the matrix
    has the MoE features too — a dense predictor's matrix is the one it always had."""
    a = signature_arrays(sigs)
    names = sigs["gpu"].astype(str).to_numpy()
    g = gpu_arrays(names, gpus)
    # the flat closed form stays the learned model's prior (issue 12 keeps the learned path unchanged)
    model = AnalyticStageModel(gpus=gpus, runtime="none")
    cols = sigs.loc[:, [c for c in SIGNATURE_COLUMNS if c in sigs]]  # option columns absent: their defaults
    an = model.predict(cols)
    ct, cm, cs = _prior(cal, a, g, names, an)  # static (cs) and peak (cm) with the distributed optimizer
    if cal is None:  # the flat closed form's static, in the row's precision (a calibration learns the profile's)
        do, dp, _ = option_columns(sigs)
        cs = cs * static_bytes_per_param(do, dp, precision_column(sigs)) / static_bytes_per_param(do, dp)
    a_off = without_distributed_optimizer(a)
    if np.any(a_off["static_bpp"] != a["static_bpp"]):
        an_off = model.predict(cols.assign(distributed_optimizer=False))
        _, cm_off, cs_off = _prior(cal, a_off, g, names, an_off)
        if cal is not None:  # the option's share in the row's precision, of the calibrated static
            cs = cs_off * a["static_bpp"] / a_off["static_bpp"]
    else:
        an_off, cm_off = an, cm
    an_m = an["peak_mem_mib"].to_numpy(np.float64)
    an_t, an_m_off = an_off["time_ms"].to_numpy(np.float64), an_off["peak_mem_mib"].to_numpy(np.float64)
    if variant == "xgb":
        pt, pm, offset = np.ones(len(sigs)), np.ones(len(sigs)), cm - cm_off
    elif variant == "hybrid":  # the closed form's saving: static only, without the allocator's share of it
        # floored as the calibrated prior is (apply_calibration): the flat form gives an embedding-only piece
        # (layers 0, first; per-layer records) no time, and a zero prior is an infinite label for the trees.
        # The flat form's peak differs with the option in its static term only: params × Δ bytes per param, in
        # the row's precision (features.signature_arrays)
        plain = static_bytes_per_param(False, 1, precision_column(sigs)) / static_bytes_per_param(False, 1)
        pt, pm, offset = np.maximum(an_t, 1e-3), an_m_off, (static_basis(a) - static_basis(a_off)) * plain
    else:
        pt, pm, offset = ct, cm_off, cm - cm_off
    X = feature_matrix(a_off, g, an_off, ct, cm_off, moe)
    return Prepared(X=X, prior_time_ms=pt, prior_mem_mib=pm, static_mem_mib=cs, analytic_mem_mib=an_m,
                    mem_offset_mib=offset)


@dataclass(frozen=True, kw_only=True)
class LearnedStagePredictor:
    """A trained stage predictor (StagePredictor protocol). `memory_source` is "learned" when memory was
    measured, "analytic" when the training data carried time only."""

    variant: str
    gpus: Mapping[str, GpuType]
    calibration: Calibration | None
    booster: Any | None  # xgboost.Booster; None for the calibrated prior alone
    memory_source: str = "learned"
    params: XgbParams = field(default_factory=XgbParams)
    intervals: Intervals | None = None  # conformal bands (memx.learn.intervals); None: documented defaults
    mem_booster: Any | None = None  # the memory head when rows differ in which labels they carry
    memory_sources: dict[str, str] = field(default_factory=dict)  # profiled GPU → "measured" | "closed-form"
    backward: BackwardModel = field(default_factory=BackwardModel)
    forward_only: dict[str, list[str]] = field(default_factory=dict)  # GPU → recompute levels timed forward-only
    per_layer: bool = False  # trained on per-layer records only: stage times composed from layer pieces
    # sequence parallelism (in effect: tp > 1) of the training rows; a stage with the other value is predicted
    # from the seen one × the closed form's ratio (`memx.learn.transfer.sequence_parallel_transfer`); () = unknown (earlier versions): as trained
    sequence_parallel_seen: tuple[bool, ...] = ()
    # micro batches of the training rows per GPU type (issue #23); a type profiled at one micro batch only has its
    # times at the others from the seen one × the runtime closed form's GEMM-efficiency ratio
    # (`memx.learn.transfer.micro_batch_transfer`); {} = unknown (earlier versions): as trained
    micro_batch_seen: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # sequence lengths of the training rows per GPU type (issue #27: a cp rank's s/cp), the same transfer
    # (`memx.learn.transfer.seq_len_transfer`, time and memory); {} = unknown (earlier versions): as trained
    seq_len_seen: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # The closed form's runtime profiles for memory without labels: "catalog" (conf/runtime) or, per GPU
    # type, the profile of the stack that was measured (e.g. eager attention where the catalog assumes a
    # fused kernel) — the same argument as memx.planner.cost.AnalyticStageModel's `runtime`.
    runtime: str | Mapping[str, RuntimeProfile] = "catalog"
    # issue #27: the training rows' MoE models' expert fields for the search's rows (experts.structures_seen; {} none)
    moe_seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    measures_dense_layers = dense_layers_measured  # their dense-first layers measured (memx.learn.experts, #27)
    name: str = ""

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", f"memx-{self.variant}")

    def predict_columns(self, cols: Mapping[str, np.ndarray]) -> pd.DataFrame:
        """`predict` on the search's numpy columns, a MoE stage's expert columns kept (memx.learn.experts)."""
        return expert_predict_columns(self, cols)

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        """Time, peak, static memory and bands per stage (a MoE stage's less the closed form's expert terms)."""
        sigs = with_structures(sigs, self.moe_seen)
        seen_mb = seen_micro_batch(self, sigs)
        moved = seen_mb != sigs["micro_batch"].to_numpy(np.float64) if len(sigs) else np.zeros(0, dtype=bool)
        out = self._predict_options(sigs)
        if moved.any():
            out = micro_batch_transfer(self, sigs, out, seen_mb, moved)
        seen_s = seen_value(self.seq_len_seen, sigs, "seq_len")
        if len(sigs) and (moved_s := seen_s != sigs["seq_len"].to_numpy(np.float64)).any():
            out = seq_len_transfer(self, sigs, out, seen_s, moved_s)
        return out

    def _predict_options(self, sigs: pd.DataFrame) -> pd.DataFrame:
        """Predictions at the rows' micro batches; job options the profiles did not cover are transferred."""
        unseen = unseen_sequence_parallel(self, sigs)
        if unseen.any():
            return sequence_parallel_transfer(self, sigs, unseen)
        p, t, m = self._heads(sigs)
        if self.per_layer and len(sigs):
            t = self._composed_time(sigs)
        names = sigs["gpu"].astype(str).to_numpy()
        closed = np.isin(names, self._closed_form_gpus())
        if closed.any():
            cf = AnalyticStageModel(gpus=self.gpus, runtime=self.runtime).predict(  # with runtime overheads (#16),
                sigs.loc[closed, [c for c in PREDICTOR_INPUT_COLUMNS if c in sigs.columns]])  # in the rows' precision
            m = m.copy()
            m[closed] = cf["peak_mem_mib"].to_numpy(np.float64)
        bounds = interval_columns(self.effective_intervals(), names, t, m,
                                  np.where(closed, 0.0, p.static_mem_mib),  # memory bands on m − static (intervals)
                                  memory_group(sigs["recompute"].to_numpy(), sigs["inflight"].to_numpy()))
        return pd.DataFrame({"time_ms": t, "peak_mem_mib": m, "static_mem_mib": p.static_mem_mib, **bounds},
                            index=sigs.index)

    def _composed_time(self, sigs: pd.DataFrame) -> np.ndarray:
        """A stage's time from per-layer pieces, as the per-layer profilers compose it (Metis, Um et al. ATC
        2024 §4; Sailor, Strati et al. 2024 §4: stage time = Σ of its layers' times, plus the embedding on
        the first stage and the output layer on the last): n_rec·t(one layer recomputed in full) +
        (n − n_rec)·t(one layer at the stage's other level) + first·t(embedding) + last·t(output). The
        pieces are the signatures the per-layer records themselves carry (layers 1, or 0 with first/last),
        so nothing is extrapolated along the layer axis by trees trained on layers ≤ 1."""
        n = sigs["layers"].to_numpy(np.float64)
        rec = sigs["recompute"].astype(str).to_numpy()
        n_rec = recomputed_layers(rec, sigs["recompute_layers"].to_numpy(), n)
        piece = sigs.loc[:, [c for c in SIGNATURE_COLUMNS if c in sigs]].assign(first=False, last=False, layers=1, recompute_layers=np.nan)
        full = piece.assign(recompute=Recompute.FULL.value)
        other = piece.assign(recompute=np.where(rec == Recompute.SELECTIVE.value, rec, Recompute.NONE.value))
        ends = piece.assign(layers=0, recompute=Recompute.NONE.value)
        batch = pd.concat([full, other, ends.assign(first=True), ends.assign(last=True)], ignore_index=True)
        t = self._heads(batch)[1].reshape(4, len(sigs))
        first, last = sigs["first"].to_numpy(bool), sigs["last"].to_numpy(bool)
        return n_rec * t[0] + (n - n_rec) * t[1] + first * t[2] + last * t[3]

    def _heads(self, sigs: pd.DataFrame):
        """(prepared rows, time, memory) of the prior × the boosters' corrections, row by row."""
        p = prepare(sigs, self.gpus, self.variant, self.calibration, bool(self.moe_seen))
        t, m = p.prior_time_ms, p.prior_mem_mib
        if self.booster is not None and len(sigs):
            r = np.asarray(self.booster.inplace_predict(columns_for(self.booster, p.X)),
                           dtype=np.float64).reshape(len(sigs), -1)
            t = t * np.exp(r[:, 0])
            if r.shape[1] > 1:
                m = m * np.exp(r[:, 1])
        if self.mem_booster is not None and len(sigs):
            m = m * np.exp(np.asarray(self.mem_booster.inplace_predict(columns_for(self.mem_booster, p.X)),
                                      dtype=np.float64).reshape(-1))
        return p, t, np.maximum(m + p.mem_offset_mib, 1.0)  # the distributed optimizer's static saving (prepare)

    @property
    def time_only(self) -> bool:
        return self.memory_source == "analytic"

    @property
    def closed_form_memory(self) -> list[str]:
        return sorted(g for g, s in self.memory_sources.items() if s == "closed-form")

    @property
    def unprofiled(self) -> list[str]:
        """GPU types with a spec but no training row (empty for predictors trained before this was recorded)."""
        return sorted(set(self.gpus) - set(self.memory_sources)) if self.memory_sources else []

    def sources(self) -> dict[str, dict[str, str]]:
        """Per GPU type where its time and memory come from: measured / forward×ratio / closed-form / unprofiled."""
        out = {}
        for g in sorted(self.gpus):
            if g in self.unprofiled:
                out[g] = {"time": "unprofiled", "memory": "unprofiled"}
            else:
                out[g] = {"time": "forward x backward ratio" if g in self.forward_only else "measured",
                          "memory": "closed-form" if g in self._closed_form_gpus() else "measured"}
                if len(self.micro_batch_seen.get(g, ())) == 1:  # records hold one micro batch only: say so
                    out[g]["time"] += (f" at micro batch {self.micro_batch_seen[g][0]}; other micro batches x "
                                       "closed-form GEMM-efficiency ratio")
        return out

    def _closed_form_gpus(self) -> list[str]:
        """GPU types whose memory is the closed form's: no memory label (every type when none had one)."""
        return sorted(self.gpus) if self.time_only else self.closed_form_memory

    def effective_intervals(self) -> Intervals:
        fwd = {g: (min(self.backward.time_band(r)[0] for r in levels), max(self.backward.time_band(r)[1] for r in levels))
               for g, levels in self.forward_only.items()}
        return layered(self.intervals, closed_form_memory=self._closed_form_gpus(), forward_time=fwd,
                       unprofiled=self.unprofiled)

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "memory_source": self.memory_source, "params": asdict(self.params),
                "calibration": None if self.calibration is None else asdict(self.calibration),
                "intervals": None if self.intervals is None else self.intervals.to_json(),
                "memory_sources": dict(sorted(self.memory_sources.items())), "backward": asdict(self.backward),
                "forward_only": dict(sorted(self.forward_only.items())),
                "mem_booster_ubj_b64": None if self.mem_booster is None else
                base64.b64encode(bytes(self.mem_booster.save_raw("ubj"))).decode("ascii"),
                "gpus": {k: asdict(v) for k, v in sorted(self.gpus.items())},
                **({"per_layer": True} if self.per_layer else {}),  # absent when default: earlier versions keep
                **({"sequence_parallel_seen": list(self.sequence_parallel_seen)} if self.sequence_parallel_seen else {}),
                **({"micro_batch_seen": {g: list(v) for g, v in sorted(self.micro_batch_seen.items())}}
                   if self.micro_batch_seen else {}),
                **({"seq_len_seen": {g: list(v) for g, v in sorted(self.seq_len_seen.items())}} if self.seq_len_seen else {}),
                **({"moe_seen": dict(sorted(self.moe_seen.items()))} if self.moe_seen else {}),
                **({} if isinstance(self.runtime, str) else  # their hash
                   {"runtime": {k: asdict(v) for k, v in sorted(self.runtime.items())}})}

    def booster_bytes(self) -> bytes:
        return b"" if self.booster is None else bytes(self.booster.save_raw("ubj"))

    @property
    def version(self) -> str:
        """Content hash of everything that determines predictions (keys the prediction cache)."""
        return stable_hash(self.to_json(), bytes_hash(self.booster_bytes()))


def from_json(meta: Mapping[str, Any], booster: Any | None) -> LearnedStagePredictor:
    cal = meta.get("calibration")
    return LearnedStagePredictor(
        variant=meta["variant"], memory_source=meta["memory_source"], params=XgbParams(**meta["params"]),
        calibration=None if cal is None else Calibration(**cal), booster=booster,
        intervals=intervals_from_json(meta.get("intervals")), memory_sources=dict(meta.get("memory_sources") or {}),
        backward=BackwardModel(**meta["backward"]) if meta.get("backward") else BackwardModel(),
        forward_only=dict(meta.get("forward_only") or {}), mem_booster=_booster(meta.get("mem_booster_ubj_b64")),
        per_layer=bool(meta.get("per_layer", False)),
        sequence_parallel_seen=tuple(bool(v) for v in meta.get("sequence_parallel_seen", ())),
        micro_batch_seen={g: tuple(int(b) for b in v) for g, v in (meta.get("micro_batch_seen") or {}).items()},
        seq_len_seen={g: tuple(int(s) for s in v) for g, v in (meta.get("seq_len_seen") or {}).items()},
        runtime={k: RuntimeProfile(**v) for k, v in meta["runtime"].items()} if meta.get("runtime") else "catalog",
        moe_seen={k: dict(v) for k, v in (meta.get("moe_seen") or {}).items()},
        gpus={k: GpuType(**v) for k, v in meta["gpus"].items()})


def training_rows(stage_runs: pd.DataFrame) -> pd.DataFrame:
    """Rows usable for training: status ok (or missing) with a positive time."""
    df = stage_runs
    if "status" in df.columns:
        df = df[df["status"].fillna("ok").astype(str) == "ok"]
    df = df[pd.to_numeric(df["time_ms"], errors="coerce") > 0]
    df = df[phase_of(df) != ITERATION]  # whole-iteration times are plan-level, not stage labels (memx.learn.phases)
    return df.reset_index(drop=True)


def _targets(df: pd.DataFrame, backward: BackwardModel | None = None,
             gpus: Mapping[str, GpuType] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage time — forward rows × (1 + backward/forward) —, peak memory, static memory); NaN where absent. A MoE
    row's less the closed form's expert terms (`gpus` given; memx.learn.experts.labels)."""
    col = lambda c: pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64) if c in df else np.full(len(df), np.nan)
    return moe_labels(df, gpus, stage_time_labels(df, backward or BackwardModel()), col("peak_mem_mib"),
                      col("static_mem_mib"))


def fit_predictor(stage_runs: pd.DataFrame, gpus: Mapping[str, GpuType], *, variant: str = "hybrid-calibrated",
                  params: XgbParams | None = None, seed: int = 0,
                  runtime: str | Mapping[str, RuntimeProfile] = "catalog") -> LearnedStagePredictor:
    """Train one variant on stage_runs (failed / OOM rows dropped; time-only rows kept); `runtime`: the
    closed form's runtime profiles for GPU types without memory labels (LearnedStagePredictor.runtime)."""
    import xgboost as xgb

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    params = params or XgbParams()
    df = training_rows(stage_runs)
    if df.empty:
        raise ValueError("no usable stage_runs rows (all failed or without time)")
    backward = fit_backward(df)
    yt, ym, ys = _targets(df, backward, gpus)
    names = df["gpu"].astype(str).to_numpy()
    has_mem = np.isfinite(ym) & (ym > 0)
    measured = set(names[has_mem])
    memory_sources = {str(g): "measured" if g in measured else "closed-form" for g in np.unique(names)}
    memory_source = ("learned" if len(measured) == len(memory_sources) else "analytic" if not measured else "mixed")
    ym = np.where(has_mem, ym, np.nan)
    cal = None
    if variant in ("calibrated", "hybrid-calibrated", "xgb"):
        a = signature_arrays(df)
        an = AnalyticStageModel(gpus=gpus, runtime="none").predict(df.loc[:, [c for c in SIGNATURE_COLUMNS if c in df]])
        cal = fit_calibration(a, gpu_arrays(names, gpus), names, yt, ym, ys, an["static_mem_mib"].to_numpy(np.float64))
    base = LearnedStagePredictor(variant=variant, gpus=dict(gpus), calibration=cal, booster=None,
                                 memory_source=memory_source, params=params, memory_sources=memory_sources,
                                 backward=backward, forward_only=forward_only_gpus(df),
                                 per_layer=bool(df["layers"].max() <= 1),  # per-layer records (Metis, Sailor)
                                 sequence_parallel_seen=sequence_parallel_seen(df),
                                 micro_batch_seen=micro_batches_seen(df), seq_len_seen=seq_lens_seen(df),
                                 moe_seen=structures_seen(df),
                                 runtime=runtime if isinstance(runtime, str) else dict(runtime))
    if variant == "calibrated":
        return base
    p = prepare(df, gpus, variant, cal, bool(base.moe_seen))
    lt = np.log(yt / p.prior_time_ms)
    ym = np.where(has_mem, np.maximum(ym - p.mem_offset_mib, 1.0), np.nan)  # as without the distributed optimizer
    if has_mem.all():  # every row carries both labels: one dual-output booster (paper §3.2)
        Y = np.column_stack([lt, np.log(ym / p.prior_mem_mib)])
        return replace(base, booster=_train(xgb, params, seed, p.X, Y))
    booster = _train(xgb, params, seed, p.X, lt[:, None])  # time head: every time-bearing row
    mem_booster = None
    if has_mem.sum() >= MIN_ROWS_PER_GPU:  # memory head: the memory-bearing rows
        mem_booster = _train(xgb, params, seed, p.X[has_mem], np.log(ym[has_mem] / p.prior_mem_mib[has_mem])[:, None])
    return replace(base, booster=booster, mem_booster=mem_booster)


def conformalize(predictor: LearnedStagePredictor, held_out: pd.DataFrame, *, coverage: float = 0.9,
                 source: str = "held-out residuals", grouped: bool = True) -> LearnedStagePredictor:
    """The predictor with split-conformal bands from rows it never trained on (memx.learn.intervals);
    `grouped` adds the group-conditional memory bands (Mondrian; False: per GPU type only, as before)."""
    df = training_rows(held_out)
    yt, ym, _ = _targets(df, predictor.backward, predictor.gpus)
    pr = predictor.predict(df.loc[:, [c for c in (*SIGNATURE_COLUMNS, *MOE_COLUMNS) if c in df]])
    pm = pr["peak_mem_mib"].to_numpy(np.float64)
    iv = fit_intervals(df["gpu"].to_numpy(), pr["time_ms"].to_numpy(np.float64), yt, pm, ym, coverage=coverage,
                       source=source, static_mem_mib=pr["static_mem_mib"].to_numpy(np.float64),  # dynamic scale
                       group=memory_group(df["recompute"].to_numpy(), df["inflight"].to_numpy()) if grouped else None)
    return replace(predictor, intervals=iv)


def stage_errors(predictor, rows: pd.DataFrame) -> dict[str, float]:
    """Held-out stage errors (fractions): time MAPE and, where measured, memory MAPE."""
    df = training_rows(rows)
    yt, ym, _ = _targets(df, getattr(predictor, "backward", None), getattr(predictor, "gpus", None))
    pr = predictor.predict(df.loc[:, [c for c in (*SIGNATURE_COLUMNS, *MOE_COLUMNS) if c in df]])
    out = {"time_mape": float(np.mean(np.abs(pr["time_ms"].to_numpy() - yt) / yt))}
    ok = np.isfinite(ym)
    out["mem_mape"] = float(np.mean(np.abs(pr["peak_mem_mib"].to_numpy()[ok] - ym[ok]) / ym[ok])) if ok.any() else float("nan")
    return out


def held_out_score(err: Mapping[str, float]) -> float:
    """Selection score: time MAPE + memory MAPE (our choice; memory dropped when not measured)."""
    m = err.get("mem_mape", float("nan"))
    return float(err["time_mape"] + (0.0 if np.isnan(m) else m))
