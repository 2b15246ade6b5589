"""Issue #26, plan CPU (session 5): each faster form gives exactly what it replaces — predictions in row chunks,
the slowdown caps and suffix counts of many layouts at once, the multipliers' quantiles per length, the box
min-max and range minima by flat takes, the closed form's one precision read once."""

from __future__ import annotations

import numpy as np
import pytest
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner import bounds, predictions
from memx.planner.bounds import RangeTable, _LOG2, _thin_many, flat_minmax, flat_table, suffix_min, suffix_minmax
from memx.planner.compositions import suffix_counts, suffix_counts_many
from memx.planner.cost import AnalyticStageModel
from memx.planner.runtime_terms import uniform_precision
from memx.planner.prepared import _slowdown_caps, layout_contexts, slowdown_caps_many
from memx.planner.space import enumerate_layouts
from memx.planner.tables import StageTable, ladders, set_fitted


def _table(rng, rows: int, k: int, nan: bool) -> StageTable:
    t = rng.uniform(10, 1000, (rows, k)).cumsum(axis=0)
    t[rng.random((rows, k)) < 0.1] = np.inf
    if nan:
        t[rng.integers(1, rows), 0] = np.nan
    z = np.zeros(rows)
    return StageTable(time_ms=t, peak_mib=t, code=np.zeros((rows, k), dtype=np.int64), length=np.full(rows, k),
                      fit=rng.integers(-1, k, rows), static_mib=z, params_per_rank=z)


def test_slowdown_caps_of_many_layouts_equal_each_layouts_own():
    rng = np.random.default_rng(5)
    pool = [_table(rng, 17, 3, nan=i % 7 == 0) for i in range(30)]
    pool[3].time_ms[:] = np.inf  # nothing finite
    set_fitted(pool)
    layouts = [tuple(pool[j] for j in rng.integers(0, len(pool), int(rng.integers(1, 9)))) for _ in range(200)]
    layouts.append((pool[3], pool[3]))  # no finite time at all: caps 0
    for total in (1, 16, 200):
        for factor in (1.0, 2.0):
            for got, stages in zip(slowdown_caps_many(layouts, total, factor), layouts):
                want = _slowdown_caps(stages, total, factor)
                assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.fixture(scope="module")
