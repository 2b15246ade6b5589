"""Search throughput: the vectorised engine vs a per-plan Python loop, in one process.

Scenario: three-vendor-20 + llama2-7b + conf/search/default.yaml, analytic stage model.
The search answers for the whole space (exact branch-and-bound: it scores `scored` plans and discards
the rest by bound); plans_per_s = plans answered for (evaluated) per second, scored_per_s = plans the
vectorised engine actually scored per second. The naive loop (memx.planner.naive.evaluate_split: the
same tables and rules, one plan at a time) runs on a deterministic sample — the first
`--naive-per-layout` splits of every layout — because the whole space would take hours.
Last line: plans_per_s=<n> scored_per_s=<n> naive_plans_per_s=<n> ratio=<x> space=<n> scored=<n> search_s=<s>
"""

from __future__ import annotations

import argparse
import time

from memx.planner.cost import AnalyticStageModel
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.naive import evaluate_split
from memx.planner.predictions import predict_tables
from memx.planner.search import _chunks, _contexts, _prepare, search
from memx.planner.space import enumerate_layouts


def naive_rate(cluster, model, space, predictor, weights, per_layout: int) -> tuple[int, float]:
    layouts = enumerate_layouts(cluster, model, space)
    seq = space.seq_len or model.seq_len
    pt = predict_tables(_contexts(layouts, model.layers), cluster, model, seq, space.recompute_levels,
                        space.reserve_gib, predictor)
    preps = [p for lay in layouts if (p := _prepare(lay, pt, cluster, model, seq, space.max_stage_slowdown))]
    samples = [(p, [tuple(int(x) for x in row) for row in next(_chunks(p, model.layers, per_layout), [])[:per_layout]])
               for p in preps]
    n, t0 = 0, time.perf_counter()
    for prep, rows in samples:
        for split in rows:
            evaluate_split(prep.tables, split, weights, epsilon_mib2=space.epsilon_mib2, target_margin=space.target_margin)
            n += 1
    return n, n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="three-vendor-20")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--search", default="default")
    ap.add_argument("--naive-per-layout", type=int, default=60)
    args = ap.parse_args()
    cluster, model, space = load_cluster(args.cluster), load_model(args.model), load_search(args.search)
    predictor = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    r = search(cluster, model, space, predictor)
    rate = r.space.evaluated / r.search_s
    print(f"search: {r.space.evaluated:,} plans (layer splits with recompute assignment) over {r.space.layouts} "
          f"layouts in {r.search_s:.2f} s, {r.space.scored:,} scored, the rest discarded by bound; space before "
          f"pruning {r.space.splits_total:,} splits, {r.space.total:,} counting per-stage recompute choices; "
          f"weights {r.weights.profile}")
    n, naive = naive_rate(cluster, model, space, predictor, r.weights, args.naive_per_layout)
    print(f"naive loop: {n:,} plans in {n / naive:.2f} s")
    print(f"plans_per_s={rate:.0f} scored_per_s={r.space.scored / r.search_s:.0f} naive_plans_per_s={naive:.0f} "
          f"ratio={rate / naive:.1f} space={r.space.evaluated} scored={r.space.scored} search_s={r.search_s:.2f}")


if __name__ == "__main__":
    main()
