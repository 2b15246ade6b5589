"""Sailor's published per-layer profiles import as time-only stage_runs (../shared/realdata/sailor)."""

from __future__ import annotations

import pandas as pd

from memx.profiling.backends.imported import read_records, read_sailor_profiles


def test_sailor_profiles_import(realdata, tmp_path):
    df, rejects = read_sailor_profiles(realdata / "sailor")
    assert len(df) > 300
    assert df.peak_mem_mib.isna().all()  # time only: published profiles carry no device peak
    assert {"records"} == set(df.backend) and df.source.str.startswith("records:").all()
    # embedding-only, single-layer and output-only rows
    assert ((df.layers == 0) & df["first"]).any() and ((df.layers == 0) & df["last"]).any()
    assert (df.layers == 1).any()
    # numbers as published: OPT-350 on A100-40, mbs 1, tp 1, layer 2 = 2.314 + 5.909 ms (fwd + bwd)
    row = df[(df.source == "records:sailor/OPT-350/A100-40/profile.json") & (df.gpu == "a100-40g") & (df.tp == 1)
             & (df.micro_batch == 1) & (df.layers == 1)]
    assert len(row) == 1 and abs(row.time_ms.iloc[0] - (2.314 + 5.909)) < 0.05
    # Sailor's
    # GPT-Neo-2.7/GH-96/profile.json (26 entries: OPT-350's, not GPT-Neo's 34) is rejected whole, not
    # taken as GPT-Neo's profile
    other = [r for r in rejects if r.column != "algo"]
    assert df.source.str.startswith("records:aceso/").any() and len(other) == 1 and other[0].file.endswith("profiles_sailor/GPT-Neo-2.7/GH-96")
    assert "26 layer entries" in other[0].reason
    assert not df.source.str.startswith("records:sailor/GPT-Neo-2.7/GH-96").any()
    assert df.source.str.startswith("records:metis/GPT-Neo-2.7/GH-96/").any()
    # time grows with micro batch for the transformer layer
    opt = df[(df.source == "records:sailor/OPT-350/A100-80/profile.json") & (df.tp == 1) & (df.layers == 1)]
    t = opt.sort_values("micro_batch").time_ms.to_numpy()
    assert (t[-1] > t[0] * 4)
    # round trip through the generic records importer
    path = tmp_path / "sailor.parquet"
    df.to_parquet(path)
    again, bad = read_records(path)
    assert not bad and len(again) == len(df)
    assert pd.Series(again.source).equals(pd.Series(df.source))
