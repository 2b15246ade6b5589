"""A MoE model's dense-first layers from the predictor that measured them (issue #27 session 5; docs/planner.md
§Mixture of experts): `measured_dense_shift` gives memx.planner.moe.adjust what a stage's dense layers change
against its dense-equivalent prediction, from the predictor itself, where it says it measured them
(memx.profiling.design.dense_first_points; memx.learn.model.LearnedStagePredictor.measures_dense_layers). The
closed form (no such method) keeps its MLP difference (memx.planner.moe.time_delta_ms and the memory terms)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from memx.domain.records import nullable_floats
from memx.domain.specs import ModelArch
from memx.planner import moe
from memx.planner.signatures import predict_arrays


def measured_dense_shift(predictor, cols: Mapping[str, np.ndarray], model: ModelArch) -> dict[str, np.ndarray] | None:
    """`dense_layers_shift` where `predictor` measured `model`'s dense-first layers, else None (the closed form's
    MLP difference then stands in, memx.planner.moe.adjust)."""
    if not model.is_moe or not model.moe_first_dense_layers or not measures_dense_layers(predictor, model):
        return None
    return dense_layers_shift(predictor, cols, model)


def measures_dense_layers(predictor, model: ModelArch) -> bool:
    """Whether `predictor` measured `model`'s dense-first layers as the dense layers they are (a predictor's
    `measures_dense_layers(model)`, e.g. memx.learn.model.LearnedStagePredictor; the closed form has none: False)."""
    fn = getattr(predictor, "measures_dense_layers", None) if predictor is not None else None
    return bool(fn(model)) if callable(fn) else False


def dense_layers_shift(predictor, cols: Mapping[str, np.ndarray], model: ModelArch) -> dict[str, np.ndarray]:
    """Per row, what the stage's k' = `split_layers` dense layers change against its dense-equivalent prediction:
    P(the stage's first k' layers as `dense_layers_model`, no expert columns) − P(the same k' layers as the dense
    equivalent, the row's expert columns), for time, peak and static; 0 on rows without dense layers. Both
    signatures keep the row's GPU, tp, micro batch, first/last, inflight and options, so the embedding / output layer
    and the fixed memory cancel and the difference is the layers' (per-layer additivity of a stage's time and
    memory, the assumption of the minimal-set profile's layer sweep, paper §3.2); a block recompute of N layers
    recomputes min(N, k') of them (Megatron recomputes the first N)."""
    _, n_dense = moe.split_layers(model, cols["layers"], cols["first"])
    rows = np.flatnonzero(n_dense > 0)
    out = {c: np.zeros(len(n_dense)) for c in ("time_ms", "peak_mem_mib", "static_mem_mib")}
    if not len(rows):
        return out
    part = {c: np.asarray(v)[rows] for c, v in cols.items()}
    k = n_dense[rows]
    rl = nullable_floats(part["recompute_layers"])
    eq = {**part, "layers": k.astype(part["layers"].dtype), "recompute_layers": np.where(np.isnan(rl), rl, np.minimum(rl, k))}
    dense = {c: v for c, v in eq.items() if c not in moe.MOE_COLUMNS}
    ffn = moe.dense_layers_model(model).ffn_hidden
    dense["ffn_hidden"] = np.full(len(rows), ffn, dtype=np.asarray(part["ffn_hidden"]).dtype)
    p_eq, p_dense = predict_arrays(predictor, eq), predict_arrays(predictor, dense)
    for c in out:
        if c in p_eq and c in p_dense:
            out[c][rows] = p_dense[c] - p_eq[c]
    return out
