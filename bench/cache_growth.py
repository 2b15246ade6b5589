"""Growth without invalidation (paper §4.3: 31,240 configurations, ~14× the base space, cost 6.5% more
search time): three-vendor-20 grown to 40 GPUs by doubling every node (same GPU types, so the same
fingerprint and the same registered predictor). The base search fills the prediction cache; the grown
search must answer almost entirely from it.

Prints the search time of the base space (cold cache, predictor called), the base space again (warm),
the grown space (warm from the base), the grown space's cache hit rate and the configuration ratio.
Usage: .venv/bin/python bench/cache_growth.py
Last line: base_s=<x> grown_s=<x> hit_rate=<x> configs_ratio=<x>
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.learn.augment import augment  # noqa: E402
from memx.learn.cache import CachedPredictor  # noqa: E402
from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.learn import fit_predictor  # noqa: E402
from memx.profiling import profile  # noqa: E402
from memx.planner.search import search  # noqa: E402
from memx.domain.specs import Cluster  # noqa: E402


def timed_search(cluster, model, space, predictor):
    t0 = time.perf_counter()
    res = search(cluster, model, space, predictor, weights="default", top_k=5)
    return res, time.perf_counter() - t0


def main() -> None:
    base = load_cluster("three-vendor-20")
    model, space = load_model("llama2-7b"), load_search("default")
    grown = Cluster(name="three-vendor-40", inter_node_bandwidth_gbps=base.inter_node_bandwidth_gbps,
                    nodes=base.nodes + base.nodes, inter_node_latency_ms=base.inter_node_latency_ms)
    runs = profile(base, model, space, backend="simulated", seed=0).stage_runs
    pred = fit_predictor(augment(runs).stage_runs, {g.name: g for g in base.gpu_types}, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        cached = CachedPredictor(pred, version=pred.version, path=Path(tmp) / "predictions.parquet")
        r_base, base_s = timed_search(base, model, space, cached)
        base_hits = r_base.cache_hit_rate
        _, warm_s = timed_search(base, model, space, cached)
        r_grown, grown_s = timed_search(grown, model, space, cached)
        hit = r_grown.cache_hit_rate
        entries = len(cached)
    ratio = r_grown.space.total / r_base.space.total
    print(f"base  {base.total_gpus} GPUs: {r_base.space.total:,} configurations ({r_base.space.layouts} layouts, "
          f"{r_base.signatures:,} signatures), cold cache {base_s:.2f}s (hit rate {base_hits:.3f}), warm {warm_s:.2f}s")
    print(f"grown {grown.total_gpus} GPUs: {r_grown.space.total:,} configurations ({r_grown.space.layouts} layouts, "
          f"{r_grown.signatures:,} signatures), {grown_s:.2f}s, hit rate {hit:.4f}; cache {entries:,} entries")
    print(f"grown / base search time: {grown_s / base_s:.2f} (cold base), {grown_s / warm_s:.2f} (warm base)")
    print(f"base_s={base_s:.3f} grown_s={grown_s:.3f} hit_rate={hit:.4f} configs_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
