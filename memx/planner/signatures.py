"""Stage signatures: the predictor's input (the stage_runs input columns, docs/architecture.md
§Measurement records) and the `StagePredictor` protocol every stage model implements (analytic,
learned, hybrid)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from memx.domain.plan import Recompute
from memx.domain.records import SIGNATURE_COLUMNS, tied_on_ends
from memx.domain.specs import ModelArch
from memx.planner.moe import dense_equivalent, moe_columns
from memx.planner.tables import NONE, SELECTIVE, StageContext

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CLOSED_FORM_BANDS", "INTERVAL_COLUMNS", "PREDICTION_COLUMNS", "PREDICTOR_INPUT_COLUMNS", "SIGNATURE_COLUMNS",
           "StagePredictor", "columns_frame", "predict_arrays", "signature_columns", "signature_frame"]

PREDICTION_COLUMNS = ("time_ms", "peak_mem_mib", "static_mem_mib")
# What the search hands a predictor: the records' signature columns plus the plan's training precision
# (issue #23; not a records column — profiles are taken in one precision — the closed form reads it where
# present, memx.planner.cost.precision_column, and a predictor that does not know it ignores it).
PREDICTOR_INPUT_COLUMNS = (*SIGNATURE_COLUMNS, "precision")
# Optional: a predictor with uncertainty also returns its 90 % interval (memx.learn.intervals;
# docs/architecture.md §Stage model); NaN where a predictor gives none.
INTERVAL_COLUMNS = ("time_ms_low", "time_ms_high", "peak_mem_mib_low", "peak_mem_mib_high")
# The closed form's documented band (its own error, not learned): issue #12 measured the closed form
# 27 % off on time and 48 % on memory on an independent ground truth (before the runtime overheads of
# memx.planner.runtime_terms); bench/coverage.py measures what this band covers on the simulator. Memory
# errs on the safe side: the upper factor is wider than the lower. Here, not in memx.learn.intervals (which
# re-exports it), so that the analytic plan's warning (memx.report.why) does not load the learned stack.
CLOSED_FORM_BANDS = {"time": (0.6, 1.6), "memory": (0.75, 1.6)}


@runtime_checkable
class StagePredictor(Protocol):
    """Maps a batch of stage signatures to predictions.

    `predict` takes a DataFrame with SIGNATURE_COLUMNS and returns one with PREDICTION_COLUMNS on the
    same index: time_ms (forward + backward of one micro batch), peak_mem_mib (per-GPU peak with
    `inflight` micro batches held), static_mem_mib (weights, gradients, optimizer state). A predictor may
    also offer `predict_columns(columns) -> {column: array}` on numpy columns (signature_columns): the
    search then calls it and never builds a DataFrame (the analytic model: no pandas on its plan path).
    """

    name: str

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame: ...


def predict_arrays(predictor: StagePredictor, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every column the predictor returns (PREDICTION_COLUMNS, INTERVAL_COLUMNS where it gives them) as
    float64 arrays for signature columns (signature_columns): through the predictor's `predict_columns`
    where the class that defines its `predict` defines that too, else through `predict` on a DataFrame (a
    wrapper that hands its base's attributes on, or a subclass that overrides `predict` only, is not bypassed)."""
    by_columns = next((vars(k).get("predict_columns") for k in type(predictor).__mro__ if "predict" in vars(k)), None)
    pred = predictor.predict_columns(cols) if by_columns is not None else predictor.predict(columns_frame(cols))
    return {c: np.asarray(pred[c], dtype=np.float64) for c in pred.keys()}


def signature_frame(contexts: list[StageContext], layers: np.ndarray, codes: np.ndarray, ctx_index: np.ndarray,
                    model: ModelArch, seq_len: int) -> pd.DataFrame:
    """signature_columns as the DataFrame `StagePredictor.predict` takes."""
    return columns_frame(signature_columns(contexts, layers, codes, ctx_index, model, seq_len))


def columns_frame(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """Signature columns as the DataFrame `StagePredictor.predict` takes (recompute_layers nullable Int64; the
    precision column too where present, PREDICTOR_INPUT_COLUMNS)."""
    import pandas as pd

    rl = cols["recompute_layers"]
    block = pd.array(np.nan_to_num(rl).astype(np.int64), dtype="Int64")
    block[np.isnan(rl)] = pd.NA
    return pd.DataFrame({**cols, "recompute_layers": block}).loc[:, [c for c in PREDICTOR_INPUT_COLUMNS if c in cols]]


def signature_columns(contexts: list[StageContext], layers: np.ndarray, codes: np.ndarray, ctx_index: np.ndarray,
                      model: ModelArch, seq_len: int) -> dict[str, np.ndarray]:
    """One signature row per (context, layers, option code) as numpy columns (SIGNATURE_COLUMNS; recompute_layers
    float64, NaN = none); ctx_index points into `contexts`. A mixture-of-experts model: its dense equivalent's
    columns plus the MoE ones (memx.planner.moe, issue #27), which memx.planner.moe.adjust reads."""
    if model.is_moe:
        return {**signature_columns(contexts, layers, codes, ctx_index, dense_equivalent(model), seq_len),
                **moe_columns(contexts, ctx_index)}
    gpu = np.array([c.gpu for c in contexts], dtype=object)[ctx_index]
    attr = {f: np.array([getattr(c, f) for c in contexts])[ctx_index]
            for f in ("tp", "micro_batch", "first", "last", "inflight", "distributed_optimizer", "dp", "sequence_parallel")}
    recompute = np.where(codes == NONE, Recompute.NONE.value,
                         np.where(codes == SELECTIVE, Recompute.SELECTIVE.value, Recompute.FULL.value))
    block = (codes >= 1) & (codes < layers)
    rl = np.where(block, codes, np.nan).astype(np.float64)
    n = len(layers)
    cp = np.array([c.context_parallel for c in contexts], dtype=np.int64)[ctx_index] if n else np.ones(0, np.int64)
    return {
        "gpu": gpu, "tp": attr["tp"].astype(np.int64), "layers": layers.astype(np.int64),
        "micro_batch": attr["micro_batch"].astype(np.int64), "seq_len": seq_len // cp,  # a cp rank's share
        "recompute": recompute, "recompute_layers": rl, "first": attr["first"].astype(bool),
        "last": attr["last"].astype(bool), "inflight": attr["inflight"].astype(np.int64),
        "hidden": np.full(n, model.hidden, dtype=np.int64), "ffn_hidden": np.full(n, model.ffn_hidden, dtype=np.int64),
        "heads": np.full(n, model.heads, dtype=np.int64), "query_groups": np.full(n, model.query_groups, dtype=np.int64),
        "vocab": np.full(n, model.vocab, dtype=np.int64), "mlp": np.full(n, model.mlp, dtype=object),
        "distributed_optimizer": attr["distributed_optimizer"].astype(bool), "dp": attr["dp"].astype(np.int64),
        "sequence_parallel": attr["sequence_parallel"].astype(bool),
        "tied_embeddings": tied_on_ends(model.tied_embeddings, attr["first"], attr["last"]),  # records' canonical form
        # not a records column: the closed form reads it where present (memx.planner.cost.precision_column)
        "precision": np.array([c.precision for c in contexts], dtype=object)[ctx_index],
    }
