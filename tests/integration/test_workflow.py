"""The in-process runner (memx.pipeline.local): profile → augment → train → register once; a second
call re-profiles and retrains nothing and answers from the cache; a change of GPU types, model structure
or global batch changes the fingerprint and retrains (each trigger shown); adding nodes of a known GPU
type does not; the search plans with the registry champion, not with a version that was not promoted."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.specs import Cluster, Node
from memx.learn.model import XgbParams
from memx.pipeline import registry
from memx.pipeline.local import profile_step, registered_predictor, run_local, search_step, train_config, train_step
from memx.pipeline.store import store_from_uri
from memx.planner.search import search

FAST = dict(trials=1, seconds=5)


@pytest.fixture()
def base(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MEMX_STORE", raising=False)
    return load_cluster("xy-2"), load_model("llama-6l"), load_search("small")


def _train(cl, mo, sp):
    profiles = profile_step(cl, mo, sp)
    return profiles, train_step(cl, mo, sp, **FAST)


# ~9 s (two trainings): `make test-all`; every stage's reuse stays in the default set via
# tests/integration/test_flows_pipeline.py and the prediction cache's hits via tests/unit/test_cache.py.
@pytest.mark.slow
def test_second_call_reuses_profile_model_and_cache(base):
    cl, mo, sp = base
    profiles, first = _train(cl, mo, sp)
    assert not first.train.reused and first.model_version == 1 and first.promoted
    assert first.augment.manifest["rows_after"] >= first.augment.manifest["rows_before"]
    assert set(profiles) == {g.name for g in cl.gpu_types}
    pred = registered_predictor(cl, mo, sp)
    found = search(cl, mo, sp, pred, weights="default", top_k=3)
    assert found.cache_hit_rate == 0.0 and len(pred) > 0
    stored = {(r.step, r.version) for r in store_from_uri().list_versions()}
    again_profiles, again = _train(cl, mo, sp)
    assert again_profiles == profiles and again.augment.reused and again.train.reused
    assert {(r.step, r.version) for r in store_from_uri().list_versions()} == stored  # nothing new
    pred2 = registered_predictor(cl, mo, sp)
    assert len(pred2) == len(pred) and pred2.version == pred.version
    second = search(cl, mo, sp, pred2, weights="default", top_k=3)
    assert second.cache_hit_rate == 1.0 and second.best.plan == found.best.plan


@pytest.mark.slow  # ~16 s: four trainings (issue #17: `make test` under 3 min)
def test_each_fingerprint_trigger_retrains_and_node_growth_does_not(base):
    cl, mo, sp = base
    _, first = _train(cl, mo, sp)
    grown = Cluster(name="xy-4", inter_node_bandwidth_gbps=cl.inter_node_bandwidth_gbps, nodes=cl.nodes + cl.nodes)
    _, same = _train(grown, mo, sp)
    assert same.train.reused and same.fingerprint == first.fingerprint
    triggers = {
        "gpu types": (dataclasses.replace(cl, nodes=(cl.nodes[0], Node(gpu=load_gpu("a100-80g"), count=1))), mo, sp),
        "model structure": (cl, dataclasses.replace(mo, ffn_hidden=8192), sp),
        "global batch": (cl, mo, dataclasses.replace(sp, global_batch=32)),
    }
    versions = {1}
    for why, (c, m, s) in triggers.items():
        _, new = _train(c, m, s)
        assert new.fingerprint != first.fingerprint, why
        assert not new.train.reused and new.model_version not in versions, why
        versions.add(new.model_version)
        assert registry.cache_path(new.fingerprint, new.model_version) != registry.cache_path(
            first.fingerprint, first.model_version)
    assert len(registry.list_versions()) == 4


def test_missing_profile_and_missing_champion_name_the_fingerprint_and_the_command(base):
    cl, mo, sp = base
    fp = registry.fingerprint(cl, mo, sp.global_batch).fingerprint
    with pytest.raises(InputError, match=f"(?s){fp}.*run `memx profile` first"):
        train_step(cl, mo, sp, **FAST)
    with pytest.raises(InputError, match=f"(?s){fp}.*`memx profile` then `memx train`"):
        registered_predictor(cl, mo, sp)


@pytest.mark.slow  # ~11 s: two trainings (issue #17: `make test` under 3 min)
def test_search_plans_with_the_champion_not_with_an_unpromoted_version(base, monkeypatch):
    cl, mo, sp = base
    done = run_local(cl, mo, sp, config=train_config(0, **FAST), top_k=3)
    assert done.trained.promoted and done.search.manifest["champion"]["model_version"] == 1
    assert done.plan["plan"]["model"] == "llama-6l"
    # A deliberately weak model (one shallow round) trained on other held-out rows: registered, not champion.
    weak = XgbParams(n_rounds=1, max_depth=1, learning_rate=0.01)
    monkeypatch.setattr("memx.pipeline.training.XgbParams", lambda: weak)
    monkeypatch.setattr("memx.pipeline.training.VARIANTS", ("hybrid",))
    monkeypatch.setattr("memx.pipeline.training.TREE_VARIANTS", ("hybrid",))
    monkeypatch.setattr("memx.learn.tuning.suggest", lambda trial: weak)
    worse = train_step(cl, mo, sp, config=dataclasses.replace(train_config(0, **FAST), valid_fraction=0.25))
    assert worse.model_version == 2 and not worse.promoted and worse.champion["model_version"] == 1
    again, plan = search_step(cl, mo, sp, top_k=3)
    assert again.reused and again.version == done.search.version and plan == done.plan
