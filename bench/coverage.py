"""Coverage of the predictor's 90 % intervals (issue #12 "Uncertainty") on the virtual cluster.

1. Profile the cluster on the simulated backend (memx.profiling.profile), hold out one in five measured
   stage rows (memx.pipeline.training.split_and_augment: the training path's own split), augment and
   fit the learned predictor on the rest, and conformalize it on the held-out rows (memx.learn.model.
   conformalize: split-conformal bands).
2. Measure plans the profiler never ran (memx.simulator.sample_plans, another seed) and predict them
   with memx.planner.estimate.estimate_plans through `bound_view(pred, "low" | "high")` — the planner's
   own assembly of the interval ends.
3. Print the fraction of measured iteration times inside [low, high] and of measured per-GPU peaks inside
   theirs; the same for the closed form (memx.planner.cost, runtime "catalog") with its documented
   default bands (memx.learn.intervals.CLOSED_FORM_BANDS). Goal: ≥ 0.90.

Usage: .venv/bin/python bench/coverage.py [--cluster v100-t4-6] [--model llama-6l] [--search small] [--plans 300]
       [--distributed-optimizer on|off|both] [--sequence-parallel on|off|both]  (default: as the search lists them)
       [--mondrian on|off]  (group-conditional memory bands, memx.learn.intervals; off: per GPU type only)
Last line: time_coverage=<x> mem_coverage=<x> closed_form_time_coverage=<x> closed_form_mem_coverage=<x>
mem_width=<mean (high − low) / predicted per-GPU peak> plans=<n>
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.learn.intervals import bound_view, interval_columns  # noqa: E402
from memx.learn.model import conformalize, fit_predictor  # noqa: E402
from memx.pipeline.training import TrainConfig, split_and_augment  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.profiling import profile  # noqa: E402
from memx.report.evaluate import _measured, _plans  # noqa: E402
from memx.simulator import sample_plans  # noqa: E402


OPTION_SETTINGS = {"on": (True,), "off": (False,), "both": (False, True)}


def with_options(space, distributed_optimizer: str | None, sequence_parallel: str | None):
    """The search with its job options overridden (None: as listed); profile and plans both follow it."""
    changes = {k: OPTION_SETTINGS[v] for k, v in (("distributed_optimizer", distributed_optimizer),
                                                  ("sequence_parallel", sequence_parallel)) if v is not None}
    return dataclasses.replace(space, **changes)


class ClosedFormBands:
    """The closed form with its documented default bands (what the planner would show without profiling)."""

    def __init__(self, gpus):
        self.inner = AnalyticStageModel(gpus=gpus)
        self.name = "analytic"

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.inner.predict(sigs)
        cols = interval_columns(None, sigs["gpu"].to_numpy(), out["time_ms"].to_numpy(np.float64),
                                out["peak_mem_mib"].to_numpy(np.float64))
        return out.assign(**cols)


def plan_coverage(predictor, plans, measured: pd.DataFrame, cl, mo) -> dict[str, float]:
    meas = _measured(measured)
    lo = estimate_plans(plans, cl, mo, bound_view(predictor, "low"))
    hi = estimate_plans(plans, cl, mo, bound_view(predictor, "high"))
    t_lo = np.array([lo[i].iteration_time_ms for i in meas.ok])
    t_hi = np.array([hi[i].iteration_time_ms for i in meas.ok])
    t_in = (meas.time_ms >= t_lo) & (meas.time_ms <= t_hi)
    m_in = np.concatenate([(p >= np.asarray(lo[i].peak_mem_mib)) & (p <= np.asarray(hi[i].peak_mem_mib))
                           for i, p in zip(meas.ok, meas.peaks)])
    m_above = np.concatenate([p > np.asarray(hi[i].peak_mem_mib) for i, p in zip(meas.ok, meas.peaks)])
    width_t = float(np.median(t_hi / t_lo))
    mid = estimate_plans(plans, cl, mo, predictor)
    m_width = np.concatenate([(np.asarray(hi[i].peak_mem_mib) - np.asarray(lo[i].peak_mem_mib))
                              / np.asarray(mid[i].peak_mem_mib) for i in meas.ok])  # (high − low) / point, per GPU
    return {"time": float(t_in.mean()), "memory": float(m_in.mean()), "memory_above_high": float(m_above.mean()),
            "median_time_width": width_t, "mean_memory_width": float(m_width.mean()), "plans": int(len(meas.ok)), "gpus": int(len(m_in))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="v100-t4-6")
    ap.add_argument("--model", default="llama-6l")
    ap.add_argument("--search", default="small")
    ap.add_argument("--plans", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distributed-optimizer", choices=sorted(OPTION_SETTINGS), default=None)
    ap.add_argument("--sequence-parallel", choices=sorted(OPTION_SETTINGS), default=None)
    ap.add_argument("--mondrian", choices=("on", "off"), default="on",
                    help="group-conditional memory bands (memx.learn.intervals.memory_group); off: per GPU type only")
    args = ap.parse_args()
    cl, mo, sp = load_cluster(args.cluster), load_model(args.model), load_search(args.search)
    sp = with_options(sp, args.distributed_optimizer, args.sequence_parallel)
    gpus = {g.name: g for g in cl.gpu_types}
    runs = profile(cl, mo, sp, backend="simulated", seed=args.seed).stage_runs
    aug, valid = split_and_augment(runs, TrainConfig(seed=args.seed))
    pred = conformalize(fit_predictor(aug.stage_runs, gpus, variant="hybrid-calibrated", seed=args.seed), valid,
                        grouped=args.mondrian == "on")
    for g, per in sorted(pred.intervals.bands.items()):
        print(g, {h: (round(b.low, 3), round(b.high, 3), b.n) for h, b in per.items()})
    for k, b in sorted(pred.intervals.grouped.items()):
        print(k, (round(b.low, 3), round(b.high, 3), b.n))
    measured = sample_plans(cl, mo, sp, n=args.plans, seed=args.seed + 2024, distributed_optimizer=sp.distributed_optimizer,
                            sequence_parallel=sp.sequence_parallel)  # the plans the search asks for
    plans = _plans(measured, cl, mo)
    learned = plan_coverage(pred, plans, measured, cl, mo)
    closed = plan_coverage(ClosedFormBands(gpus), plans, measured, cl, mo)
    print(f"{args.cluster} {args.model} {args.search}: {len(runs)} stage rows ({len(valid)} held out), "
          f"{learned['plans']} measured plans, {learned['gpus']} per-GPU peaks")
    print("learned     ", learned)
    print("closed form ", closed)
    print(f"time_coverage={learned['time']:.3f} mem_coverage={learned['memory']:.3f} "
          f"closed_form_time_coverage={closed['time']:.3f} closed_form_mem_coverage={closed['memory']:.3f} "
          f"mem_width={learned['mean_memory_width']:.4f} plans={learned['plans']}")


if __name__ == "__main__":
    main()
