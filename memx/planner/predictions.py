"""Predict every unique stage signature of a search once, and turn the answers into stage tables.

The cheap bound runs first: a stage context can hold at most n layers if its weights, gradients and
optimizer state alone (18 B/param, or 6 + 12/dp with the distributed optimizer:
memx.planner.cost.static_bytes_per_param — a lower bound of any real static memory) fit in capacity −
reserve. Signatures beyond that bound are never predicted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Cluster, ModelArch
from memx.planner.cost import MIB, stage_params_per_rank, static_bytes_per_param
from memx.planner.signatures import StagePredictor, predict_arrays, signature_columns
from memx.planner.tables import StageContext, StageTable, stage_options, stage_table


@dataclass(frozen=True, kw_only=True)
class PredictedTables:
    tables: dict[StageContext, StageTable]
    max_layers: dict[StageContext, int]  # the static-memory bound per context
    signatures: int  # unique signatures predicted
    predict_s: float


def params_per_rank(ctx: StageContext, layers: np.ndarray, model: ModelArch) -> np.ndarray:
    return stage_params_per_rank(layers, ctx.tp, ctx.first, ctx.last, model.hidden, model.ffn_hidden, model.heads,
                                 model.query_groups, model.vocab, model.mlp)


def static_bound(ctx: StageContext, model: ModelArch, limit_mib: float, n_cap: int) -> int:
    """Largest n ≤ n_cap whose static memory fits limit_mib (0 if not even one layer)."""
    n = np.arange(1, n_cap + 1)
    per_param = float(static_bytes_per_param(ctx.distributed_optimizer, ctx.dp))
    fits = params_per_rank(ctx, n, model) * per_param / MIB <= limit_mib
    return int(n[fits].max()) if fits.any() else 0


def predict_tables(contexts: dict[StageContext, int], cluster: Cluster, model: ModelArch, seq_len: int,
                   levels: tuple[str, ...], reserve_gib: float, predictor: StagePredictor) -> PredictedTables:
    """contexts maps each context to the most layers any layout may give it."""
    limits = {g.name: g.memory_mib - reserve_gib * 1024.0 for g in cluster.gpu_types}
    bounds = {c: static_bound(c, model, limits[c.gpu], cap) for c, cap in contexts.items()}
    ctx_list = [c for c in contexts if bounds[c] > 0]
    opts = {n: stage_options(n, levels) for n in range(1, model.layers + 1)}
    lay, code, cidx = [], [], []
    for i, c in enumerate(ctx_list):
        for n in range(1, bounds[c] + 1):
            lay.append(np.full(len(opts[n]), n))
            code.append(np.asarray(opts[n]))
            cidx.append(np.full(len(opts[n]), i))
    if not ctx_list:
        return PredictedTables(tables={}, max_layers=bounds, signatures=0, predict_s=0.0)
    layers, codes, ctx_index = (np.concatenate(x) for x in (lay, code, cidx))
    sigs = signature_columns(ctx_list, layers, codes, ctx_index, model, seq_len)
    t0 = time.perf_counter()
    pred = predict_arrays(predictor, sigs)
    predict_s = time.perf_counter() - t0
    t_all, m_all, s_all = pred["time_ms"], pred["peak_mem_mib"], pred["static_mem_mib"]
    k_max = max(len(o) for o in opts.values())
    tables: dict[StageContext, StageTable] = {}
    starts = np.searchsorted(ctx_index, np.arange(len(ctx_list) + 1))
    for i, c in enumerate(ctx_list):
        lo, hi = starts[i], starts[i + 1]
        lay_c = layers[lo:hi]
        n_max = model.layers
        per_n = {}
        static = np.zeros(n_max + 1)
        for n in range(1, bounds[c] + 1):
            sel = slice(lo + np.searchsorted(lay_c, n), lo + np.searchsorted(lay_c, n, side="right"))
            per_n[n] = (t_all[sel], m_all[sel])
            static[n] = s_all[sel].max()
        for n in range(bounds[c] + 1, n_max + 1):  # beyond the static bound: never feasible
            per_n[n] = (np.array([np.inf]), np.array([np.inf]))
        options = {n: (opts[n] if n <= bounds[c] else [opts[n][0]]) for n in range(1, n_max + 1)}
        params = np.concatenate([[0.0], params_per_rank(c, np.arange(1, n_max + 1), model)])
        tables[c] = stage_table(n_max, k_max, options, per_n, limits[c.gpu], static, params)
    return PredictedTables(tables=tables, max_layers=bounds, signatures=len(layers), predict_s=predict_s)
