"""Predict every unique stage signature of a search once, and turn the answers into stage tables.

The cheap bound runs first: a stage context can hold at most n layers if its weights, gradients and
optimizer state alone (18 B/param, or 6 + 12/dp with the distributed optimizer:
memx.planner.cost.static_bytes_per_param — a lower bound of any real static memory) fit in capacity −
reserve. Signatures beyond that bound are never predicted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import fields as fields_of

import numpy as np

from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import Cluster, ModelArch
from memx.planner.context_parallel import add_ring_terms, runtime_profiles
from memx.planner.cost import MIB, AnalyticStageModel, stage_params_per_rank, static_bytes_per_param
from memx.planner import moe, table_cache
from memx.planner.interleave import allowed_layers, combine, context_twins
from memx.planner.moe_dense import measured_dense_shift
from memx.planner.signatures import StagePredictor, predict_arrays, signature_columns
from memx.planner.tables import NONE, StageContext, StageTable, ladders, set_fitted, stage_options


ROW_CHUNK = 1 << 14  # signature rows predicted at once by a row-wise predictor (`predict_rows`)
LADDER_CHUNK = 16  # contexts whose ladders are sorted at once (16 × 33 × 34 floats: about malloc's mmap threshold)


@dataclass(frozen=True, kw_only=True)
class PredictedTables:
    tables: dict[StageContext, StageTable]
    max_layers: dict[StageContext, int]  # the static-memory bound per context
    signatures: int  # unique signatures predicted
    predict_s: float


def params_per_rank(ctx: StageContext, layers: np.ndarray, model: ModelArch) -> np.ndarray:
    """Parameters per rank whose data-parallel step the stage pays (a MoE model: memx.planner.moe.dp_params_per_rank)."""
    if model.is_moe:
        return moe.dp_params_per_rank(model, ctx, layers, params_per_rank(ctx, layers, moe.dense_equivalent(model)))
    return stage_params_per_rank(layers, ctx.tp, ctx.first, ctx.last, model.hidden, model.ffn_hidden, model.heads,
                                 model.query_groups, model.vocab, model.mlp, tied=model.tied_embeddings)


def static_bound(ctx: StageContext, model: ModelArch, limit_mib: float, n_cap: int) -> int:
    """Largest n ≤ n_cap whose static memory fits limit_mib (0 if not even one layer)."""
    n = np.arange(1, n_cap + 1)
    per_param = float(static_bytes_per_param(ctx.distributed_optimizer, ctx.dp, ctx.precision))
    if model.is_moe:  # experts' state sharded over dp / ep (memx.planner.moe)
        eq = moe.dense_equivalent(model)
        static = moe.stage_static_bytes(model, ctx, n, params_per_rank(ctx, n, eq) * per_param)
    else:
        static = params_per_rank(ctx, n, model) * per_param
    fits = static / MIB <= limit_mib
    return int(n[fits].max()) if fits.any() else 0


def static_bounds(contexts: dict[StageContext, int], model: ModelArch, limits: dict[str, float]) -> dict[StageContext, int]:
    """`static_bound` of every context (its layer cap from `contexts`, its GPU's limit from `limits`): one
    (context, n) broadcast of the same elementwise arithmetic for a dense model, context by context for MoE."""
    ctx = list(contexts)
    if model.is_moe or not ctx:
        return {c: static_bound(c, model, limits[c.gpu], contexts[c]) for c in ctx}
    caps = np.array([contexts[c] for c in ctx])
    n = np.arange(1, int(caps.max()) + 1)[None, :]
    col = {f: np.array([getattr(c, f) for c in ctx])[:, None] for f in ("tp", "first", "last", "distributed_optimizer", "dp")}
    per_param = static_bytes_per_param(col["distributed_optimizer"], col["dp"],
                                       np.array([[c.precision] for c in ctx], dtype=object))
    params = stage_params_per_rank(n, col["tp"], col["first"], col["last"], model.hidden, model.ffn_hidden, model.heads,
                                   model.query_groups, model.vocab, model.mlp, tied=model.tied_embeddings)
    limit = np.array([limits[c.gpu] for c in ctx])[:, None]
    fits = (params * per_param / MIB <= limit) & (n <= caps[:, None])
    return dict(zip(ctx, np.where(fits, n, 0).max(axis=1).tolist()))


def predict_tables(contexts: dict[StageContext, int], cluster: Cluster, model: ModelArch, seq_len: int,
                   levels: tuple[str, ...], reserve_gib: float, predictor: StagePredictor) -> PredictedTables:
    """contexts maps each context to the most layers any layout may give it. Vectorised over contexts,
    layer counts and options: one (context, n, option) array of predictions, all ladders at once
    (memx.planner.tables.ladders)."""
    limits = {g.name: usable_capacity_mib(g) - reserve_gib * 1024.0 for g in cluster.gpu_types}
    cache = table_cache.active()  # the closed form's tables of an earlier process (memx.planner.table_cache)
    name = None if cache is None else _cache_key(contexts, cluster, model, seq_len, levels, reserve_gib, limits, predictor)
    contexts = with_twins(contexts)  # interleaved contexts' ⌊k/v⌋ + 1 twins (memx.planner.interleave)
    if name is not None and (hit := _unpacked(cache.get(name), list(contexts))) is not None:
        return hit
    bounds = static_bounds(contexts, model, limits)
    ctx_list = [c for c in contexts if bounds[c] > 0]
    if not ctx_list:
        return PredictedTables(tables={}, max_layers=bounds, signatures=0, predict_s=0.0)
    n_max = model.layers
    opts = {n: stage_options(n, levels) for n in range(1, n_max + 1)}
    k_max = max(len(o) for o in opts.values())
    option_code = np.full((n_max + 1, k_max), NONE, dtype=np.int64)  # (n, position) → option code
    option_ok = np.zeros((n_max + 1, k_max), dtype=bool)
    for n, o in opts.items():
        option_code[n, :len(o)], option_ok[n, :len(o)] = o, True
    cap = np.array([bounds[c] for c in ctx_list])
    rows = np.arange(n_max + 1)
    # every (context, n ≤ its static bound, option), context-major, n ascending, options in order
    ci, layers, pos = np.nonzero(option_ok[None, :, :] & (rows[None, :, None] <= cap[:, None, None]))
    codes = option_code[layers, pos]
    t0 = time.perf_counter()
    pred = predict_rows(predictor, ctx_list, layers, codes, ci, model, seq_len, cluster)
    predict_s = time.perf_counter() - t0
    shape = (len(ctx_list), n_max + 1, k_max)
    times, mems = np.full(shape, np.inf), np.full(shape, np.inf)
    times[ci, layers, pos], mems[ci, layers, pos] = pred["time_ms"], pred["peak_mem_mib"]
    highs = _highs(pred, shape, (ci, layers, pos))  # the upper memory bound, where the predictor gives one
    _interleaved(ctx_list, times, mems, option_code, highs)  # interleaved contexts: peaks from their twins
    static = np.zeros(shape[:2])  # beyond the static bound: never predicted, never feasible
    key = ci * (n_max + 1) + layers
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    static.flat[key[starts]] = np.maximum.reduceat(pred["static_mem_mib"], starts)
    limit = np.array([limits[c.gpu] for c in ctx_list])[:, None]
    # one (n, option) code table for all; LADDER_CHUNK contexts at a time (each row's ladder is its own: the same
    # values, the temporaries of a chunk in cache)
    t, m, code, length, fit = (np.concatenate(x) for x in zip(*(
        ladders(times[i:i + LADDER_CHUNK], mems[i:i + LADDER_CHUNK], option_code, limit[i:i + LADDER_CHUNK])
        for i in range(0, len(ctx_list), LADDER_CHUNK))))
    attr = {f: np.array([getattr(c, f) for c in ctx_list])[:, None] for f in ("tp", "first", "last")}
    params = np.zeros(shape[:2])
    params[:, 1:] = stage_params_per_rank(rows[None, 1:], attr["tp"], attr["first"], attr["last"], model.hidden,
                                          model.ffn_hidden, model.heads, model.query_groups, model.vocab, model.mlp,
                                          tied=model.tied_embeddings)
    if model.is_moe:  # the data-parallel step of expert and non-expert gradients (memx.planner.moe)
        params = np.stack([np.r_[0.0, params_per_rank(c, rows[1:], model)] for c in ctx_list])
    high = None if highs is None else ladder_highs(highs, mems, m, code, option_code, option_ok)
    tables = {c: StageTable(time_ms=t[i], peak_mib=m[i], code=code[i], length=length[i], fit=fit[i],
                            static_mib=static[i], params_per_rank=params[i],
                            high_mib=None if high is None else high[i]) for i, c in enumerate(ctx_list)}
    set_fitted(list(tables.values()), (t, fit))  # what every layout's slowdown caps read (memx.planner.prepared)
    out = PredictedTables(tables=tables, max_layers=bounds, signatures=len(layers), predict_s=predict_s)
    if name is not None:
        cache.put(name, _packed(out, list(contexts), (t, m, code, length, fit, static, params, high)))
    return out


def predict_rows(predictor: StagePredictor, ctx_list: list[StageContext], layers: np.ndarray, codes: np.ndarray,
                 ci: np.ndarray, model: ModelArch, seq_len: int, cluster: Cluster) -> dict[str, np.ndarray]:
    """The predictor's columns for the signature rows (ctx_list[ci], layers, codes), MoE and cp terms added. A
    predictor that declares its rows independent (`ROW_WISE`: each row's answer a function of that row alone, no
    state kept per call — the closed form) is called on ROW_CHUNK rows at a time: the same elementwise arithmetic
    on every row, so the same values, while the temporaries of a chunk stay in cache and are reused instead of
    ~100 fresh arrays of every row (issue #26: 170 MB of first-touch pages on three-vendor-20)."""
    gpus = {g.name: g for g in cluster.gpu_types}
    step = ROW_CHUNK if getattr(predictor, "ROW_WISE", False) else max(len(layers), 1)
    parts = []
    for lo in range(0, len(layers), step):
        sl = slice(lo, lo + step)
        c0, c1 = (int(ci[sl].min()), int(ci[sl].max()) + 1) if len(ci) else (0, 0)  # the chunk's contexts only
        sub, at = ctx_list[c0:c1], ci[sl] - c0
        sigs = signature_columns(sub, layers[sl], codes[sl], at, model, seq_len)
        pred = moe.adjust(predict_arrays(predictor, sigs), sigs, model, gpus,
                          measured_dense_shift(predictor, sigs, model))
        parts.append(add_ring_terms(pred, sigs, sub, at, cluster))  # cp > 1 (context_parallel)
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def with_twins(contexts: dict[StageContext, int]) -> dict[StageContext, int]:
    """`contexts` plus the plain twins of every interleaved context (same layer cap)."""
    out = dict(contexts)
    for c, cap in contexts.items():
        for twin, _ in context_twins(c) if c.virtual_stages > 1 else ():
            out[twin] = max(out.get(twin, 0), cap)
    return out


def _highs(pred: dict[str, np.ndarray], shape: tuple[int, ...], where: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """(context, n, option) upper memory bounds (`peak_mem_mib_high`, INTERVAL_COLUMNS; NaN where a row has
    none, +inf where nothing was predicted); None when the predictor gives no interval at all (as
    memx.planner.estimate.upper_margins: then the point margin stands)."""
    col = pred.get("peak_mem_mib_high")
    if col is None or np.isnan(col).all():
        return None
    highs = np.full(shape, np.inf)
    highs[where] = col
    return highs


def ladder_highs(highs: np.ndarray, mems: np.ndarray, peak: np.ndarray, code: np.ndarray, option_code: np.ndarray,
                 option_ok: np.ndarray) -> np.ndarray:
    """The upper bound of every ladder level (memx.planner.tables.StageTable.high_mib): max(high, point peak)
    of the level's option, the point peak where the interval is NaN (the margin the pick applies,
    estimate.upper_margins). highs, mems: (context, n, option position); peak, code: the ladders'."""
    eff = np.where(np.isnan(highs), mems, np.maximum(highs, mems))
    n_rows, k = option_code.shape
    pos_of = np.zeros((n_rows, int(option_code.max()) + 3), dtype=np.int64)  # (n, code + 2) → option position
    r, p = np.nonzero(option_ok)
    pos_of[r, option_code[r, p] + 2] = p
    n = np.arange(n_rows)[None, :, None]
    pos = pos_of[n, np.clip(code + 2, 0, pos_of.shape[1] - 1)]
    out = np.take_along_axis(eff, pos, axis=-1)
    return np.where(np.isfinite(peak), out, np.inf)


def _interleaved(ctx_list: list[StageContext], times: np.ndarray, mems: np.ndarray, option_code: np.ndarray,
                 highs: np.ndarray | None = None) -> None:
    """In place, for every interleaved context (virtual_stages > 1) of the (context, n, option) arrays: its
    peaks from its plain twins' (memx.planner.interleave.context_twins; a twin's static bound is at least the
    context's, so its entries exist wherever the context's do), and the options it cannot take (n or a
    block's layer count not a multiple of v, interleave.allowed_layers) made infeasible (+inf), so no ladder
    keeps them."""
    where = {c: i for i, c in enumerate(ctx_list)}
    n = np.arange(option_code.shape[0])[:, None]
    allowed: dict[int, np.ndarray] = {}  # (n, option) mask per v: the same for every context of that v
    for i, c in enumerate(ctx_list):
        if c.virtual_stages == 1:
            continue
        twins = context_twins(c)
        with np.errstate(invalid="ignore"):
            peak = combine([mems[where[t]] for t, _ in twins], [w for _, w in twins])
            if highs is not None:  # the upper bound from the twins' upper bounds, as estimate._predict_stages
                highs[i] = combine([highs[where[t]] for t, _ in twins], [w for _, w in twins])
        v = c.virtual_stages
        if v not in allowed:
            allowed[v] = np.vectorize(allowed_layers)(n, option_code, v)
        ok = allowed[v] & np.isfinite(times[i])
        times[i] = np.where(ok, times[i], np.inf)
        mems[i] = np.where(ok, peak, np.inf)


TABLE_FIELDS = ("time_ms", "peak_mib", "code", "length", "fit", "static_mib", "params_per_rank", "high_mib")


def _cache_key(contexts: dict[StageContext, int], cluster: Cluster, model: ModelArch, seq_len: int,
               levels: tuple[str, ...], reserve_gib: float, limits: dict[str, float], predictor) -> str | None:
    """The table cache's name for this call (memx.planner.table_cache), or None: only the closed form's tables
    are a function of their inputs and the code alone — its fields, its runtime profiles and, with cp > 1, the
    ring's (memx.planner.context_parallel.runtime_profiles) are part of the name."""
    if type(predictor) is not AnalyticStageModel or not contexts:
        return None
    fields = {f.name: getattr(predictor, f.name) for f in fields_of(predictor) if f.name not in ("runtime", "conf_root")}
    ring = runtime_profiles(cluster) if any(c.context_parallel > 1 for c in contexts) else None
    runtime = "none" if predictor.runtime == "none" else dict(predictor.profiles())  # as predict_columns reads it
    return table_cache.key("stage-tables", contexts, cluster, model, seq_len, list(levels), reserve_gib, limits,
                           type(predictor).__qualname__, fields, runtime, ring)


def _packed(pt: PredictedTables, contexts: list[StageContext], stacked: tuple) -> dict:
    """What the cache keeps of a table call: the static bounds in `contexts`' order, the predicted contexts' rows
    in it, and the stacked arrays every StageTable is a row of (TABLE_FIELDS; high_mib may be None)."""
    where = {c: i for i, c in enumerate(contexts)}
    return {"max_layers": [pt.max_layers[c] for c in contexts], "rows": [where[c] for c in pt.tables],
            "signatures": pt.signatures, "predict_s": pt.predict_s, **dict(zip(TABLE_FIELDS, map(_narrow, stacked)))}


def _narrow(a: np.ndarray | None) -> np.ndarray | tuple | None:
    """An integer array as (the smallest integer dtype that holds its values, its dtype): a third of the file."""
    if a is None or a.dtype.kind != "i" or not a.size:
        return a
    small = np.promote_types(np.min_scalar_type(int(a.min())), np.min_scalar_type(int(a.max())))
    return a.astype(small), a.dtype.str


def _widened(a):
    return a[0].astype(a[1]) if isinstance(a, tuple) else a


def _unpacked(data: dict | None, contexts: list[StageContext]) -> PredictedTables | None:
    """The PredictedTables `_packed` kept: the same contexts, every table a row of the same arrays (the same
    values, dtypes and layout), the fitted columns filled as predict_tables fills them; None for no entry or
    one of another form."""
    if data is None or len(data.get("max_layers", ())) != len(contexts):
        return None
    arrays = [_widened(data[f]) for f in TABLE_FIELDS]
    tables = {contexts[r]: StageTable(**{f: None if a is None else a[i] for f, a in zip(TABLE_FIELDS, arrays)})
              for i, r in enumerate(data["rows"])}
    set_fitted(list(tables.values()), (arrays[0], arrays[4]))  # TABLE_FIELDS' time_ms and fit
    return PredictedTables(tables=tables, max_layers=dict(zip(contexts, data["max_layers"])),
                           signatures=data["signatures"], predict_s=0.0)
