"""Predictions that rest on a transfer through the closed form (memx.learn.model.LearnedStagePredictor):
a micro batch or a sequence-parallel setting the profiles did not cover (issues #14, #23). The functions take
the predictor (a LearnedStagePredictor) as their first argument; docs/predictor.md §Options the profiles did not cover."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from memx.learn.intervals import widened
from memx.planner.cost import AnalyticStageModel, option_columns
from memx.planner.signatures import PREDICTOR_INPUT_COLUMNS


def micro_batches_seen(df: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    """The micro batches of the rows of each GPU type (sorted): one value means every other micro batch is a
    transfer (micro_batch_transfer)."""
    return {str(g): tuple(sorted({int(b) for b in grp})) for g, grp in df.groupby(df["gpu"].astype(str))["micro_batch"]}


def sequence_parallel_seen(df: pd.DataFrame) -> tuple[bool, ...]:
    """The sequence-parallel values of the training rows at tp > 1 (where it is in effect)."""
    tp = df["tp"].to_numpy() > 1
    return tuple(sorted({bool(v) for v in option_columns(df)[2][tp]}))


def seq_lens_seen(df: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    """The sequence lengths of the rows of each GPU type (sorted): one value means every other length (e.g. a
    context-parallel rank's s/cp, memx.planner.context_parallel) is a transfer (seq_len_transfer)."""
    return {str(g): tuple(sorted({int(s) for s in grp})) for g, grp in df.groupby(df["gpu"].astype(str))["seq_len"]}


def seen_micro_batch(pred: Any, sigs: pd.DataFrame) -> np.ndarray:
    """Per row the one micro batch its GPU type was profiled at; the row's own where the type saw several."""
    return seen_value(pred.micro_batch_seen, sigs, "micro_batch")


def seen_value(seen: dict[str, tuple[int, ...]], sigs: pd.DataFrame, col: str) -> np.ndarray:
    """Per row the one value of `col` its GPU type was profiled at (`seen`); the row's own where the type saw
    several or is not listed."""
    own = sigs[col].to_numpy(np.float64)
    single = {g: float(v[0]) for g, v in seen.items() if len(v) == 1}
    if not single or not len(sigs):
        return own
    names = sigs["gpu"].astype(str).to_numpy()
    out = own.copy()
    for g, b in single.items():
        out[names == g] = b
    return out

def micro_batch_transfer(pred: Any, sigs: pd.DataFrame, out: pd.DataFrame, seen_mb: np.ndarray,
                             moved: np.ndarray) -> pd.DataFrame:
    """Times at a micro batch the GPU type was never profiled at: the prediction at the profiled micro batch ×
    the runtime closed form's ratio (requested / profiled; memx.planner.runtime_terms: GEMMs of b·s tokens
    with wave quantisation over the SMs, the roofline on bytes moved, kernel launches and the host-dispatch
    floor — Williams et al. 2009; NVIDIA Matrix Multiplication Background guide), not the prior's linear
    growth in b: at micro batch 1 a small model's GEMMs run far below peak and host-bound, so time per
    sample falls as b grows. Memory stays the model's own (activations are linear in b, Korthikanti et al.
    2022 §4). The time bands of these rows widen to the closed form's documented band (they rest on its
    ratio). docs/predictor.md §Options the profiles did not cover."""
    seen = sigs.assign(micro_batch=np.where(moved, seen_mb, sigs["micro_batch"].to_numpy()).astype(np.int64))
    at_seen = pred._predict_options(seen.loc[moved])
    cf = AnalyticStageModel(gpus=pred.gpus, runtime=pred.runtime)
    cols = [c for c in PREDICTOR_INPUT_COLUMNS if c in sigs.columns]
    k = (cf.predict(sigs.loc[moved, cols])["time_ms"] / cf.predict(seen.loc[moved, cols])["time_ms"]).to_numpy()
    out = out.copy()
    for col in [c for c in out.columns if c.startswith("time_ms")]:
        out.loc[moved, col] = at_seen[col].to_numpy(np.float64) * k
    return widened(out, moved, "time")

def seq_len_transfer(pred: Any, sigs: pd.DataFrame, out: pd.DataFrame, seen_s: np.ndarray,
                     moved: np.ndarray) -> pd.DataFrame:
    """Stages at a sequence length the GPU type was never profiled at (issue #27: a context-parallel rank runs
    s/cp tokens of a profile taken at s): the prediction at the profiled length × the runtime closed form's
    ratio (requested / profiled) for time and peak memory — per-token GEMMs and elementwise work, attention
    quadratic in the length (Narayanan et al. 2021 §5.1), activations linear in it (Korthikanti et al. 2022
    §4) — not the trees' extrapolation along a feature they never saw vary. The ring attention's own terms
    are added after any predictor (memx.planner.context_parallel.add_ring_terms). Both bands widen to the
    closed form's documented band. docs/predictor.md §Options the profiles did not cover."""
    seen = sigs.assign(seq_len=np.where(moved, seen_s, sigs["seq_len"].to_numpy()).astype(np.int64))
    at_seen = pred.predict(seen.loc[moved])  # its micro batch transferred too where needed
    cf = AnalyticStageModel(gpus=pred.gpus, runtime=pred.runtime)
    cols = [c for c in PREDICTOR_INPUT_COLUMNS if c in sigs.columns]
    want, have = cf.predict(sigs.loc[moved, cols]), cf.predict(seen.loc[moved, cols])
    out = out.copy()
    for col in [c for c in out.columns if c.startswith(("time_ms", "peak_mem_mib"))]:
        base = "time_ms" if col.startswith("time_ms") else "peak_mem_mib"
        k = (want[base] / have[base]).to_numpy(np.float64)
        out.loc[moved, col] = at_seen[col].to_numpy(np.float64) * k
    return widened(widened(out, moved, "time"), moved, "memory")


def unseen_sequence_parallel(pred: Any, sigs: pd.DataFrame) -> np.ndarray:
    """Rows at tp > 1 whose sequence parallelism no training row had (only when training saw one value)."""
    if len(pred.sequence_parallel_seen) != 1 or not len(sigs):
        return np.zeros(len(sigs), dtype=bool)
    tp = sigs["tp"].to_numpy() > 1
    return tp & (option_columns(sigs)[2] != pred.sequence_parallel_seen[0])

def sequence_parallel_transfer(pred: Any, sigs: pd.DataFrame, unseen: np.ndarray) -> pd.DataFrame:
    """Stages with sequence parallelism the profiles never had: predicted as the seen setting, times and
    peaks scaled by the closed form's ratio (unseen / seen; Korthikanti et al. 2022 §4.2.2: the s·b·h
    activations and element-wise work divided by tp, RS + AG in place of the all-reduce) — the trees and the
    prior's weights were fitted where those terms moved together and must not be extrapolated along them
    (a profile of Megatron-LM's --sequence-parallel stages would otherwise put plans without it 3× off).
    docs/predictor.md §Options the profiles did not cover."""
    seen = sigs.assign(sequence_parallel=np.where(unseen, pred.sequence_parallel_seen[0], option_columns(sigs)[2]))
    out = pred._predict_options(seen)
    cols = [c for c in PREDICTOR_INPUT_COLUMNS if c in sigs.columns]  # in the rows' precision

    def ratio(runtime, col: str) -> np.ndarray:
        cf = AnalyticStageModel(gpus=pred.gpus, runtime=runtime)
        return (cf.predict(sigs.loc[unseen, cols])[col] / cf.predict(seen.loc[unseen, cols])[col]).to_numpy(np.float64)

    # time: the flat closed form, as the prior; memory: with the runtime overheads, as memory without labels
    kt, km = ratio("none", "time_ms"), ratio(pred.runtime, "peak_mem_mib")
    for col in out.columns:
        if col.startswith("time_ms"):
            out.loc[unseen, col] = out.loc[unseen, col].to_numpy(np.float64) * kt
        elif col.startswith("peak_mem_mib"):
            out.loc[unseen, col] = out.loc[unseen, col].to_numpy(np.float64) * km
    return widened(widened(out, unseen, "time"), unseen, "memory")  # they rest on the closed form's ratio
