"""CachedPredictor: full-signature keys, hit rate, Parquet persistence, version isolation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memx.planner.cost import AnalyticStageModel
from memx.learn.cache import SPOT_CHECKS, CachedPredictor, signature_keys
from memx.domain.catalog import load_gpu
from memx.planner.signatures import StagePredictor

GPUS = {"a100-80g": load_gpu("a100-80g")}


class Counting:
    """Counts the rows it is asked for (to prove the cache answers the rest)."""

    name = "counting"

    def __init__(self):
        self.inner, self.rows = AnalyticStageModel(gpus=GPUS), 0

    def predict(self, sigs):
        self.rows += len(sigs)
        return self.inner.predict(sigs)


def sigs(n_layers=8, **over) -> pd.DataFrame:
    rows = [dict(gpu="a100-80g", tp=2, layers=n, micro_batch=1, seq_len=4096, recompute="none", recompute_layers=None,
                 first=False, last=False, inflight=2, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32,
                 vocab=32000, mlp="swiglu", **over) for n in range(1, n_layers + 1)]
    df = pd.DataFrame(rows)
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    return df


@pytest.mark.parametrize("field,value", [("layers", 9), ("recompute_layers", 3), ("inflight", 3), ("first", True),
                                         ("last", True), ("tp", 4), ("gpu", "other"), ("micro_batch", 2),
                                         ("recompute", "selective"), ("hidden", 5120), ("seq_len", 2048)])
def test_every_signature_field_is_part_of_the_key(field, value):
    base = sigs(1).assign(recompute="full")
    changed = base.copy()
    changed[field] = value
    if field == "recompute_layers":
        changed["recompute_layers"] = changed["recompute_layers"].astype("Int64")
    assert signature_keys(base, "v1")[0] != signature_keys(changed, "v1")[0]


def test_key_depends_on_version_not_on_dtypes():
    a = sigs(3)
    b = a.astype({"tp": "int32", "layers": "float64"}).assign(recompute_layers=[np.nan] * 3)
    assert (signature_keys(a, "v1") == signature_keys(b, "v1")).all()
    assert (signature_keys(a, "v1") != signature_keys(a, "v2")).all()


def test_hits_answer_from_cache_and_match_the_inner_predictor(tmp_path):
    inner = Counting()
    cp = CachedPredictor(inner, version="v1", path=tmp_path / "p.parquet")
    assert isinstance(cp, StagePredictor)
    first = cp.predict(sigs(8))
    assert cp.last_hit_rate == 0.0 and inner.rows == 8
    second = cp.predict(sigs(12).iloc[::-1])  # 8 known, 4 new, other order
    assert inner.rows == 12 and cp.last_hit_rate == pytest.approx(8 / 12)
    pd.testing.assert_frame_equal(second.loc[first.index], first)
    assert cp.hit_rate == pytest.approx(8 / 20)


def test_duplicate_rows_in_one_call_are_predicted_once():
    inner = Counting()
    cp = CachedPredictor(inner, version="v1")
    s = pd.concat([sigs(4), sigs(4)], ignore_index=True)
    out = cp.predict(s)
    assert inner.rows == 4 and np.allclose(out.iloc[:4].to_numpy(), out.iloc[4:].to_numpy())


def test_persisted_cache_is_reused_by_the_same_version_only(tmp_path):
    path = tmp_path / "cache" / "predictions.parquet"
    CachedPredictor(Counting(), version="v1", path=path).predict(sigs(10))
    assert path.is_file()
    inner = Counting()
    again = CachedPredictor(inner, version="v1", path=path)
    assert inner.rows == min(SPOT_CHECKS, 10)  # the load predicted a random sample again (issue #25)
    again.predict(sigs(10))
    assert inner.rows == min(SPOT_CHECKS, 10) and again.last_hit_rate == 1.0
    other = Counting()
    CachedPredictor(other, version="v2", path=path).predict(sigs(10))
    assert other.rows == 10
