"""Predictor accuracy (issue 5 targets) on the simulated backend and on published measurements.

1. three-vendor-20 + llama2-7b (conf/search/default.yaml): memx.pipeline.local profile_step + train_step
   (profile ≤ 243 runs per GPU type → augment → variants → Optuna → MLflow registry, in a temporary
   $MEMX_HOME) and registered_predictor (the champion), then
   evaluated on plans from memx.simulator.sample_plans (a seed the profiler never used; ≥ 300 measured
   plans that did not OOM), drawn with the space's distributed_optimizer / sequence_parallel options
   (default: both on, issue #14). Also: every variant at plan level (information only — selection is by
   held-out stage rows in the train step) and leave-one-GPU-out.
2. vTrain (../shared/realdata/vtrain/data/ground_truth_single.csv, A100, full recompute): per model, a
   3-point design profiled on the simulator with the vTrain-calibrated A100 traits (eager attention),
   predictor trained, every measured configuration predicted; MAPE and Spearman within groups of equal
   GPU count and model; then calibrated on the other models' measured plans, held out
   (bench/vtrain_calibration.py has every protocol).
3. Sailor GH200 plans from per-layer time-only profiles: tests/validation/test_predictor_sailor.py.

Usage: .venv/bin/python bench/accuracy.py [--plans 900] [--skip-real]
Last line: time_mape=<x> mem_mape=<x> spearman=<x> top1_time=<0|1> top1_phi=<0|1> runs=<n>
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.report.evaluate import evaluate  # noqa: E402
from memx.learn import VARIANTS, fit_predictor  # noqa: E402
from memx.learn.augment import augment  # noqa: E402
from memx.simulator import sample_plans  # noqa: E402


def simulated(n_plans: int) -> tuple[dict, dict]:
    from memx.pipeline.local import profile_step, registered_predictor, train_step
    from memx.pipeline.store import store_from_uri

    cl, mo, sp = load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")
    t0 = time.perf_counter()
    profiles = profile_step(cl, mo, sp, backend="simulated", seed=0)
    trained = train_step(cl, mo, sp, seed=0, profiles=profiles)
    pred = registered_predictor(cl, mo, sp)
    train_s = time.perf_counter() - t0
    store = store_from_uri()
    runs = pd.concat([store.get_table("profile", v, "stage_runs") for v in sorted(profiles.values())], ignore_index=True)
    per_gpu = runs.groupby("gpu").size().to_dict()
    aug, tr = trained.augment.manifest, trained.train.manifest
    print(f"profile: {len(runs)} runs {per_gpu}; augmented {aug['rows_before']} -> {aug['rows_after']} "
          f"(training split, x{aug['growth']:.2f}); variant {tr['variant']}; held-out {tr['held_out']}; "
          f"pipeline {train_s:.1f}s")
    # the plans the search asks for: the distributed optimizer and sequence parallelism as the space lists them
    measured = sample_plans(cl, mo, sp, n=n_plans, seed=2024, distributed_optimizer=sp.distributed_optimizer,
                            sequence_parallel=sp.sequence_parallel)
    res = evaluate(cl, mo, measured, pred, "default")
    _show("registered", res)
    for name, b in res["baselines"].items():
        _show(name, b)
    from bench.coverage import plan_coverage  # the interval coverage of the registered predictor (issue #12)
    from memx.report.evaluate import _plans

    print("registered 90 % interval coverage", plan_coverage(pred.inner, _plans(measured, cl, mo), measured, cl, mo))
    gpus = {g.name: g for g in cl.gpu_types}
    aug = augment(runs).stage_runs
    for v in VARIANTS:
        _show(f"variant {v}", evaluate(cl, mo, measured, fit_predictor(aug, gpus, variant=v, seed=0), "default"))
    first = sorted(gpus)[0]  # labels people have (issue #16): one type without memory; no memory at all
    no_mem = aug.assign(peak_mem_mib=aug["peak_mem_mib"].where(aug["gpu"] != first))
    _show(f"no memory labels on {first}", evaluate(cl, mo, measured, fit_predictor(no_mem, gpus, seed=0), "default"))
    _show("time-only labels", evaluate(cl, mo, measured, fit_predictor(aug.assign(peak_mem_mib=np.nan), gpus, seed=0),
                                       "default"))
    for g in gpus:  # leave one GPU type out: train without its rows, evaluate on all plans
        rest = aug[aug["gpu"] != g]
        for v in ("hybrid", "hybrid-calibrated"):
            _show(f"without {g} ({v})", evaluate(cl, mo, measured, fit_predictor(rest, gpus, variant=v, seed=0), "default"))
    from memx.planner.signatures import SIGNATURE_COLUMNS

    sigs = runs.loc[:, list(SIGNATURE_COLUMNS)]
    big = sigs.iloc[np.resize(np.arange(len(sigs)), 500_000)].reset_index(drop=True)
    t0 = time.perf_counter()
    pred.inner.predict(big)
    print(f"predict 500k signatures: {time.perf_counter() - t0:.2f}s")
    return res, {"runs_per_gpu": max(per_gpu.values())}


def _show(label: str, r: dict) -> None:
    keys = ("n", "time_mape", "time_max_ape", "mem_mape", "spearman_time", "spearman_phi", "top1_time", "top1_phi",
            "oom_accuracy")
    print(f"{label:36s} " + " ".join(f"{k}={r[k]:.4f}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys))


def vtrain(realdata: Path) -> None:
    """Uncalibrated and held-out calibrated figures on vTrain (bench/vtrain_calibration.py, one path)."""
    from bench.vtrain_calibration import held_out_calibrated, load_vtrain, model_estimates, scores, uncalibrated

    models = model_estimates(load_vtrain(realdata))
    print(scores(*uncalibrated(models)).line("vTrain single-node A100 uncalibrated"))
    rows, pred, _ = held_out_calibrated(models, per_tp=True)
    print(scores(rows, pred).line("vTrain single-node A100 calibrated on the other 7 models' plans (held out)"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=900, help="plans sampled (about a third do not OOM)")
    ap.add_argument("--skip-real", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["MEMX_HOME"] = home
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        res, extra = simulated(args.plans)
    realdata = Path(os.environ.get("MEMX_REALDATA", REPO.parent / "shared" / "realdata"))
    if not args.skip_real and realdata.is_dir():
        vtrain(realdata)
    print(f"time_mape={res['time_mape']:.4f} mem_mape={res['mem_mape']:.4f} spearman={res['spearman_time']:.4f} "
          f"top1_time={res['top1_time']} top1_phi={res['top1_phi']} runs={extra['runs_per_gpu']}")


if __name__ == "__main__":
    main()
