"""Should the default search try expert parallelism on a mixture-of-experts model? (issue #27: "opt-in, then on by
default where evidence says so"; docs/results.md §Mixture of experts, "The default").

For each MoE scenario, the product's search (memx.planner.launcher.launcher_search, conf/search/default.yaml, the
runtime-aware closed form, rule balanced-front) twice in this process: `expert_parallel_options` [1] (the shipped
default: every rank holds every expert) and the values of [1, 2, 4, 8] that divide the model's experts. Each pick runs
on the virtual cluster (memx.simulator, which never imports the planner; 3 seeds): its time, its measured smallest
margin ((capacity − peak) / capacity over the GPUs) and the same plan with activations + 10 % (the `spike` world of
bench/decision_quality.py, memx.experiments.robustness.headroom ≥ 0.10). Printed per scenario: both picks, the
simulated speed-up of ep searched over [1], and the search-time ratio (CPU s, best of 2, interleaved).

Usage: PYTHONPATH=. .venv/bin/python bench/moe_default.py [--scenarios C/M,...]   (about a minute)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.errors import InfeasibleError  # noqa: E402
from memx.domain.plan import plan_to_dict  # noqa: E402
from memx.experiments.robustness import headroom  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.launcher import launcher_search  # noqa: E402
from memx.report.notation import compact_stages, dp_text  # noqa: E402
from memx.simulator import simulate_plan  # noqa: E402

SCENARIOS = ("h100-mi300x-32/mixtral-8x7b", "three-vendor-20/mixtral-8x7b", "three-vendor-20/qwen1.5-moe-a2.7b",
             "h100-h20-16/qwen1.5-moe-a2.7b", "h100-mi300x-32/deepseek-v2-lite", "a100-v100-16/qwen1.5-moe-a2.7b")


def measured(plan, cluster, model) -> tuple[float | None, float | None, bool]:
    """(mean simulated ms, smallest measured margin; None on OOM) and whether it fits with activations + 10 %."""
    runs = [simulate_plan(plan, cluster, model, seed=s) for s in range(3)]
    if any(r.oom for r in runs):
        return None, None, False
    r = runs[0]
    margin = min((c - p) / c for c, p in zip(r.capacity_mib, r.peak_mem_mib))
    return float(np.mean([x.iteration_time_ms for x in runs])), margin, headroom(plan, cluster, model) >= 0.10


def scenario(name: str) -> tuple[float, float | None]:
    """Prints both picks; returns (search-time ratio, simulated time ratio of ep searched over [1]; None where either
    has no plan or runs out of memory)."""
    cname, mname = name.split("/")
    cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    options = tuple(e for e in (1, 2, 4, 8) if model.num_experts % e == 0)
    spaces = {"[1]": space, str(list(options)): dataclasses.replace(space, expert_parallel_options=options)}
    best, picks = {k: np.inf for k in spaces}, {}
    for _ in range(2):
        for k, sp in spaces.items():
            t0 = time.process_time()
            try:
                picks[k] = launcher_search(cluster, model, sp, pred).chosen
            except InfeasibleError as e:
                picks[k] = e
            best[k] = min(best[k], time.process_time() - t0)
    print(f"== {name}", flush=True)
    sim = {}
    for k, c in picks.items():
        if isinstance(c, InfeasibleError):
            sim[k] = None
            print(f"  ep {k:13} search {best[k]:5.2f} s  no feasible plan: {c}", flush=True)
            continue
        t, margin, spike = measured(c.plan, cluster, model)
        sim[k] = t
        got = "OOM on the virtual cluster" if t is None else (
            f"simulated {t:,.0f} ms, margin {margin:.1%}, +10 % activations {'fits' if spike else 'OOM'}")
        d = plan_to_dict(c.plan)
        print(f"  ep {k:13} search {best[k]:5.2f} s  pick ep {c.plan.expert_parallel} dp {dp_text(d)} "
              f"{compact_stages(d)}: {c.iteration_time_ms:,.0f} ms predicted, margin {c.min_margin:.1%}; {got}",
              flush=True)
    a, b = sim["[1]"], sim[str(list(options))]
    speed = None if a is None or b is None else b / a
    ratio = best[str(list(options))] / best["[1]"]
    print(f"  search ratio {ratio:.2f}x; simulated time ep searched / [1]: "
          + ("—" if speed is None else f"{speed:.3f}"), flush=True)
    return ratio, speed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    out = [scenario(s) for s in args.scenarios.split(",")]
    ratios = [r for r, _ in out]
    speeds = [s for _, s in out if s is not None]
    print(f"search ratio {min(ratios):.2f}–{max(ratios):.2f}x; simulated ep searched / [1] "
          + (f"{min(speeds):.3f}–{max(speeds):.3f}" if speeds else "—")
          + f" over {len(speeds)} of {len(out)} scenarios with both picks running")


if __name__ == "__main__":
    main()
