"""Mixture-of-experts stages in the learned predictor (issue #27; docs/predictor.md §Mixture of experts).

The search hands every stage predictor a MoE stage as its dense equivalent's signature plus the stage's expert
columns (ep, the expert dp group, the all-to-all link: memx.planner.moe.moe_columns), and adds the closed form's
expert terms to whatever the predictor returns (memx.planner.moe.adjust: the experts' parameters and state, the
all-to-all, the router, the extra activations). Records of MoE stages (memx.domain.records.MOE_COLUMNS) hold what
the real MoE stage measured. So the learned predictor learns, on a MoE row, the measurement minus the closed form's
expert terms (`closed_form_terms`) — the value that, once the planner adds those terms, is the measured stage —
with the MoE signature as features (`MOE_FEATURES`: ep, experts per GPU, tokens per local expert, the all-to-all's
GB/s): the trees learn where the closed form's average-path experts miss (grouped GEMMs of few tokens per expert,
the all-to-all on its link). A dense row's terms are 0: nothing changes for dense models.

The planner's columns carry no expert fields of the model (num_experts, top-k, …): the predictor keeps those of
the MoE models it was trained on, by their dense equivalent's model columns (`structures_seen`), and fills them
in (`with_structures`); a MoE stage of a model it never saw stays its dense equivalent, as before this change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from memx.domain.moe_records import (MOE_DEFAULTS, MOE_STAGE_COLUMNS, expert_model, model_moe_fields,
                                     moe_derived)
from memx.domain.specs import GpuType
from memx.planner import moe
from memx.planner.signatures import columns_frame

MOE_FEATURES = ("expert_parallel", "experts_per_gpu", "tokens_per_expert", "a2a_gbps")
MODEL_KEY = ("hidden", "ffn_hidden", "heads", "query_groups", "vocab", "mlp")  # the dense equivalent's columns
MOE_MODEL_COLUMNS = tuple(c for c in MOE_DEFAULTS if c not in MOE_STAGE_COLUMNS)
# a MoE row's label is at least this share of its measurement (our choice; in the profiles of bench/moe_learned.py
# the closed form's expert terms stay well below the measurements, so the floor does not bind there)
LABEL_FLOOR = 0.05


def _keys(sigs: pd.DataFrame) -> np.ndarray:
    return sigs.loc[:, list(MODEL_KEY)].astype(str).agg("|".join, axis=1).to_numpy()


def _moe(sigs: pd.DataFrame) -> np.ndarray:
    return (pd.to_numeric(sigs["num_experts"], errors="coerce").fillna(0).to_numpy() > 0) if "num_experts" in sigs \
        else np.zeros(len(sigs), dtype=bool)


DENSE_LAYERS = "dense_layers_ffn_hidden"  # a structure's extra entry: the dense MLP sizes its dense rows measured


def structures_seen(df: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The expert fields of the MoE models among training rows, by their dense equivalent's model columns; with
    DENSE_LAYERS the MLP sizes of the rows of the same shape but another MLP size and no experts — the dense-first
    layers of such a model, measured as the dense layers they are (memx.profiling.design.dense_first_points)."""
    moe = _moe(df)
    moe_rows = df[moe]
    if moe_rows.empty:
        return {}
    first = moe_rows.assign(_key=_keys(moe_rows)).drop_duplicates("_key")
    seen = {k: model_moe_fields(expert_model(r)) for k, r in zip(first["_key"], first.to_dict("records"))}
    dense = df[~moe]
    shape = [c for c in MODEL_KEY if c != "ffn_hidden"]
    shapes = dense.loc[:, shape].astype(str).agg("|".join, axis=1).to_numpy() if len(dense) else np.array([], dtype=str)
    for key, row in zip(first["_key"], first.to_dict("records")):
        own = "|".join(str(row[c]) for c in shape)
        sizes = sorted({int(f) for f, s in zip(dense["ffn_hidden"], shapes) if s == own and int(f) != int(row["ffn_hidden"])})
        if sizes:
            seen[key][DENSE_LAYERS] = sizes
    return seen


def dense_layers_measured(predictor, model) -> bool:
    """`measures_dense_layers` of a learned predictor (memx.learn.model.LearnedStagePredictor.measures_dense_layers,
    which memx.planner.moe_dense asks): of its training rows' structures (`moe_seen`)."""
    return measures_dense_layers(predictor.moe_seen, model)


def measures_dense_layers(seen: Mapping[str, Mapping[str, Any]], model) -> bool:
    """Whether training rows `seen` (`structures_seen`) held `model`'s dense-first layers measured as dense layers of
    its `ffn_hidden` (memx.planner.moe_dense.measures_dense_layers asks; the planner then takes those layers from the
    predictor, not from the closed form's MLP difference)."""
    if not model.is_moe or not model.moe_first_dense_layers:
        return False
    eq = moe.dense_equivalent(model)
    key = _keys(pd.DataFrame([{c: getattr(eq, c) for c in MODEL_KEY}]))[0]
    return model.ffn_hidden in seen.get(key, {}).get(DENSE_LAYERS, ())