def peer():
    """The peer problem's layouts and predicted tables (a100-v100-16, llama2-7b, default)."""
    cl, mo, sp = load_cluster("a100-v100-16"), load_model("llama2-7b"), load_search("default")
    lays = enumerate_layouts(cl, mo, sp)
    pt = predictions.predict_tables(layout_contexts(lays, mo.layers), cl, mo, mo.seq_len, sp.recompute_levels,
                                    sp.reserve_gib, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    return cl, mo, sp, lays, pt


def test_slowdown_caps_of_a_search_equal_each_layouts_own(peer):
    _, mo, sp, lays, pt = peer
    stages = [tuple(pt.tables[c] for c in lay.contexts()) for lay in lays if all(c in pt.tables for c in lay.contexts())]
    assert len(stages) > 50
    for factor in (1.0, sp.max_stage_slowdown or 1.5):
        for got, st in zip(slowdown_caps_many(stages, mo.layers, factor), stages):
            assert np.array_equal(got, _slowdown_caps(st, mo.layers, factor))


def test_predictions_in_row_chunks_equal_one_call(peer, monkeypatch):
    """A row-wise predictor (AnalyticStageModel.ROW_WISE) predicts ROW_CHUNK rows at a time, the ladders are sorted
    BAND_ELEMENTS at a time: every table equal to the one-call tables, array by array, at chunk sizes that
    cut contexts anywhere."""
    cl, mo, sp, lays, pt = peer
    monkeypatch.setattr(predictions, "ROW_CHUNK", 777)
    monkeypatch.setattr(predictions, "BAND_ELEMENTS", 7 * 34)  # and the ladders of a few contexts at a time
    chunked = predictions.predict_tables(layout_contexts(lays, mo.layers), cl, mo, mo.seq_len, sp.recompute_levels,
                                         sp.reserve_gib, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    assert pt.signatures > 777 * 10 and chunked.tables.keys() == pt.tables.keys() and chunked.max_layers == pt.max_layers
    for c, t in pt.tables.items():
        for f in ("time_ms", "peak_mib", "code", "length", "fit", "static_mib", "params_per_rank", "fitted_ms"):
            assert np.array_equal(getattr(t, f), getattr(chunked.tables[c], f), equal_nan=True), (c, f)


def test_suffix_counts_of_many_layouts_equal_each_layouts_own():
    rng = np.random.default_rng(1)
    for _ in range(25):
        total = int(rng.integers(1, 130))
        allowed = [rng.random((int(rng.integers(1, 17)), total + 1 + int(rng.integers(0, 3)))) < rng.random()
                   for _ in range(int(rng.integers(1, 12)))]
        for got, ok in zip(suffix_counts_many(total, allowed), allowed):
            want = suffix_counts(total, ok)
            assert got.shape == want.shape and np.array_equal(got, want)


def _thin_one(lams):
    """bounds._thin as first written: one np.quantile per list."""
    kept = []
    for lam in sorted(lams):
        if not kept or lam > kept[-1] + 0.02 * abs(kept[-1]) + 1e-9:
            kept.append(lam)
    if len(kept) > 5:
        kept = sorted({0.0, *np.quantile(kept, np.linspace(0, 1, 4)).tolist()})
    return kept


def test_multipliers_thinned_together_equal_one_by_one():
    rng = np.random.default_rng(3)
    many = [(rng.random(int(rng.integers(1, 12))) * rng.choice([1e-3, 1.0, 100.0])).tolist() + [0.0]
            for _ in range(400)]
    assert sum(len(bounds._spread(x)) > 5 for x in many) > 50  # the quantile branch is exercised
    assert _thin_many(many) == [_thin_one(x) for x in many]


def _minmax_by_sort(env, r, a, b, total):
    """MinMax's bound by its definition: max(max_s env(s, a_s), the k-th smallest increment), k = L − Σ a."""
    out = np.empty(len(a))
    for i in range(len(a)):
        inc = np.sort(np.concatenate([env[r[i, s], a[i, s] + 1:b[i, s] + 1] for s in range(a.shape[1])]))
        k = total - a[i].sum()
        head = env[r[i], a[i]].max()
        out[i] = head if k <= 0 else (max(head, inc[k - 1]) if k <= len(inc) else np.inf)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_box_minmax_by_flat_take_equals_its_definition(seed):
    rng = np.random.default_rng(seed)
    rows, R, P, n = int(rng.integers(2, 40)), int(rng.integers(1, 30)), int(rng.integers(1, 9)), 300
    env = suffix_min(np.where(rng.random((R, rows)) < 0.1, np.inf, rng.random((R, rows)) * 100))
    a = rng.integers(0, rows, (n, P))
    b = np.minimum(a + rng.integers(0, rows, (n, P)) * (rng.random((n, 1)) < 0.3) + rng.integers(0, 3, (n, P)), rows - 1)
    r = rng.integers(0, R, (n, P))
    env32 = env.astype(np.float32).astype(np.float64)  # float32 values (as the fitted times): a float32 table
    assert flat_table(env).dtype == np.float64 and flat_table(env32).dtype == np.float32
    for e in (env, env32):
        for total in (1, rows, int(rng.integers(1, rows * P + 2))):
            want = _minmax_by_sort(e, r, a, b, total)
            got = flat_minmax(flat_table(e), rows, r, a, b, total)
            assert got.dtype == np.float64 and np.array_equal(got, want)
            assert np.array_equal(suffix_minmax(e, r, a, b, total), want)


def test_range_minima_by_flat_take_equal_the_windows():
    rng = np.random.default_rng(9)
    for C, maximum in ((0, False), (3, False), (0, True)):
        R, n = 13, 21
        x = rng.random((R, n, C) if C else (R, n))
        x[rng.random(x.shape) < 0.2] = np.inf if not maximum else -np.inf
        t = RangeTable(x, maximum=maximum)
        assert len(t.levels) == int(_LOG2[n]) + 1
        a = rng.integers(0, n, (200, 4))
        b = np.minimum(a + rng.integers(0, n, (200, 4)), n - 1)
        r = rng.integers(0, R, (200, 4))
        op = np.max if maximum else np.min
        want = np.array([[op(x[r[i, s], a[i, s]:b[i, s] + 1], axis=0) for s in range(4)] for i in range(200)])
        assert np.array_equal(t.query_rows(r, a, b), want)


def test_one_precision_is_read_once():
    col = np.array(["bf16"] * 5, dtype=object)
    assert uniform_precision(col) == "bf16"
    mixed = np.array(["bf16", "fp8", "bf16"], dtype=object)
    assert uniform_precision(mixed) is mixed
    assert bounds.JOINT_TIME  # the joint bounds stay on (their values are unchanged by this file's forms)


def test_bound_tables_with_one_row_for_missing_stages_bound_as_one_row_each(peer, monkeypatch):
    """BoxBounds keeps one row for all the missing stages of shorter layouts (bounds._compact_rows): every time
    bound and corner of the boxes of a search equals the bounds with a row per (layout, stage)."""
    from memx.planner.prepared import prepare
    from memx.planner.tables import StackedTables

    cl, mo, sp, lays, pt = peer
    preps = [p for lay in lays if (p := prepare(lay, pt, cl, mo, mo.seq_len, sp.max_stage_slowdown))]
    st = StackedTables.of([(p.stages, p.pipe) for p in preps])
    hi = np.zeros((len(preps), st.pp), dtype=np.int64)
    for i, p in enumerate(preps):
        hi[i, :p.lay.pp] = p.hi
    compact = bounds.BoxBounds(st, hi, mo.layers, sp.target_margin)
    monkeypatch.setattr(bounds, "_compact_rows", lambda real, cap, layouts, P: (
        np.arange(len(real)), np.arange(len(real)).reshape(layouts, P)))
    full = bounds.BoxBounds(st, hi, mo.layers, sp.target_margin)
    assert len(compact.t1) < len(full.t1) == len(preps) * st.pp
    a, b, li = full.root(np.arange(len(preps)))
    for _ in range(3):  # the roots and two generations of halves
        t = full.time_lb(a, b, li)
        assert np.array_equal(compact.time_lb(a, b, li), t)
        c1, c2 = full.corner(a, b, li, t), compact.corner(a, b, li, t)
        for f in ("max_mib", "var_mib2", "margin_ub", "stage_lo_mib", "stage_hi_mib"):
            assert np.array_equal(getattr(c1, f), getattr(c2, f)), f
        mu = np.full(len(a), 0.1)
        assert np.array_equal(c1.time_cut(np.arange(len(a)), mu=mu), c2.time_cut(np.arange(len(a)), mu=mu))
        s = (b - a).argmax(axis=1)
        rows = np.arange(len(a))
        mid = (a[rows, s] + b[rows, s]) // 2
        a2, b2 = a.copy(), b.copy()
        b2[rows, s], a2[rows, s] = mid, mid + 1
        a, b, li = full.tighten(np.concatenate([a, a2]), np.concatenate([b2, b]), np.concatenate([li, li]))
        assert all(np.array_equal(x, y) for x, y in zip((a, b, li), compact.tighten(a, b, li)))


def test_draws_in_groups_of_layouts_equal_one_group(monkeypatch):
    """sample_many draws DRAW_CHUNK draws' worth of whole layouts at a time, and sampled_medians scores
    SCORE_CHUNK plans at a time: the same draws, bit for bit, as one group of every layout."""
    from memx.planner import compositions

    rng = np.random.default_rng(4)
    for trial in range(12):
        total = int(rng.integers(2, 40))
        allowed = [rng.random((int(rng.integers(1, 9)), total + 1)) < rng.uniform(0.3, 1) for _ in range(20)]
        for ok in allowed:
            ok[:, 0] = False
        n = [int(x) for x in rng.integers(0, 800, len(allowed))]
        one = compositions.sample_many(total, allowed, n, np.random.default_rng(trial))
        monkeypatch.setattr(compositions, "DRAW_CHUNK", int(rng.integers(1, 900)))
        grouped = compositions.sample_many(total, allowed, n, np.random.default_rng(trial))
        monkeypatch.undo()
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(one, grouped))


def _predicted(peer, **kw):
    cl, mo, sp, lays, _ = peer
    args = dict(reserve_gib=sp.reserve_gib, predictor=AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    args.update(kw)
    return predictions.predict_tables(layout_contexts(lays, mo.layers), cl, mo, mo.seq_len, sp.recompute_levels,
                                      args["reserve_gib"], args["predictor"])


def test_cached_stage_tables_equal_the_predicted_ones(peer, tmp_path, monkeypatch):
    """A table-cache hit (memx.planner.table_cache) gives the tables predict_tables computes: every array equal,
    dtype and all, the same contexts, static bounds and signature count — and predicts nothing."""
    from memx.planner import table_cache

    pt = peer[-1]
    with table_cache.use(tmp_path) as cache:
        miss = _predicted(peer)
        assert len(cache.pending) == 1  # written when the block ends
    assert len(list(tmp_path.glob("*.pickle"))) == 1
    monkeypatch.setattr(predictions, "predict_rows", None)  # a hit must not predict
    with table_cache.use(tmp_path) as cache:
        hit = _predicted(peer)
        assert not cache.pending
    for got in (miss, hit):
        assert list(got.tables) == list(pt.tables) and got.max_layers == pt.max_layers
        assert got.signatures == pt.signatures
        for c, t in pt.tables.items():
            for f in (*predictions.TABLE_FIELDS, "fitted_ms", "fitted_envelope", "fitted_summary"):
                a, b = getattr(t, f), getattr(got.tables[c], f)
                if isinstance(a, np.ndarray):
                    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True), (c, f)
                else:
                    assert a == b, (c, f)


def test_table_cache_names_change_with_every_input(peer, monkeypatch):
    """Another reserve, closed-form field, layer cap, code version or predictor type: another file name."""
    from memx.planner import table_cache

    cl, mo, sp, lays, _ = peer
    ctx = layout_contexts(lays, mo.layers)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})

    def name(contexts=ctx, reserve=sp.reserve_gib, p=pred):
        return predictions._cache_key(contexts, cl, mo, mo.seq_len, sp.recompute_levels, reserve, {}, p)

    base = name()
    first = next(iter(ctx))
    names = {base, name(reserve=sp.reserve_gib + 0.5), name(p=AnalyticStageModel(gpus=pred.gpus, mfu=0.51)),
             name(p=AnalyticStageModel(gpus=pred.gpus, runtime="none")), name(contexts={**ctx, first: ctx[first] - 1})}
    assert len(names) == 5 and name() == base
    monkeypatch.setattr(table_cache, "code_version", lambda: "another MemX")
    assert name() != base
    assert name(p=object()) is None  # only the closed form is a function of the code alone


