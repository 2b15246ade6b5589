"""plan_predictor: profile → augment → train → register once; a second call re-profiles and retrains
nothing and answers from the cache; a change of GPU types, model structure or global batch changes the
fingerprint and retrains (each trigger shown); adding nodes of a known GPU type does not."""

from __future__ import annotations

import dataclasses

import pytest

from memx.pipeline import registry
from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.learn.tuning import TuneBudget
from memx.planner.search import search
from memx.domain.specs import Cluster, Node
from memx.pipeline.local import TrainConfig, plan_predictor, profile_path

CFG = TrainConfig(budget=TuneBudget(trials=1, seconds=5))


@pytest.fixture()
def base(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return load_cluster("xy-2"), load_model("llama-6l"), load_search("small")


def test_second_call_reuses_profile_model_and_cache(base):
    cl, mo, sp = base
    pred, info = plan_predictor(cl, mo, sp, config=CFG)
    assert not info["reused_profile"] and not info["reused_model"] and info["model_version"] == 1
    assert profile_path(info["fingerprint"]).is_file() and info["rows_augmented"] >= info["rows_measured"]
    first = search(cl, mo, sp, pred, weights="default", top_k=3)
    assert pred.last_hit_rate == 0.0 and len(pred) > 0
    pred2, info2 = plan_predictor(cl, mo, sp, config=CFG)
    assert info2["reused_profile"] and info2["reused_model"] and info2["model_version"] == 1
    assert info2["cache_entries"] == len(pred) and info2["predictor_version"] == info["predictor_version"]
    second = search(cl, mo, sp, pred2, weights="default", top_k=3)
    assert pred2.last_hit_rate == 1.0
    assert second.best.plan == first.best.plan


def test_each_fingerprint_trigger_retrains_and_node_growth_does_not(base):
    cl, mo, sp = base
    _, info = plan_predictor(cl, mo, sp, config=CFG)
    grown = Cluster(name="xy-4", inter_node_bandwidth_gbps=cl.inter_node_bandwidth_gbps, nodes=cl.nodes + cl.nodes)
    _, same = plan_predictor(grown, mo, sp, config=CFG)
    assert same["reused_model"] and same["fingerprint"] == info["fingerprint"]
    triggers = {
        "gpu types": (dataclasses.replace(cl, nodes=(cl.nodes[0], Node(gpu=load_gpu("a100-80g"), count=1))), mo, sp),
        "model structure": (cl, dataclasses.replace(mo, ffn_hidden=8192), sp),
        "global batch": (cl, mo, dataclasses.replace(sp, global_batch=32)),
    }
    versions = {1}
    for why, (c, m, s) in triggers.items():
        _, new = plan_predictor(c, m, s, config=CFG)
        assert new["fingerprint"] != info["fingerprint"], why
        assert not new["reused_profile"] and not new["reused_model"], why
        assert new["model_version"] not in versions, why
        versions.add(new["model_version"])
        assert registry.cache_path(new["fingerprint"], new["model_version"]) != registry.cache_path(
            info["fingerprint"], info["model_version"])
    assert len(registry.list_versions()) == 4
