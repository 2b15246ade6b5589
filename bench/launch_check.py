"""Launchability sweep (issue #24): for every (cluster, model) case, the default search's pick and the picks of
`launcher: megatron` and `launcher: flagscale` are rendered; every emitted Megatron-LM command must parse against
tests/fixtures/megatron_arguments.json with tp·pp·dp = world size and the plan's layer split, every emitted
FlagScale config must pass tests/fixtures/flagscale_config.json, and a plan a launcher cannot start must be
refused with a reason (never emitted). It also prints the time ratio of the best Megatron-expressible plan to the
unconstrained pick (`launcher_gain`: the value of heterogeneity).

Run: `PYTHONPATH=. python bench/launch_check.py [cluster ...]` (analytic predictor, conf/search/default.yaml).
One line per case, then `total: …` counts. `--gain`: only the Megatron-vs-unconstrained ratio on GAIN_CLUSTERS ×
GAIN_MODELS (docs/results.md §Launchers).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter

import yaml

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InfeasibleError, NotLaunchable
from memx.planner.cost import AnalyticStageModel
from memx.planner.launcher import gain_of, launcher_search
from memx.report.flagscale import render_flagscale
from memx.report.megatron import megatron_launchable, render_megatron
from tests.support.launch_checks import flagscale_problems, hostfile_problems, megatron_launch_problems, script_args

CLUSTERS = ("a100-h20-h100-256", "a100-t4-16", "a100-v100-16", "h100-h20-16", "h100-mi300x-32", "h100-mi300x-64",
            "mixed-1024", "three-vendor-20", "v100-t4-6", "vendor-b-128", "xy-2")  # every shipped cluster
# GPT-2 (tied embeddings, GELU, learned positions), OPT-350M, GPT-Neo 2.7B fit every cluster; Llama 3 8B (GQA,
# RoPE base 500,000) all but the two smallest
MODELS = ("gpt2-1024", "opt-350m", "gpt-neo-2.7b", "llama3-8b")
GAIN_CLUSTERS = ("three-vendor-20", "a100-v100-16", "h100-mi300x-32")
GAIN_MODELS = ("llama2-7b", "llama2-13b", "llama3-8b")


def check_megatron(plan, model, cluster, counts: Counter) -> list[str]:
    script = render_megatron(plan, model, cluster)
    if megatron_launchable(plan, model, cluster):
        counts["megatron_refused"] += 1
        ok = "pretrain_gpt.py" not in [ln.split()[0] for ln in script.splitlines() if ln.strip()] \
            and script.rstrip().endswith("exit 1")
        return [] if ok else ["a refused plan's megatron.sh launches"]
    counts["megatron_emitted"] += 1
    problems = megatron_launch_problems(script_args(script), plan.gpus_used, [st.layers for st in plan.stages])
    counts["megatron_passed"] += not problems
    return problems


def check_flagscale(plan, model, cluster, counts: Counter) -> list[str]:
    try:
        text = render_flagscale(plan, model, cluster)
    except NotLaunchable:
        counts["flagscale_refused"] += 1
        return []
    counts["flagscale_emitted"] += 1
    cfg = yaml.safe_load(text)
    problems = flagscale_problems(cfg, world=plan.gpus_used) + hostfile_problems(text, cfg)
    counts["flagscale_passed"] += not problems
    return problems


def check_case(cluster_name: str, model_name: str, counts: Counter) -> dict:
    """Search the case three times (launcher any, megatron, flagscale) and check every emitted launch."""
    cl, mo, base = load_cluster(cluster_name), load_model(model_name), load_search("default")
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    row: dict = {"case": f"{cluster_name}/{model_name}", "problems": []}
    free = None
    for launcher in ("any", "megatron", "flagscale"):
        sp = dataclasses.replace(base, launcher=launcher)
        try:
            res = launcher_search(cl, mo, sp, pred, top_k=3)
        except InfeasibleError:
            counts[f"infeasible_{launcher}"] += 1
            continue
        plan = res.chosen.plan
        free = res if launcher == "any" else free
        counts["plans"] += 1
        row["problems"] += check_megatron(plan, mo, cl, counts) + check_flagscale(plan, mo, cl, counts)
        if launcher == "megatron":
            row["megatron_pick_launchable"] = not megatron_launchable(plan, mo, cl)
            row["gain"] = gain_of("megatron", res, free) if free is not None else None
        if launcher == "flagscale":
            try:
                render_flagscale(plan, mo, cl)
                row["flagscale_pick_launchable"] = True
            except NotLaunchable:
                row["flagscale_pick_launchable"] = False
    return row


def main(clusters: tuple[str, ...]) -> None:
    counts: Counter = Counter()
    t0 = time.perf_counter()
    for c in clusters:
        for m in MODELS:
            row = check_case(c, m, counts)
            g = row.get("gain")
            gain = (f"megatron_ms={g['time_ms']:.0f} any_ms={g['unconstrained_time_ms']:.0f} "
                    f"ratio={g['time_ratio']:.3f} megatron_margin={g['margin']:.3f} any_margin={g['unconstrained_margin']:.3f}"
                    if g else "megatron: no feasible plan")
            print(f"{row['case']}: problems={len(row['problems'])} megatron_pick_ok={row.get('megatron_pick_launchable')} "
                  f"flagscale_pick_ok={row.get('flagscale_pick_launchable')} {gain}", flush=True)
            for p in row["problems"]:
                print(f"  PROBLEM {p}")
            counts["cases"] += 1
            counts["problems"] += len(row["problems"])
    print("total: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())) + f" wall_s={time.perf_counter() - t0:.0f}")


def gains() -> None:
    """The time ratio of the best plan stock Megatron-LM runs to the unconstrained pick (memx.planner.launcher)."""
    for c in GAIN_CLUSTERS:
        for m in GAIN_MODELS:
            cl, mo, base = load_cluster(c), load_model(m), load_search("default")
            pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
            free = launcher_search(cl, mo, base, pred, top_k=3)
            meg = launcher_search(cl, mo, dataclasses.replace(base, launcher="megatron"), pred, top_k=3)
            g, p = gain_of("megatron", meg, free), meg.chosen.plan
            print(f"{c}/{m}: megatron_ms={g['time_ms']:.0f} any_ms={g['unconstrained_time_ms']:.0f} "
                  f"ratio={g['time_ratio']:.3f} megatron_margin={g['margin']:.3f} any_margin={g['unconstrained_margin']:.3f} "
                  f"megatron_plan=tp{p.stages[0].tp}xpp{p.pp}xdp{p.dp} on {'+'.join(dict.fromkeys(s.gpu for s in p.stages))} "
                  f"({p.gpus_used} GPUs)", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--gain"]:
        gains()
    else:
        main(tuple(sys.argv[1:]) or CLUSTERS)
