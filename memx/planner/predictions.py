"""Predict every unique stage signature of a search once, and turn the answers into stage tables.

The cheap bound runs first: a stage context can hold at most n layers if its weights, gradients and
optimizer state alone (18 B/param, or 6 + 12/dp with the distributed optimizer:
memx.planner.cost.static_bytes_per_param — a lower bound of any real static memory) fit in capacity −
reserve. Signatures beyond that bound are never predicted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
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
# The predictors whose answers are elementwise functions of these signature columns (`_shared`), by exact type (a
# subclass may predict otherwise): the closed form's `inflight` only multiplies a peak's activations, its `dp` only
# divides the optimizer state (memx.planner.cost.predict_runtime_frame and predict_stage_frame, memx.planner.moe.adjust;
# tests/unit/test_plan_cpu_forms.py compares every table with asking each context's own rows).
BROADCAST_FIELDS: dict[type, tuple[str, ...]] = {AnalyticStageModel: ("inflight", "dp")}


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
    key = ci * (n_max + 1) + layers  # the (context, n) row, and below the (context, n, option) entry, as flat indices
    flat = key * k_max + pos
    codes = option_code.reshape(-1).take(layers * k_max + pos)
    t0 = time.perf_counter()
    pred = predict_rows(predictor, ctx_list, layers, codes, ci, model, seq_len, cluster)
    predict_s = time.perf_counter() - t0
    shape = (len(ctx_list), n_max + 1, k_max)
    times, mems = np.full(shape, np.inf), np.full(shape, np.inf)
    times.reshape(-1)[flat], mems.reshape(-1)[flat] = pred["time_ms"], pred["peak_mem_mib"]
    highs = _highs(pred, shape, flat)  # the upper memory bound, where the predictor gives one
    _interleaved(ctx_list, times, mems, option_code, highs)  # interleaved contexts: peaks from their twins
    static = np.zeros(shape[:2])  # beyond the static bound: never predicted, never feasible
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    static.flat[key[starts]] = np.maximum.reduceat(pred["static_mem_mib"], starts)
    limit = np.array([limits[c.gpu] for c in ctx_list])[:, None]
    # one (n, option) code table for all; each n over its options only (`ladders_banded`)
    t, m, code, length, fit = ladders_banded(times, mems, option_code, option_ok.sum(axis=1), limit[:, 0])
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
    ~100 fresh arrays of every row (issue #26: 170 MB of first-touch pages on three-vendor-20). One listed in
    BROADCAST_FIELDS is asked once for the contexts that differ only in those fields (`_shared`)."""
    fields = BROADCAST_FIELDS.get(type(predictor), ()) if getattr(predictor, "ROW_WISE", False) else ()
    if fields and len(layers):
        return _shared(predictor, fields, ctx_list, layers, codes, ci, model, seq_len, cluster)
    return _predicted(predictor, ctx_list, layers, codes, ci, model, seq_len, cluster)


