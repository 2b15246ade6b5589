"""The NICs' achieved bandwidth (issues #23, #27; memx.planner.network, docs/planner.md §Network): the closed form as
it plans by default — every NIC hop at the runtime catalog's `nic_efficiency` (conf/runtime/default.yaml 0.9) × its
line rate — against the same closed form at line rate (the catalog's figure taken away: the default before issue
#27) and with a cluster's own figure of 1.0, on the virtual cluster's random plans and on vTrain's measured
multi-node iterations.

Why: at line rate the closed form runs a NIC hop at its nominal bandwidth in the DP ring, the p2p transfers, the MoE
all-to-all and the per-stage-dp exchange (the paper's T_dp with the cluster YAML's B), while its context-parallel
ring runs every hop, NIC hops included, at the GPU's NVLink efficiency (conf/runtime `link_efficiency`, 0.7–0.8).
The virtual cluster runs every hop at its GPU's link efficiency (memx.simulator.links.ring). With a figure every NIC
hop runs at e × line rate, the cp ring's NIC-bound hops included (memx.planner.context_parallel.ring_terms
`nic_achieved`), and its NVLink efficiency stays on NVLink hops. e = 1.0 therefore measures the cp ring's
consistency alone; e = 0.9 is Calculon's inter-node efficiency for the A100 system it validated against
Korthikanti et al.'s Selene measurements (../shared/realdata/calculon/systems/a100_80g.json,
networks[1].efficiency; Isaev et al., SC'23).

Rows: random plans as bench/moe.py and bench/context_parallel.py draw them, each simulated once (the simulator
never reads the figure), and vTrain's measured multi-node iterations (bench/vtrain_multi.py: real A100 data,
64–512 GPUs). Figures: docs/results.md §The NIC's achieved bandwidth.

Usage: PYTHONPATH=. .venv/bin/python bench/nic_efficiency.py [--plans 200]   (about 10 s)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.learn.calibration import calibrated_estimates, fit_plan_calibration  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402

from bench.context_parallel import with_cp  # noqa: E402
from bench.interleave import figures  # noqa: E402
from bench.moe import with_experts  # noqa: E402
from bench.vtrain_multi import closed_form, load_multi, scores  # noqa: E402

FIT_PLANS = 8  # measured plans a user calibrates on (issue #16's handful), drawn apart from the scored ones


def simulated_rows(label: str, plans, cluster, model, fit_plans=()) -> None:
    """The closed form's rows on `plans`; with `fit_plans` (other plans of the same draw) also the default closed
    form calibrated on them as a user would on a cluster (memx.learn.calibration.fit_plan_calibration: per-type stage
    and communication scales from whole-plan times, guarded), scored on `plans` only."""
    runs = [simulate_plan(p, cluster, model, seed=i) for i, p in enumerate(plans)]
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    line = dataclasses.replace(pred, runtime={n: dataclasses.replace(p, nic_efficiency=None)
                                              for n, p in pred.profiles().items()})
    rows = ((f"{label}: line rate (catalog null)", cluster, line),
            ("  cluster nic_efficiency 1:", dataclasses.replace(cluster, nic_efficiency=1.0), pred),
            (f"  default (catalog {pred.nic_efficiency(cluster.gpu_types):g}):", cluster, pred))
    out = [f"{name} {figures(plans, runs, estimate_plans(plans, c, model, p), predicted_feasible=True)}"
           for name, c, p in rows]
    if fit_plans:
        measured = [simulate_plan(p, cluster, model, seed=1000 + i) for i, p in enumerate(fit_plans)]
        cal = fit_plan_calibration(list(fit_plans), [None if r.oom else r.iteration_time_ms for r in measured],
                                   [None if r.oom else r.peak_mem_mib for r in measured], cluster, model, pred)
        est = calibrated_estimates(plans, cluster, model, pred, cal)
        out.append(f"  default, calibrated on {sum(not r.oom for r in measured)} other measured plans (comm scale "
                   f"{cal.comm_scale:.3f}): {figures(plans, runs, est, predicted_feasible=True)}")
    print("\n".join(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=200, help="random plans per context-parallel case")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rnd, fit_rnd = random.Random(args.seed), random.Random(args.seed + 1)
    for cname, mname in (("mixed-1024", "qwen1.5-moe-a2.7b"), ("h100-mi300x-32", "mixtral-8x7b")):
        cluster, model = load_cluster(cname), load_model(mname)
        drawn = draw_plans(cluster, model, load_search("default"), n=40, seed=args.seed)
        other = draw_plans(cluster, model, load_search("default"), n=FIT_PLANS, seed=args.seed + 1)
        simulated_rows(f"{cname} {mname} random ep", [with_experts(p, model.num_experts, rnd) for p in drawn],
                       cluster, model, fit_plans=[with_experts(p, model.num_experts, fit_rnd) for p in other])
    for cname, mname in (("a100-h20-h100-256", "llama3-8b-32k"), ("h100-h20-16", "llama3-8b")):
        cluster, model = load_cluster(cname), load_model(mname)
        drawn = draw_plans(cluster, model, load_search("default"), n=4 * args.plans, seed=args.seed)
        simulated_rows(f"{cname} {mname} context-parallel",
                       [p for d in drawn if (p := with_cp(d)) is not None][:args.plans], cluster, model)
    realdata = Path(os.environ.get("MEMX_REALDATA", REPO.parent / "shared" / "realdata"))
    if realdata.is_dir():
        df = load_multi(realdata)
        line = [f"vTrain multi-node (measured, {len(df)} rows): line rate (catalog null) "
                f"MAPE={100 * scores(df, *closed_form(df, line_rate=True)).mape:.2f}%",
                f"cluster nic_efficiency 1 MAPE={100 * scores(df, *closed_form(df, 1.0)).mape:.2f}%",
                f"default (catalog) MAPE={100 * scores(df, *closed_form(df)).mape:.2f}%"]
        print("  ".join(line))


if __name__ == "__main__":
    main()
