"""A data-parallel degree per stage (issue #27): plan JSON, FlagScale's hand-off, the closed form and the virtual
cluster (each against the uniform-dp machinery it generalises, and against each other)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.plan import plan_from_dict, plan_to_dict, validate_plan
from memx.domain.stage_dp import handoff, has_stage_dp, stage_dps, stage_micro_batches
from memx.planner import stage_dp
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import _predict_stages, estimate_plans
from memx.planner.network import achieved
from memx.planner.predictions import params_per_rank
from memx.planner.schedule import IDENTITY_ASSEMBLY
from memx.simulator import simulate_plan
from memx.simulator.schedule import _traits_for, one_f1b_order, stage_signatures
from memx.simulator.stage import ADAM_STATIC_BYTES_PER_PARAM
from memx.simulator.stage_dp import simulate_meshes

import numpy as np

MIXED = {"model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 64, "micro_batch": 1, "seq_len": 4096,
         "dp": 2, "precision": "fp16",
         "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 2},
                    {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 1},
                    {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 2}]}
UNIFORM = {**MIXED, "stages": [{k: v for k, v in s.items() if k != "data_parallel"} | {"tp": 4}
                               for s in MIXED["stages"][:1]] + [
    {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full"},
    {"gpu": "v100-32g", "tp": 2, "layers": 10, "recompute": "full"}], "dp": 1, "micro_batch": 2}


@pytest.fixture(scope="module")
def env():
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    return cluster, model, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


def test_plan_json_round_trips_and_older_files_are_unchanged(env):
    cluster, model, _ = env
    mixed = plan_from_dict(json.loads(json.dumps(MIXED)))
    assert plan_to_dict(mixed) == MIXED and has_stage_dp(mixed)
    assert stage_dps(mixed) == (2, 1, 2) and stage_micro_batches(mixed) == (1, 2, 1)
    assert mixed.gpus_per_type() == {"a100-80g": 4, "v100-32g": 12} and mixed.micro_batches == 32
    validate_plan(mixed, cluster, model)
    old = plan_from_dict(UNIFORM)
    assert "data_parallel" not in json.dumps(plan_to_dict(old)) and plan_to_dict(old) == UNIFORM
    assert not has_stage_dp(old)


@pytest.mark.parametrize("dp_a,dp_b,pieces", [
    (2, 2, [(0, 0, 1), (1, 1, 1)]),
    (2, 1, [(0, 0, 1), (1, 0, 1)]),
    (1, 4, [(0, b, 1) for b in range(4)]),
    (2, 3, [(0, 0, 2), (0, 1, 1), (1, 1, 1), (1, 2, 2)]),  # lcm 6 rows: FlagScale's find_overlapped_mapping
])
def test_handoff_moves_every_row_once(dp_a, dp_b, pieces):
    got = handoff(dp_a, dp_b)
    assert got == pieces and sum(r for _, _, r in got) == np.lcm(dp_a, dp_b)


def _stage_dp_path(plan, cluster, model, pred):
    cluster = achieved(cluster, pred)  # as estimate_plans sees the NICs (memx.planner.network)
    ctxs, layers, p = _predict_stages([plan], model, pred, cluster)
    params = np.array([params_per_rank(c, np.asarray(n), model) for c, n in zip(ctxs, layers)])
    return stage_dp.assemble(plan, cluster, model, p["time_ms"], p["peak_mem_mib"], p["static_mem_mib"], params, 1.0,
                             IDENTITY_ASSEMBLY)


@pytest.mark.parametrize("do", [False, True])
def test_closed_form_reduces_to_the_uniform_assembly(env, do):
    """With one dp for every stage the per-stage-dp assembly is the paper's 1F1B assembly, to the bit."""
    cluster, model, pred = env
    plan = dataclasses.replace(plan_from_dict(UNIFORM), distributed_optimizer=do)
    ref = estimate_plans([plan], cluster, model, pred)[0]
    got = _stage_dp_path(plan, cluster, model, pred)
    assert got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=1e-12)
    assert got.max_mem_mib == ref.max_mem_mib and got.mem_variance_mib2 == pytest.approx(ref.mem_variance_mib2)