def _predicted(predictor: StagePredictor, ctx_list: list[StageContext], layers: np.ndarray, codes: np.ndarray,
               ci: np.ndarray, model: ModelArch, seq_len: int, cluster: Cluster,
               members: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """predict_rows' columns, ROW_CHUNK rows at a time for a ROW_WISE predictor. `members`: signature columns as
    (m, len(ctx_list)) arrays, every row's column then the (m,) column of its context (`_shared`); every answer
    comes back as (m, rows)."""
    gpus = {g.name: g for g in cluster.gpu_types}
    step = ROW_CHUNK if getattr(predictor, "ROW_WISE", False) else max(len(layers), 1)
    parts = []
    for lo in range(0, len(layers), step):
        sl = slice(lo, lo + step)
        c0, c1 = (int(ci[sl].min()), int(ci[sl].max()) + 1) if len(ci) else (0, 0)  # the chunk's contexts only
        sub, at = ctx_list[c0:c1], ci[sl] - c0
        sigs = signature_columns(sub, layers[sl], codes[sl], at, model, seq_len)
        for f, col in (members or {}).items():
            sigs[f] = col[:, c0:c1].take(at, axis=1)
        pred = moe.adjust(predict_arrays(predictor, sigs), sigs, model, gpus,
                          measured_dense_shift(predictor, sigs, model))
        parts.append(add_ring_terms(pred, sigs, sub, at, cluster))  # cp > 1 (context_parallel)
    if members:  # every column (m, rows)
        m = len(next(iter(members.values())))
        parts = [{k: np.broadcast_to(v, (m, v.shape[-1])) for k, v in p.items()} for p in parts]
        return {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _shared(predictor: StagePredictor, fields: tuple[str, ...], ctx_list: list[StageContext], layers: np.ndarray,
            codes: np.ndarray, ci: np.ndarray, model: ModelArch, seq_len: int,
            cluster: Cluster) -> dict[str, np.ndarray]:
    """predict_rows for a predictor whose answers are elementwise functions of the signature columns named by
    context `fields` (BROADCAST_FIELDS: each answer the same arithmetic whether such a column holds one number
    per row or an (m, rows) array broadcast against the other columns — the closed form's `inflight`, which only
    multiplies a peak's activations, and `dp`, which only divides the optimizer state: memx.planner.cost,
    memx.planner.moe.adjust). Contexts equal but for those fields (a pipeline's stages of one GPU, tp and micro
    batch, at each dp: three-vendor-20's 612 contexts are 99 groups) are asked once, on the rows of the member
    with the most layers (the others' rows are a prefix: n ascending, the same options for each n), those columns
    (m, rows) with the members' values; groups of m members are asked together. Each row's answers are then
    gathered from its group's: the same values as `_predicted` on every row (issue #26)."""
    groups: dict[tuple, list[int]] = {}
    rest = [f.name for f in fields_of(StageContext) if f.name not in fields]
    for i, c in enumerate(ctx_list):
        groups.setdefault(tuple(map(vars(c).__getitem__, rest)), []).append(i)
    if len(groups) == len(ctx_list):  # nothing shared
        return _predicted(predictor, ctx_list, layers, codes, ci, model, seq_len, cluster)
    if type(predictor) is AnalyticStageModel and isinstance(predictor.runtime, str) and predictor.runtime != "none":
        predictor = replace(predictor, runtime=dict(predictor.profiles()))  # the catalog read once, not per call
    start = np.searchsorted(ci, np.arange(len(ctx_list) + 1))  # context i's rows: start[i]:start[i + 1]
    count = np.diff(start)
    gs = sorted(groups.values(), key=len)  # by size: the groups of one size asked together, ≤ ROW_CHUNK rows a call
    reps = np.array([max(g, key=count.__getitem__) for g in gs])
    calls, rows_in = [], 0
    for k in range(1, len(gs)):
        rows_in += count[reps[k - 1]]
        if len(gs[k]) != len(gs[k - 1]) or rows_in + count[reps[k]] > ROW_CHUNK:
            calls.append(k)
            rows_in = 0
    head = np.empty(len(ctx_list), dtype=np.intp)  # where context i's answers start in the gathered ones
    out: dict[str, list[np.ndarray]] = {}
    offset = 0
    for k0, k1 in zip([0, *calls], [*calls, len(gs)]):
        part, m = gs[k0:k1], len(gs[k0])
        n_rows = count[reps[k0:k1]]
        first = np.cumsum(n_rows) - n_rows  # group k's rows start at first[k - k0]
        rows = np.repeat(start[reps[k0:k1]] - first, n_rows) + np.arange(n_rows.sum())
        cols = {f: np.array([[getattr(ctx_list[i], f) for i in g] for g in part], dtype=np.int64).T
                for f in fields}  # (m, groups)
        pred = _predicted(predictor, [ctx_list[r] for r in reps[k0:k1]], layers[rows], codes[rows],
                          np.repeat(np.arange(k1 - k0), n_rows), model, seq_len, cluster, cols)
        for k, v in pred.items():
            out.setdefault(k, []).append(v.reshape(-1))
        for g, f0 in zip(part, first):
            head[g] = offset + np.arange(len(g)) * len(rows) + f0
        offset += m * len(rows)
    src = np.repeat(head - start[:-1], count) + np.arange(len(layers))
    return {k: np.concatenate(v).take(src) for k, v in out.items()}


BAND_ELEMENTS = 1 << 14  # (contexts × rows × positions) a `ladders` call of ladders_banded: its temporaries in cache


def ladders_banded(times: np.ndarray, mems: np.ndarray, codes: np.ndarray, widths: np.ndarray,
                   limit_mib: np.ndarray) -> tuple[np.ndarray, ...]:
    """`ladders` of (contexts, n, K) times and mems whose row n holds its options in its first widths[n] positions
    (+inf after; codes: the (n, K) code table; limit_mib: (contexts,)): the same arrays, sorting only the first
    positions of each row. Rows n whose widths share a power-of-two band (3–4, 5–8, 9–16, …) are one `ladders`
    call over that band's widest positions, BAND_ELEMENTS at a time. Exact: sorted, the +inf positions past a
    row's width come after the others (ties by position) and are never kept, so the levels, lengths and fits
    are those of the narrow row, and every position past the band's is padding, which holds the top level —
    as the band's last position does (padding, or the top level itself). Three-vendor-20: 34 positions a row,
    18.5 options on average (issue #26)."""
    contexts, rows, k = times.shape
    t, m = np.full(times.shape, np.inf), np.full(times.shape, np.inf)
    c = np.full(times.shape, NONE, dtype=np.int64)
    length, fit = np.zeros((contexts, rows), dtype=np.int64), np.full((contexts, rows), -1, dtype=np.int64)
    band = [int(w - 1).bit_length() if w else -1 for w in widths]  # -1: no option (n = 0), an empty ladder
    n0 = 0
    while n0 < rows:
        n1 = n0 + 1
        while n1 < rows and band[n1] == band[n0]:
            n1 += 1
        w = int(max(widths[n0:n1]))
        if w:
            pad = np.minimum(np.arange(k), w - 1)
            per = max(1, BAND_ELEMENTS // ((n1 - n0) * w))
            for c0 in range(0, contexts, per):
                cs, ns = slice(c0, c0 + per), slice(n0, n1)
                lt, lm, lc, length[cs, ns], fit[cs, ns] = ladders(times[cs, ns, :w], mems[cs, ns, :w], codes[ns, :w],
                                                                  limit_mib[cs, None])
                t[cs, ns], m[cs, ns], c[cs, ns] = lt.take(pad, axis=2), lm.take(pad, axis=2), lc.take(pad, axis=2)
        n0 = n1
    return t, m, c, length, fit


def with_twins(contexts: dict[StageContext, int]) -> dict[StageContext, int]:
    """`contexts` plus the plain twins of every interleaved context (same layer cap)."""
    out = dict(contexts)
    for c, cap in contexts.items():
        for twin, _ in context_twins(c) if c.virtual_stages > 1 else ():
            out[twin] = max(out.get(twin, 0), cap)
    return out


def _highs(pred: dict[str, np.ndarray], shape: tuple[int, ...], where: np.ndarray) -> np.ndarray | None:
    """(context, n, option) upper memory bounds (`peak_mem_mib_high`, INTERVAL_COLUMNS; NaN where a row has
    none, +inf where nothing was predicted); None when the predictor gives no interval at all (as
    memx.planner.estimate.upper_margins: then the point margin stands)."""
    col = pred.get("peak_mem_mib_high")
    if col is None or np.isnan(col).all():
        return None
    highs = np.full(shape, np.inf)
    highs.reshape(-1)[where] = col  # where: flat indices
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