def test_table_cache_ignores_a_bad_file_and_writes_nothing_on_error(tmp_path, monkeypatch):
    import pickle

    from memx.planner import table_cache

    cache = table_cache.TableCache(folder=tmp_path)
    cache.path("k").write_bytes(b"not a pickle")
    assert cache.get("k") is None and predictions._unpacked(cache.get("k"), []) is None
    with pytest.raises(RuntimeError), table_cache.use(tmp_path / "new") as c:
        c.put("k", {})
        raise RuntimeError
    assert not (tmp_path / "new").exists()
    size = len(pickle.dumps({"i": 0, "pad": b"x" * 1000, "format": table_cache.FORMAT}, protocol=pickle.HIGHEST_PROTOCOL))
    monkeypatch.setattr(table_cache, "KEEP_BYTES", 3 * size + 10)  # the newest files up to KEEP_BYTES are kept
    for i in range(8):
        with table_cache.use(tmp_path / "keep") as c:
            c.put(f"k{i}", {"i": i, "pad": b"x" * 1000})
    assert sorted(p.name for p in (tmp_path / "keep").glob("*.pickle")) == ["k5.pickle", "k6.pickle", "k7.pickle"]


def test_fitted_columns_of_stacked_arrays_equal_the_tables_own():
    """set_fitted given the tables' time_ms and fit already stacked fills the same fitted columns."""
    rng = np.random.default_rng(8)
    pool = [_table(rng, 17, 3, nan=i % 5 == 0) for i in range(12)]
    pool[2].time_ms[:] = np.inf
    stacked = (np.stack([t.time_ms for t in pool]), np.stack([t.fit for t in pool]))
    for got, want in zip(tables_fitted(pool, stacked), tables_fitted(pool, None)):
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def tables_fitted(pool, stacked):
    from memx.planner.tables import fitted_columns

    return fitted_columns(pool, stacked)