def test_closed_form_splits_the_micro_batch_and_pays_the_fan_in(env):
    cluster, model, pred = env
    plan = plan_from_dict(MIXED)
    est = estimate_plans([plan], cluster, model, pred)[0]
    assert len(est.peak_mem_mib) == 16  # stage-major: 2·2 A100 ranks, 1·4 and 2·4 V100 ranks
    where = stage_dp.place_stage_groups(plan, cluster)
    rows, fan, _, _ = stage_dp.boundary(cluster, plan, where, 0)
    assert (rows, fan) == (2, 2)  # the dp-1 stage receives both A100 ranks' rows: 2 samples, 2 pieces
    # the dp-1 V100 stage computes 2 samples per micro batch: slower and fuller than its dp-2 twin at 1
    assert est.stage_time_ms[1] > est.stage_time_ms[2] and est.stage_peak_mib[1] > est.stage_peak_mib[2]


def test_virtual_cluster_meshes_match_its_replicas_on_a_uniform_plan(env):
    """The virtual cluster's per-stage-dp schedule, given a plan with one dp, runs what its replica schedule runs
    (same costs and links; noise draws differ): within 2 %."""
    cluster, model, _ = env
    plan = plan_from_dict({**UNIFORM, "dp": 2, "micro_batch": 1,
                           "stages": [dict(s, tp=2) for s in UNIFORM["stages"][:1]] + [
                               dict(s, tp=2) for s in UNIFORM["stages"][1:]]})
    ref = simulate_plan(plan, cluster, model, seed=3)
    tr = _traits_for({s.gpu for s in plan.stages}, None, None)
    got = simulate_meshes(plan, cluster, model, stage_signatures(plan, model), tr, ADAM_STATIC_BYTES_PER_PARAM, 3,
                          one_f1b_order)
    assert got.iteration_time_ms == pytest.approx(ref.iteration_time_ms, rel=0.02)
    assert sorted(got.demand_mem_mib) == pytest.approx(sorted(ref.demand_mem_mib), rel=1e-12)


def test_closed_form_tracks_the_virtual_cluster_on_a_mixed_plan(env):
    cluster, model, pred = env
    plan = plan_from_dict(MIXED)
    est, run = estimate_plans([plan], cluster, model, pred)[0], simulate_plan(plan, cluster, model)
    assert not run.oom and len(run.peak_mem_mib) == 16
    assert est.iteration_time_ms == pytest.approx(run.iteration_time_ms, rel=0.10)
    assert max(est.peak_mem_mib) == pytest.approx(max(run.peak_mem_mib), rel=0.10)


def test_any_stage_predictor_sees_each_stage_at_its_per_rank_micro_batch(env):
    """A learned predictor is reached through `predict(DataFrame)` (memx.planner.signatures.predict_arrays): each
    stage's signature is an ordinary one at micro batch b_s with dp_s optimizer shards, nothing new to learn."""
    cluster, model, pred = env
    seen = []

    class Recording:  # a predictor with `predict` only, as the learned stack's wrappers are
        name = "recording"

        def nic_efficiency(self, gpu_types):  # the learned stack's wrappers pass their inner predictor's on
            return pred.nic_efficiency(gpu_types)

        def predict(self, sigs):
            seen.append(sigs[["micro_batch", "dp"]].to_numpy().tolist())
            return pred.predict(sigs)

    plan = dataclasses.replace(plan_from_dict(MIXED), distributed_optimizer=True)
    got = estimate_plans([plan], cluster, model, Recording())[0]
    assert seen[0] == [[1, 2], [2, 1], [1, 2]]  # (b_s, dp_s) per stage
    assert got.iteration_time_ms == estimate_plans([plan], cluster, model, pred)[0].iteration_time_ms
