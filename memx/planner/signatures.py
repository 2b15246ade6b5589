"""Stage signatures: the predictor's input (the stage_runs input columns, docs/architecture.md
§Measurement records) and the `StagePredictor` protocol every stage model implements (analytic,
learned, hybrid)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from memx.domain.plan import Recompute
from memx.domain.records import SIGNATURE_COLUMNS
from memx.domain.specs import ModelArch
from memx.planner.tables import NONE, SELECTIVE, StageContext

__all__ = ["INTERVAL_COLUMNS", "PREDICTION_COLUMNS", "PREDICTOR_INPUT_COLUMNS", "SIGNATURE_COLUMNS", "StagePredictor",
           "signature_frame"]

PREDICTION_COLUMNS = ("time_ms", "peak_mem_mib", "static_mem_mib")
# What the search hands a predictor: the records' signature columns plus the plan's training precision
# (issue #23; not a records column — profiles are taken in one precision — the closed form reads it where
# present, memx.planner.cost.precision_column, and a predictor that does not know it ignores it).
PREDICTOR_INPUT_COLUMNS = (*SIGNATURE_COLUMNS, "precision")
# Optional: a predictor with uncertainty also returns its 90 % interval (memx.learn.intervals;
# docs/architecture.md §Stage model); NaN where a predictor gives none.
INTERVAL_COLUMNS = ("time_ms_low", "time_ms_high", "peak_mem_mib_low", "peak_mem_mib_high")


@runtime_checkable
class StagePredictor(Protocol):
    """Maps a batch of stage signatures to predictions.

    `predict` takes a DataFrame with SIGNATURE_COLUMNS and returns one with PREDICTION_COLUMNS on the
    same index: time_ms (forward + backward of one micro batch), peak_mem_mib (per-GPU peak with
    `inflight` micro batches held), static_mem_mib (weights, gradients, optimizer state).
    """

    name: str

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame: ...


def signature_frame(contexts: list[StageContext], layers: np.ndarray, codes: np.ndarray, ctx_index: np.ndarray,
                    model: ModelArch, seq_len: int) -> pd.DataFrame:
    """One signature row per (context, layers, option code); ctx_index points into `contexts`."""
    gpu = np.array([c.gpu for c in contexts], dtype=object)[ctx_index]
    attr = {f: np.array([getattr(c, f) for c in contexts])[ctx_index]
            for f in ("tp", "micro_batch", "first", "last", "inflight", "distributed_optimizer", "dp", "sequence_parallel")}
    recompute = np.where(codes == NONE, Recompute.NONE.value,
                         np.where(codes == SELECTIVE, Recompute.SELECTIVE.value, Recompute.FULL.value))
    block = (codes >= 1) & (codes < layers)
    rl = pd.array(np.where(block, codes, 0), dtype="Int64")
    rl[~block] = pd.NA
    n = len(layers)
    return pd.DataFrame({
        "gpu": gpu, "tp": attr["tp"].astype(np.int64), "layers": layers.astype(np.int64),
        "micro_batch": attr["micro_batch"].astype(np.int64), "seq_len": np.full(n, seq_len, dtype=np.int64),
        "recompute": recompute, "recompute_layers": rl, "first": attr["first"].astype(bool),
        "last": attr["last"].astype(bool), "inflight": attr["inflight"].astype(np.int64),
        "hidden": np.full(n, model.hidden, dtype=np.int64), "ffn_hidden": np.full(n, model.ffn_hidden, dtype=np.int64),
        "heads": np.full(n, model.heads, dtype=np.int64), "query_groups": np.full(n, model.query_groups, dtype=np.int64),
        "vocab": np.full(n, model.vocab, dtype=np.int64), "mlp": np.full(n, model.mlp, dtype=object),
        "distributed_optimizer": attr["distributed_optimizer"].astype(bool), "dp": attr["dp"].astype(np.int64),
        "sequence_parallel": attr["sequence_parallel"].astype(bool),
        # not a records column: the closed form reads it where present (memx.planner.cost.precision_column)
        "precision": np.array([c.precision for c in contexts], dtype=object)[ctx_index],
    })