def with_structures(sigs: pd.DataFrame, seen: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """`sigs` with the expert fields of the models in `seen` on rows that carry the planner's expert columns but
    no expert fields (the search's rows), and the derived columns (experts per GPU, tokens per expert) recomputed;
    unchanged when the predictor saw no MoE model."""
    if not seen or "expert_parallel" not in sigs or not len(sigs):
        return sigs
    given = _moe(sigs)
    keys = _keys(sigs)
    fill = ~given & np.isin(keys, list(seen))
    if not fill.any():
        return sigs
    out = sigs.copy()
    for c in MOE_MODEL_COLUMNS:
        col = out[c].to_numpy(dtype=np.float64, na_value=np.nan) if c in out else np.full(len(out), np.nan)
        col = np.where(np.isnan(col), float(MOE_DEFAULTS[c]), col)
        col[fill] = [float(seen[k][c]) for k in keys[fill]]
        out[c] = col
    for c in MOE_STAGE_COLUMNS:
        if c not in out:
            out[c] = float(MOE_DEFAULTS[c])
    return out.assign(**moe_derived(out))


def feature_arrays(sigs: pd.DataFrame) -> dict[str, np.ndarray]:
    """The MoE features (MOE_FEATURES) as float64 arrays; a dense stage's (ep 1, the rest 0) on rows without
    expert fields."""
    n = len(sigs)
    col = lambda c: (pd.to_numeric(sigs[c], errors="coerce").fillna(MOE_DEFAULTS[c]).to_numpy(np.float64)
                     if c in sigs else np.full(n, float(MOE_DEFAULTS[c])))
    if "num_experts" not in sigs:  # the search's rows of a model the predictor never saw with experts: dense
        return {c: np.full(n, float(MOE_DEFAULTS.get(c, 0.0))) for c in MOE_FEATURES}
    moe = _moe(sigs)
    return {"expert_parallel": np.where(moe, col("expert_parallel"), 1.0), **moe_derived(sigs),
            "a2a_gbps": np.where(moe, col("a2a_gbps"), 0.0)}


def closed_form_terms(sigs: pd.DataFrame, gpus: Mapping[str, GpuType] | None) -> dict[str, np.ndarray]:
    """(time_ms, peak_mem_mib, static_mem_mib) the closed form adds to a MoE row's dense equivalent
    (memx.planner.moe.adjust, the model rebuilt from the row: memx.domain.records.expert_model); 0 on dense rows
    and every row when `gpus` is None (time then stays 0 too)."""
    n = len(sigs)
    out = {c: np.zeros(n) for c in ("time_ms", "peak_mem_mib", "static_mem_mib")}
    rows = np.flatnonzero(_moe(sigs))
    if not len(rows) or gpus is None:
        return out
    part = sigs.iloc[rows]
    structure = part.loc[:, [*MODEL_KEY, *MOE_MODEL_COLUMNS, "seq_len"]].astype(str).agg("|".join, axis=1).to_numpy()
    records = part.to_dict("records")
    for key in np.unique(structure):
        sel = np.flatnonzero(structure == key)
        frame = part.iloc[sel]
        cols = {c: frame[c].to_numpy() for c in frame.columns}
        cols.update({c: pd.to_numeric(frame[c]).fillna(MOE_DEFAULTS[c]).to_numpy(np.float64) if c in frame
                     else np.full(len(sel), float(MOE_DEFAULTS[c])) for c in MOE_STAGE_COLUMNS})
        got = moe.adjust({c: np.zeros(len(sel)) for c in out}, cols, expert_model(records[sel[0]]), gpus)
        for c in out:
            out[c][rows[sel]] = got[c]
    return out


def labels(sigs: pd.DataFrame, gpus: Mapping[str, GpuType] | None, time_ms: np.ndarray, peak_mem_mib: np.ndarray,
           static_mem_mib: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' labels (time, peak, static): a MoE row's measurement less the closed form's expert terms
    (`closed_form_terms`), floored at LABEL_FLOOR of it; dense rows' unchanged."""
    terms = closed_form_terms(sigs, gpus)
    label = lambda y, d: np.where(d != 0, np.maximum(y - d, LABEL_FLOOR * y), y)
    return (label(time_ms, terms["time_ms"]), label(peak_mem_mib, terms["peak_mem_mib"]),
            label(static_mem_mib, terms["static_mem_mib"]))


def frame_of(cols: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """The search's numpy signature columns (memx.planner.signatures.signature_columns) as the DataFrame a learned
    predictor reads: the predictor input columns and a MoE model's expert columns where present."""
    frame = columns_frame(dict(cols))
    extra = {c: np.asarray(cols[c], dtype=np.float64) for c in MOE_STAGE_COLUMNS if c in cols}
    return frame.assign(**extra) if extra else frame


def predict_columns(predictor: Any, cols: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """`predictor.predict` on the search's columns with the expert columns kept (memx.planner.signatures.predict_arrays
    calls a predictor's `predict_columns` where it has one; the plain DataFrame path keeps PREDICTOR_INPUT_COLUMNS
    only, which would drop ep and the all-to-all link)."""
    return predictor.predict(frame_of(cols))
