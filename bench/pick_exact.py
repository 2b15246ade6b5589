"""The floor pick (issue #22): exact against full enumeration, the hm16 / llama2-70b case, and the search time
of the margin bound against the search without the safe sets, in one process.

  python bench/pick_exact.py property [--spaces 200]   # random small mixed-capacity spaces vs full enumeration
  python bench/pick_exact.py hm16                      # llama2-70b on 8 × H100-80G + 8 × MI300X-192G
  python bench/pick_exact.py timing --cluster three-vendor-20 --model llama2-7b [--repeat 2] [--baseline DIR]

`timing` runs the default search twice per repeat: with the safe sets (margin_floor set: the exact floor pick)
and without them (the keeper of the previous search: top-k by time, Φ's staircase, the front; the kept front is
the same in both), and prints their ratio, in CPU seconds of this process (the medians' side thread
included; steadier than wall time on a shared machine) and wall seconds. `--baseline DIR` also runs the same
search from another checkout (e.g. `git archive f4d4b0d | tar -x -C DIR`, the commit before) in a child
process right after, and prints the ratio to it. Last line of each mode: key=value figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.plan import Plan, plan_from_dict, plan_to_dict
from memx.domain.specs import Cluster, Node
from memx.planner import search as search_module
from memx.planner.candidates import Keeper
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.pick import choose
from memx.planner.search import search

REPO = Path(__file__).resolve().parents[1]


def _spaces(n: int, seed: int):
    """n random small mixed-capacity problems (the property test's shapes, drawn with `random`)."""
    from tests.unit.test_pick_exact import PAIRS  # one definition of the shapes

    rng, conf = random.Random(seed), REPO / "conf"
    for _ in range(n):
        pair = rng.choice(PAIRS)
        nodes = tuple(Node(gpu=load_gpu(g, conf), count=rng.choice((1, 2, 4))) for g in pair)
        cluster = Cluster(name="mixed", inter_node_bandwidth_gbps=rng.choice((12.0, 50.0)), nodes=nodes)
        model = dataclasses.replace(load_model("llama-6l", conf), layers=rng.randint(3, 9),
                                    hidden=rng.choice((4096, 8192)), heads=32, query_groups=8,
                                    seq_len=rng.choice((2048, 4096)))
        space = dataclasses.replace(
            load_search("small", conf), global_batch=rng.choice((8, 16)), tp_options=rng.choice(((1,), (2,), (1, 2))),
            micro_batch_options=(1,), recompute_levels=("none", "selective", "full"), max_pp=rng.randint(2, 4),
            use_all_gpus=rng.random() < 0.5, max_time_ratio=rng.choice((0.0, 1.1, 1.25)), max_stage_slowdown=0.0,
            target_margin=rng.choice((0.1, 0.3)), margin_floor=rng.choice((0.1, 0.3, 0.5, 0.7)),
            balance_tolerance=rng.choice((0.0, 0.02, 0.1)), weights=rng.choice(("auto", "default")),
            virtual_stages_options=rng.choice(((1,), (1, 2))))
        yield cluster, model, space


def property_mode(n: int, seed: int) -> None:
    """Each space four times: the closed form, the interval predictor (and with no interval on one GPU type),
    and the closed form with the (T, margin, V) kept front; an assertion stops at the first disagreement."""
    from tests.unit.test_pick_exact import check_against_enumeration, floor_margin, predictor_for

    feasible = binding = none = moved = 0
    checks = (("point", False), ("interval", False), ("interval-nan", False), ("point", True))
    for cluster, model, space in _spaces(n, seed):
        if not all([check_against_enumeration(cluster, model, space, k, v) for k, v in checks]):
            continue
        feasible += 1
        rs = {k: search(cluster, model, space, predictor_for(cluster, k), top_k=3) for k in ("point", "interval")}
        mg = floor_margin(rs["interval"])
        binding += mg(rs["interval"].fastest) < space.margin_floor  # the floor changes the answer (upper bound)
        none += any("no plan clears" in w for w in rs["interval"].warnings)
        moved += rs["interval"].chosen.plan != rs["point"].chosen.plan  # the upper bound moved the pick
    print(f"spaces={n} checks={n * len(checks)} agree={n * len(checks)} feasible={feasible} "
          f"interval_floor_binding={binding} interval_none_clears={none} interval_moved_pick={moved} seed={seed}")


def _hand(base: Plan, mi: list[int], h: list[int]) -> Plan:
    """A hand plan of the issue: tp-2 MI300X stages then one tp-8 H100 stage, no recompute, as `base` otherwise."""
    d = plan_to_dict(base)
    stages = [{"gpu": "mi300x-192g", "tp": 2, "layers": n, "recompute": "none"} for n in mi]
    stages += [{"gpu": "h100-80g", "tp": 8, "layers": n, "recompute": "none"} for n in h]
    return plan_from_dict({**d, "dp": 1, "stages": stages})


def hm16_mode() -> None:
    conf = REPO / "conf"
    cluster = Cluster(name="hm16", inter_node_bandwidth_gbps=50.0, nodes=(
        Node(gpu=load_gpu("h100-80g", conf), count=8), Node(gpu=load_gpu("mi300x-192g", conf), count=8)))
    model, space = load_model("llama2-70b", conf), load_search("default", conf)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    t0 = time.perf_counter()
    r = search(cluster, model, space, pred)
    wall = time.perf_counter() - t0
    hands = estimate_plans([_hand(r.chosen.plan, [12] * 4, [32]), _hand(r.chosen.plan, [13] * 4, [28])],
                           cluster, model, pred, reserve_gib=space.reserve_gib)
    for name, m in zip(("[12,12,12,12]->[32]", "[13,13,13,13]->[28]"), hands):
        print(f"hand {name}: {m.iteration_time_ms:,.0f} ms margin {m.min_margin:.1%}")
    floor = choose(r.top, [*r.top_time, *r.pareto, *r.safe], rule="fastest-above-floor",
                   margin_floor=space.margin_floor).plan  # the same search's kept sets, the floor rule
    for rule, p in (("fastest-above-floor", floor), (r.pick_rule, r.chosen)):
        faster = all(p.iteration_time_ms < m.iteration_time_ms for m in hands if m.min_margin >= space.margin_floor)
        print(f"case=hm16/llama2-70b rule={rule} pick_ms={p.iteration_time_ms:.0f} pick_margin={p.min_margin:.4f} "
              f"faster_than_clearing_hand_plans={faster} warnings={len(r.warnings)} search_s={wall:.2f}")


class _NoSafeKeeper(Keeper):
    """The keeper without the safe sets (the previous search's work), for the timing comparison."""

    def __init__(self, **kw):
        kw.pop("margin_floor", None)
        kw.pop("balance_tolerance", None)
        super().__init__(**kw)


def _timed(cluster, model, space, pred):
    """(result, CPU s, wall s) of one default search."""
    c0, t0 = time.process_time(), time.perf_counter()
    r = search(cluster, model, space, pred)
    return r, time.process_time() - c0, time.perf_counter() - t0


def timing_mode(cluster_name: str, model_name: str, repeat: int, baseline: str | None) -> None:
    cluster, model, space = load_cluster(cluster_name), load_model(model_name), load_search("default")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    new, old = [], []
    for _ in range(repeat):
        r_new, *t = _timed(cluster, model, space, pred)
        new.append(t)
        search_module.Keeper = _NoSafeKeeper
        try:
            r_old, *t = _timed(cluster, model, space, pred)
            old.append(t)
        finally:
            search_module.Keeper = Keeper
    (cpu_new, wall_new), (cpu_old, wall_old) = min(new), min(old)
    line = (f"case={model_name}/{cluster_name} with_bound_cpu_s={cpu_new:.1f} without_cpu_s={cpu_old:.1f} "
            f"ratio={cpu_new / cpu_old:.2f} with_bound_wall_s={wall_new:.1f} without_wall_s={wall_old:.1f} "
            f"scored_with={r_new.space.scored} scored_without={r_old.space.scored} "
            f"pick_with_ms={r_new.chosen.iteration_time_ms:.0f} pick_with_margin={r_new.chosen.min_margin:.4f} "
            f"pick_without_ms={r_old.chosen.iteration_time_ms:.0f} pick_without_margin={r_old.chosen.min_margin:.4f} "
            f"front={len(r_new.pareto)}")
    if baseline:
        base = _baseline(baseline, cluster_name, model_name, repeat)
        line += (f" baseline_cpu_s={base['cpu']:.1f} ratio_to_baseline={cpu_new / base['cpu']:.2f} "
                 f"baseline_scored={base['scored']} baseline_pick_ms={base['pick']:.0f} baseline_front={base['front']}")
    print(line)


_CHILD = """
import sys, time
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search
cluster, model, space = load_cluster(sys.argv[1]), load_model(sys.argv[2]), load_search("default")
pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
best = None
for _ in range(int(sys.argv[3])):
    c0 = time.process_time()
    r = search(cluster, model, space, pred)
    cpu = time.process_time() - c0
    best = cpu if best is None else min(best, cpu)
print(best, r.space.scored, r.chosen.iteration_time_ms, len(r.pareto))
"""


def _baseline(root: str, cluster_name: str, model_name: str, repeat: int) -> dict:
    """The same default search from another checkout, in a child process (its own imports)."""
    env = {**os.environ, "PYTHONPATH": str(Path(root).resolve())}
    out = subprocess.run([sys.executable, "-c", _CHILD, cluster_name, model_name, str(repeat)], env=env,
                         cwd=root, check=True, capture_output=True, text=True).stdout.split()
    return {"cpu": float(out[0]), "scored": int(out[1]), "pick": float(out[2]), "front": int(out[3])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("property", "hm16", "timing"))
    ap.add_argument("--spaces", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cluster", default="three-vendor-20")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--baseline", default=None, help="another checkout to time the same search in (timing)")
    a = ap.parse_args()
    if a.mode == "property":
        property_mode(a.spaces, a.seed)
    elif a.mode == "hm16":
        hm16_mode()
    else:
        timing_mode(a.cluster, a.model, a.repeat, a.baseline)


if __name__ == "__main__":
    main()
