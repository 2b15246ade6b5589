"""Issue #26, plan CPU (session 4): the faster forms give exactly what they replace — the stage slowdown caps
from each context's envelope (prepared._slowdown_caps) as the direct stacked form."""

from __future__ import annotations

import numpy as np
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.predictions import predict_tables
from memx.planner.prepared import _slowdown_caps, layout_contexts
from memx.planner.space import enumerate_layouts
from memx.planner.tables import StageTable


def direct_caps(stages, total: int, factor: float) -> np.ndarray:
    """The caps as defined (prepared._slowdown_caps' docstring), on the stacked fitted times."""
    n = np.arange(len(stages[0].fit))
    fitted = np.stack([st.fitted_ms for st in stages])
    finite = fitted[np.isfinite(fitted)]
    if finite.size == 0:
        return np.zeros(len(stages), dtype=np.int64)
    env = np.sort(np.minimum.accumulate(fitted[:, ::-1], axis=1)[:, ::-1][:, 1:], axis=None)
    bound = min(env[total - 1], finite.max()) if total <= env.size else finite.max()
    return np.maximum((n[None, :] * (fitted <= bound * factor)).max(axis=1), 1)


def _table(rng, rows: int, k: int, nan: bool) -> StageTable:
    t = rng.uniform(10, 1000, (rows, k)).cumsum(axis=0)  # time mostly grows with n, not always
    t[rng.random((rows, k)) < 0.1] = np.inf
    if nan:
        t[rng.integers(1, rows), 0] = np.nan
    fit = rng.integers(-1, k, rows)
    z = np.zeros(rows)
    return StageTable(time_ms=t, peak_mib=t, code=np.zeros((rows, k), dtype=np.int64), length=np.full(rows, k),
                      fit=fit, static_mib=z, params_per_rank=z)


def test_slowdown_caps_equal_the_direct_form_on_random_tables():
    rng = np.random.default_rng(7)
    for _ in range(50):
        pp, rows = int(rng.integers(1, 9)), int(rng.integers(2, 40))
        stages = tuple(_table(rng, rows, 3, nan=rng.random() < 0.2) for _ in range(pp))
        for total in (1, pp, rows - 1, rows * pp + 5):
            for factor in (1.0, 1.3, 2.0):
                assert np.array_equal(_slowdown_caps(stages, total, factor), direct_caps(stages, total, factor))


def test_slowdown_caps_equal_the_direct_form_on_a_search():
    cl, mo, sp = load_cluster("a100-v100-16"), load_model("llama2-7b"), load_search("default")
    lays = enumerate_layouts(cl, mo, sp)
    pt = predict_tables(layout_contexts(lays, mo.layers), cl, mo, mo.seq_len, sp.recompute_levels, sp.reserve_gib,
                        AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}))
    checked = 0
    for lay in lays:
        if all(c in pt.tables for c in lay.contexts()):
            stages = tuple(pt.tables[c] for c in lay.contexts())
            for factor in (1.0, sp.max_stage_slowdown or 1.5):
                got = _slowdown_caps(stages, mo.layers, factor)
                assert got.dtype == np.int64 and np.array_equal(got, direct_caps(stages, mo.layers, factor))
                checked += 1
    assert checked > 50


def _fitted_by_definition(t: StageTable):
    n = np.arange(len(t.fit))
    ok = (t.fit >= 0) & (n > 0)
    f = np.full(len(t.fit), np.inf)
    f[ok] = t.time_ms[n[ok], t.fit[ok]].astype(np.float32)
    finite = f[np.isfinite(f)]
    return f, np.minimum.accumulate(f[::-1])[::-1], (float(finite.max()) if finite.size else None, bool(np.isnan(f).any()))


def test_fitted_columns_of_many_tables_equal_each_tables_own():
    """predict_tables fills every table's fitted values in one pass (tables.set_fitted): the same arrays (values
    and dtype) as their definition, table by table."""
    from memx.planner.tables import set_fitted

    rng = np.random.default_rng(3)
    tabs = [_table(rng, 20, 4, nan=i % 3 == 0) for i in range(12)]
    tabs[5].time_ms[:] = np.inf  # nothing finite
    alone = [_fitted_by_definition(t) for t in tabs]
    set_fitted(tabs)
    for (f, e, s), t in zip(alone, tabs):
        assert f.dtype == t.fitted_ms.dtype == np.float64 and np.array_equal(f, t.fitted_ms, equal_nan=True)
        assert np.array_equal(e, t.fitted_envelope, equal_nan=True) and s == t.fitted_summary
    assert alone[5][2] == (None, False)


def _ladders_by_take_along_axis(times, mems, codes, limit_mib):
    """tables.ladders as first written (np.take_along_axis, codes broadcast to the options' shape)."""
    codes = np.broadcast_to(codes, times.shape)
    order = np.lexsort((mems, times), axis=-1)
    t, m, c = (np.take_along_axis(x, order, axis=-1) for x in (times, mems, codes))
    before = np.concatenate([np.full(m.shape[:-1] + (1,), np.inf), np.minimum.accumulate(m, axis=-1)[..., :-1]],
                            axis=-1)
    keep = m < before
    length = keep.sum(axis=-1)
    kept = np.argsort(~keep, axis=-1, kind="stable")
    top = np.maximum(length - 1, 0)[..., None]
    pad = np.arange(m.shape[-1]) >= length[..., None]
    kept = np.where(pad, np.take_along_axis(kept, top, axis=-1), kept)
    t, m, c = (np.take_along_axis(x, kept, axis=-1) for x in (t, m, c))
    empty = (length == 0)[..., None]
    t, m, c = np.where(empty, np.inf, t), np.where(empty, np.inf, m), np.where(empty, -2, c).astype(np.int64)
    fits = (m <= np.asarray(limit_mib)[..., None]) & ~pad
    fit = np.where(fits.any(axis=-1), fits.argmax(axis=-1), -1)
    return t, m, c, length.astype(np.int64), fit.astype(np.int64)


def test_ladders_by_flat_takes_equal_take_along_axis():
    from memx.planner.tables import ladders

    rng = np.random.default_rng(11)
    for contexts, rows, k in [(7, 9, 6), (1, 5, 3), (30, 12, 14)]:
        times = np.round(rng.uniform(1, 20, (contexts, rows, k)))  # rounded: ties in time and memory
        mems = np.round(rng.uniform(1, 20, (contexts, rows, k)))
        gone = rng.random((contexts, rows, k)) < 0.3
        times[gone], mems[gone] = np.inf, np.inf
        times[0, 1], mems[0, 1] = np.inf, np.inf  # a row with nothing predicted
        codes = rng.integers(-2, 9, (rows, k))
        limit = rng.uniform(5, 15, (contexts, 1))
        for c in (codes, np.broadcast_to(codes, times.shape), codes.copy(order="F")):
            for got, want in zip(ladders(times, mems, c, limit), _ladders_by_take_along_axis(times, mems, c, limit)):
                assert got.dtype == want.dtype and np.array_equal(got, want)
        flat = ladders(times[0], mems[0], codes, 10.0)  # one context (stage_table's form)
        for got, want in zip(flat, _ladders_by_take_along_axis(times[0], mems[0], codes, 10.0)):
            assert np.array_equal(got, want)