def _lowest_reachable_by_climbing(peak, length, fit, cap, target_margin):
    """The form bounds.lowest_reachable replaces: every (row, n) climbs one level per pass."""
    level = np.maximum(fit, 0).astype(np.int64)
    cap = np.asarray(cap)[:, None]
    for _ in range(peak.shape[2]):
        cur = np.take_along_axis(peak, level[..., None], axis=2)[..., 0]
        move = ((cap - cur) / cap < target_margin) & (level < length - 1)
        if not move.any():
            break
        level = level + move
    return np.take_along_axis(peak, level[..., None], axis=2)[..., 0].astype(np.float64)


@pytest.mark.parametrize("seed", range(4))
def test_lowest_reachable_levels_at_once_equal_the_climb(seed):
    rng = np.random.default_rng(seed)
    R, rows, K = 40, 17, 9
    peak = np.sort(rng.uniform(100, 2000, (R, rows, K)), axis=2)[..., ::-1].astype(np.float32)  # ladders: peaks fall
    peak[rng.random((R, rows, K)) < 0.05] = np.inf
    peak[rng.random((R, rows, K)) < 0.02] = np.nan
    length = rng.integers(0, K + 1, (R, rows))
    fit = np.where(rng.random((R, rows)) < 0.2, -1, rng.integers(0, K, (R, rows)))
    cap = rng.uniform(500, 2500, R)
    for margin in (0.0, 0.1, 0.5):
        got, want = bounds.lowest_reachable(peak, length, fit, cap, margin), _lowest_reachable_by_climbing(
            peak, length, fit, cap, margin)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def test_time_channels_in_their_own_table_sum_as_in_the_joint_one():
    """BoxBounds keeps the time channels (tail, λ sums) and the memory ones in two range tables: the λ sums over
    the stages, read from the time table's gather, equal those read from the one table of every channel."""
    rng = np.random.default_rng(3)
    for P in (1, 4, 8, 9, 16):
        for lams in (1, 5):
            x = rng.uniform(-1e4, 1e4, (300, P, 3 + lams))  # tail, m_lo, m_lo / capacity, λ sums
            time_only = np.concatenate([x[:, :, :1], x[:, :, 3:]], axis=2)
            assert np.array_equal(time_only[:, :, 1:].sum(axis=1), x[:, :, 3:].sum(axis=1))


