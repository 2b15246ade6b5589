"""Same inputs, same plan (issue #12): the whole local pipeline (profile → augment → train → search), run
twice on fresh homes with the same seed, stores the same plan JSON (wall-clock timings aside)."""

from __future__ import annotations

import pytest

from typing import Any

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.learn.tuning import TuneBudget
from memx.pipeline.local import run_local
from memx.pipeline.training import TrainConfig

TIMING_KEYS = ("seconds", "elapsed", "wall", "created", "timestamp", "duration")


def _is_timing(key: str) -> bool:
    return key.endswith("_s") or any(t in key for t in TIMING_KEYS)  # search_s: wall-clock seconds


def _without_timings(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_timings(v) for k, v in obj.items() if not _is_timing(k)}
    if isinstance(obj, list):
        return [_without_timings(v) for v in obj]
    return obj


def _run(tmp_path, monkeypatch, name: str) -> dict[str, Any]:
    home = tmp_path / name
    monkeypatch.setenv("MEMX_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "MEMX_STORE"):
        monkeypatch.delenv(var, raising=False)
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    run = run_local(cl, mo, sp, seed=5, weights="default", top_k=5,
                    config=TrainConfig(seed=5, budget=TuneBudget(trials=2)))
    assert (home / "mlflow.db").is_file()
    return run.plan


@pytest.mark.slow  # ~17 s: two full in-process pipelines (issue #17: `make test` under 3 min)
def test_two_runs_on_fresh_homes_pick_the_same_plan(tmp_path, monkeypatch):
    a, b = _run(tmp_path, monkeypatch, "a"), _run(tmp_path, monkeypatch, "b")
    assert a and _without_timings(a) == _without_timings(b)
    assert a["plan"]["model"] == "llama-6l" and a["predicted"], sorted(a)
