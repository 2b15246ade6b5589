"""vTrain (MICRO 2024) ground_truth_single.csv: measured Megatron-DeepSpeed iterations on 2–8 A100s, full
recompute. Per model, a 3-point design (memx.profiling.design) is profiled on the simulator with the
vTrain-calibrated A100 traits (eager attention, docs/simulator.md), the predictor is trained on it, and
every measured configuration of that model is predicted: MAPE, and ranking within groups of equal GPU
count and model (bench/accuracy.py runs all 8 models; here the two 24-layer ones keep the test short).
Bounds are regression guards around the measured figures (docs/predictor.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from memx.learn.augment import augment
from memx.domain.catalog import load_gpu
from memx.planner.estimate import estimate_plans
from memx.domain.plan import Plan, Stage
from memx.learn import fit_predictor
from memx.profiling.design import dense_points, gpu_axes, grid_points, inflight_points
from memx.simulator import load_traits, measure_stages
from memx.domain.specs import Cluster, ModelArch, Node, SearchSpace

COLUMNS = ["gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp", "time_ms"]


def test_vtrain_a100_groups_ranked_and_predicted(realdata):
    df = pd.read_csv(realdata / "vtrain" / "data" / "ground_truth_single.csv", encoding="utf-8-sig")
    df.columns = COLUMNS
    df = df[df["layers"] == 24]
    a100 = load_gpu("a100-80g")
    traits = {a100.name: dataclasses.replace(load_traits("a100-80g"), flash_attention=False)}
    cluster = Cluster(name="vtrain-node", inter_node_bandwidth_gbps=25, nodes=(Node(gpu=a100, count=8),))
    # vTrain's Megatron-DeepSpeed configs (config/validation/*.json) turn on neither sequence parallelism nor
    # a distributed optimizer (Megatron's defaults: off), and the plans below say so (Plan defaults): the
    # profile design must not carry the search-space defaults (both true, issue #14) — profiled with
    # sequence_parallel at tp > 1 the predictor extrapolates to these plans (MAPE 13.3 % instead of 9.0 %
    # over all eight models).
    space = SearchSpace(name="vtrain", global_batch=128, tp_options=(1, 2, 4, 8), micro_batch_options=(1, 2, 4, 8),
                        recompute_levels=("full",), max_pp=4, sequence_parallel=(False,), distributed_optimizer=(False,))
    frames = []
    for h, grp in df.groupby("hidden"):
        model = ModelArch(name="gpt", layers=24, hidden=int(h), ffn_hidden=4 * int(h), heads=16, query_groups=16,
                          vocab=51200, seq_len=1024, mlp="gelu")
        ax = gpu_axes(cluster, model, space, a100)
        points = grid_points(ax, model, {"tp", "micro_batch", "layers"}) + dense_points(ax, model)
        points += inflight_points(ax, model, {"tp", "micro_batch", "layers"})
        runs = measure_stages(pd.DataFrame(points), seed=int(h), gpus=cluster, traits=traits)
        runs["source"] = [p["source"] for p in points]
        pred = fit_predictor(augment(runs).stage_runs, {a100.name: a100}, variant="hybrid-calibrated", seed=0)
        plans = [Plan(model="gpt", cluster=cluster.name, global_batch=int(r.gbs), micro_batch=int(r.mbs), seq_len=1024,
                      dp=int(r.dp), stages=tuple(Stage(gpu=a100.name, tp=int(r.tp), layers=24 // int(r.pp),
                                                       recompute="full") for _ in range(int(r.pp))))
                 for r in grp.itertuples(index=False)]
        est = estimate_plans(plans, cluster, model, pred)
        frames.append(grp.assign(pred=[e.iteration_time_ms for e in est]))
    out = pd.concat(frames)
    ape = np.abs(out["pred"] - out["time_ms"]) / out["time_ms"]
    out = out.reset_index(drop=True)
    groups = list(out.groupby(["gpus", "hidden"]))
    rhos = [spearmanr(g["pred"], g["time_ms"]).statistic for _, g in groups]
    best_first = sum(int(g["pred"].idxmin() == g["time_ms"].idxmin()) for _, g in groups)
    print(f"vTrain 24-layer models: n={len(out)} MAPE={ape.mean():.4f} within-group Spearman {np.round(rhos, 3)} "
          f"best first in {best_first} of {len(groups)}")
    # measured: MAPE 8.1 %, Spearman 0.955-0.992 (median 0.982), best first 5 of 6 (bench/accuracy.py: all 8
    # models, 9.0 % / median 0.982 / 16 of 24)
    assert len(out) > 300
    assert ape.mean() < 0.09 and min(rhos) > 0.95 and np.median(rhos) > 0.975 and best_first >= 5