def test_median_and_sorted_quantiles_equal_numpys():
    """medians.median and medians.sorted_quantiles (no numpy.ma import) give np.median's and np.quantile's values,
    bit for bit: odd and even sizes, float32 and float64, ties, NaN; quantiles of sorted rows of every length."""
    from memx.planner.medians import median, sorted_quantiles

    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 4, 7, 10, 101, 1000):
        for dtype in (np.float32, np.float64):
            x = rng.lognormal(3, 2, n).astype(dtype)
            x[rng.random(n) < 0.2] = x[0]  # ties
            assert median(x) == float(np.median(x))
            x[n // 2] = np.nan
            assert np.isnan(median(x)) and np.isnan(float(np.median(x)))
    for n in range(2, 40):
        x = np.sort(rng.normal(0, rng.uniform(0.01, 1e4), (30, n)), axis=1)
        for q in (np.linspace(0, 1, 4), np.linspace(0, 1, 7), np.array([0.5, 0.25, 1.0])):
            want = np.quantile(x, q, axis=1)
            got = sorted_quantiles(x, q)
            assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("seed", range(4))
def test_ladders_banded_equal_the_full_rows(seed):
    """predictions.ladders_banded (each band of rows over its own widest positions, a few contexts at a time) gives the
    arrays `ladders` gives on the full rows, ties in time and memory and rows with nothing predicted included."""
    rng = np.random.default_rng(seed)
    contexts, rows = int(rng.integers(1, 40)), int(rng.integers(2, 30))
    widths = np.r_[0, np.sort(rng.integers(1, rows + 3, rows - 1))]
    k = int(widths.max())
    ok = np.arange(k)[None, :] < widths[:, None]
    times = np.where(ok, np.round(rng.uniform(1, 20, (contexts, rows, k))), np.inf)  # rounded: ties
    mems = np.where(ok, np.round(rng.uniform(1, 20, (contexts, rows, k))), np.inf)
    gone = (rng.random((contexts, rows, k)) < 0.2) | (rng.random((contexts, rows, 1)) < 0.1)
    times[gone], mems[gone] = np.inf, np.inf
    codes = np.where(ok, rng.integers(-2, rows, (rows, k)), -2)
    limit = rng.uniform(5, 15, contexts)
    predictions.BAND_ELEMENTS, keep = int(rng.integers(1, 200)), predictions.BAND_ELEMENTS
    try:
        got = predictions.ladders_banded(times, mems, codes, widths, limit)
    finally:
        predictions.BAND_ELEMENTS = keep
    for g, want in zip(got, ladders(times, mems, codes, limit[:, None])):
        assert g.dtype == want.dtype and np.array_equal(g, want)


def _tables_and_rows_asked(problem, monkeypatch, fields):
    cl, mo, sp, lays = problem
    asked = []
    predict = predictions.predict_arrays
    monkeypatch.setattr(predictions, "predict_arrays", lambda p, s: asked.append(len(s["layers"])) or predict(p, s))
    monkeypatch.setattr(predictions, "BROADCAST_FIELDS", {AnalyticStageModel: fields} if fields else {})
    pt = predictions.predict_tables(layout_contexts(lays, mo.layers), cl, mo, mo.seq_len, sp.recompute_levels,
                                    sp.reserve_gib, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    monkeypatch.undo()
    return pt, sum(asked)


@pytest.mark.parametrize("problem, share", [(("a100-v100-16", "llama2-7b", "default"), 0.5),
                                            pytest.param(("v100-t4-6", "qwen1.5-moe-a2.7b", "moe"), 0.8,  # moe.adjust
                                                         marks=pytest.mark.slow),
                                            (("v100-t4-6", "llama3-8b-32k", "long-context"), 0.8)])  # cp 1, 2, 4
def test_contexts_equal_but_inflight_and_dp_asked_once_equal_every_row_asked(problem, share, monkeypatch):
    """The closed form (predictions.BROADCAST_FIELDS: inflight, dp) is asked once per group of contexts equal in all
    else, those columns (m, rows), on fewer rows; every table equals the one of asking each context's own rows (array
    by array, dtypes too)."""
    cl, mo, sp = load_cluster(problem[0]), load_model(problem[1]), load_search(problem[2])
    lays = enumerate_layouts(cl, mo, sp)
    assert predictions.BROADCAST_FIELDS == {AnalyticStageModel: ("inflight", "dp")}
    shared, rows = _tables_and_rows_asked((cl, mo, sp, lays), monkeypatch, ("inflight", "dp"))
    each, all_rows = _tables_and_rows_asked((cl, mo, sp, lays), monkeypatch, ())
    assert all_rows == each.signatures == shared.signatures
    assert rows < share * all_rows, (rows, all_rows)
    assert each.tables.keys() == shared.tables.keys() and each.max_layers == shared.max_layers
    for c, t in shared.tables.items():
        for f in ("time_ms", "peak_mib", "code", "length", "fit", "static_mib", "params_per_rank", "fitted_ms"):
            a, b = getattr(t, f), getattr(each.tables[c], f)
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), (c, f)
