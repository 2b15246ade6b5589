"""R²-gated interpolation (memx.learn.augment): gate table, narrowing, rows strictly inside measured intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memx.learn.augment import INTERPOLATED, augment, interpolation_gates, r_squared

BASE = dict(gpu="g", tp=1, micro_batch=2, seq_len=1024, recompute="none", recompute_layers=None, first=False,
            last=False, inflight=1, hidden=1024, ffn_hidden=4096, heads=16, query_groups=16, vocab=32000, mlp="gelu",
            status="ok", static_mem_mib=100.0)


def _row(source: str, **kw) -> dict:
    r = {**BASE, **kw, "source": source}
    r.setdefault("layers", 4)
    return r


def _frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    return df


def _profile(seq_time=lambda s: 1e-6 * s**2) -> pd.DataFrame:
    rows = [_row("design:dense:layers", layers=n, time_ms=10.0 * n, peak_mem_mib=500.0 + 300.0 * n) for n in (1, 2, 4, 6, 8, 12, 16)]
    rows += [_row("design:dense:micro_batch", micro_batch=b, time_ms=5.0 + 20.0 * b, peak_mem_mib=900.0) for b in range(1, 6)]
    rows += [_row("design:dense:seq_len", seq_len=s, time_ms=seq_time(s), peak_mem_mib=900.0) for s in (512, 1024, 2048, 4096, 8192)]
    # the 3-point grid on another GPU type: layers 1, 8, 16 at two micro batches
    for b in (1, 4):
        rows += [_row("design:grid", gpu="h", layers=n, micro_batch=b, time_ms=3.0 * n * b, peak_mem_mib=200.0 + 50.0 * n * b)
                 for n in (1, 8, 16)]
    rows.append(_row("design:grid", gpu="h", layers=20, status="oom", time_ms=np.nan, peak_mem_mib=np.nan))
    return _frame(rows)


def test_r_squared_of_a_line_is_one_and_of_a_parabola_below_threshold():
    x = np.arange(1.0, 8.0)
    assert r_squared(x, 3 * x + 2) == pytest.approx(1.0)
    assert r_squared(np.array([512, 1024, 2048, 4096, 8192.0]), np.array([512, 1024, 2048, 4096, 8192.0]) ** 2) < 0.95


def test_gate_table_passes_linear_params_and_narrows_superlinear_seq_len():
    gates = interpolation_gates(_profile()).set_index("param")
    assert set(gates.index) == {"layers", "micro_batch", "seq_len"}
    assert gates.loc["layers", "passed"] and gates.loc["layers", "note"] == "whole interval"
    assert gates.loc["micro_batch", "r2"] == pytest.approx(1.0)
    seq = gates.loc["seq_len"]
    assert seq["r2"] < 0.95  # superlinear over the whole interval (paper: R² 0.78)
    assert seq["note"] in ("narrowed", "skipped")
    if seq["passed"]:
        assert seq["allowed_hi"] - seq["allowed_lo"] < seq["hi"] - seq["lo"]


def test_threshold_is_configurable():
    strict = interpolation_gates(_profile(seq_time=lambda s: 0.01 * s + 1e-7 * s**2), r2_threshold=0.9999)
    loose = interpolation_gates(_profile(seq_time=lambda s: 0.01 * s + 1e-7 * s**2), r2_threshold=0.5)
    assert not strict.set_index("param").loc["seq_len", "note"] == "whole interval"
    assert loose.set_index("param").loc["seq_len", "note"] == "whole interval"


def test_interpolated_rows_lie_strictly_inside_measured_intervals_and_are_linear():
    prof = _profile()
    res = augment(prof, max_new_per_gap=50)
    new = res.stage_runs[res.stage_runs["source"] == INTERPOLATED]
    assert res.rows_before == len(prof) and res.rows_after == len(res.stage_runs) > len(prof)
    assert res.growth == pytest.approx(res.rows_after / res.rows_before)
    grid = new[new["gpu"] == "h"]
    by_layers = grid[grid["micro_batch"].isin([1, 4])]
    by_mb = grid[~grid["micro_batch"].isin([1, 4])]
    # layers only between measured 1..16 (never 17..20: 20 was an OOM, nothing measured beyond 16)
    assert by_layers["layers"].between(2, 15).all() and not by_layers["layers"].isin([1, 8, 16]).any()
    assert set(by_mb["micro_batch"]) == {2, 3} and set(by_mb["layers"]) == {1, 8, 16}
    # linear between neighbours: time = 3·n·b exactly on this synthetic grid
    assert np.allclose(grid["time_ms"], 3.0 * grid["layers"] * grid["micro_batch"])
    assert (new["status"] == "ok").all()


def test_no_dense_rows_means_no_interpolation():
    prof = _profile()
    prof = prof[~prof["source"].str.startswith("design:dense")].reset_index(drop=True)
    res = augment(prof)
    assert res.gates.empty and res.rows_after == res.rows_before


def test_time_only_rows_interpolate_time_and_keep_memory_null():
    prof = _profile()
    prof.loc[prof["gpu"] == "h", "peak_mem_mib"] = np.nan
    res = augment(prof, max_new_per_gap=3)
    new = res.stage_runs[(res.stage_runs["source"] == INTERPOLATED) & (res.stage_runs["gpu"] == "h")]
    assert len(new) and new["peak_mem_mib"].isna().all() and new["time_ms"].notna().all()
