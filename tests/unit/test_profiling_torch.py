"""torch backend: a real decoder stage on this device (CPU here); skipped without PyTorch."""

from __future__ import annotations

import time

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.profiling.backends.torch import TorchBackend, auto_scale, scale_model
from memx.profiling.design import point

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def small(conf_root):
    m = load_model("llama-6l", conf_root)
    return scale_model(m, auto_scale(m, "cpu"))


def _pt(m, **kw):
    base = dict(tp=1, layers=2, micro_batch=1, seq_len=m.seq_len, source="t")
    return point("cpu", m, **{**base, **kw})


def test_scaling_keeps_heads_and_shrinks_widths(small):
    assert small.hidden <= 128 and small.heads == 32 and small.hidden % small.heads == 0
    assert small.seq_len < 2048 and small.vocab < 32000


def test_stage_measures_time_and_memory(small):
    be = TorchBackend(repeats=2)
    row = be.measure(_pt(small))
    assert row["status"] == "ok" and row["time_ms"] > 0 and row["backend"] == "torch"
    assert row["peak_mem_mib"] > row["static_mem_mib"] > 0
    assert "torch.profiler" in row["reason"]


def test_memory_follows_layers_inflight_recompute_and_embedding(small):
    be = TorchBackend(repeats=1)
    base = be.measure(_pt(small, layers=4))
    held = be.measure(_pt(small, layers=4, inflight=3))
    full = be.measure(_pt(small, layers=4, recompute="full"))
    emb = be.measure(_pt(small, layers=0, first=True))
    assert held["peak_mem_mib"] > base["peak_mem_mib"]  # more micro batches held before backward
    assert full["peak_mem_mib"] < base["peak_mem_mib"]  # checkpointing keeps only layer inputs
    assert emb["status"] == "ok" and emb["static_mem_mib"] > 0


def test_gqa_and_tp_shard_and_gelu(conf_root):
    m = scale_model(load_model("gpt2-1024", conf_root), 8)
    row = TorchBackend(repeats=1).measure(point("cpu", m, tp=2, layers=1, micro_batch=1, seq_len=m.seq_len,
                                                 last=True, recompute="selective", source="t"))
    assert row["status"] == "ok"


@pytest.mark.slow
def test_scaled_model_profiles_under_two_minutes(conf_root):
    from memx.profiling import profile

    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    t0 = time.monotonic()
    r = profile(c, m, s, backend="torch")
    assert time.monotonic() - t0 < 120
    assert r.failed == 0 and (r.stage_runs.hidden <= 128).all()
