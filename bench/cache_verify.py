"""The cost of verifying a prediction cache on load (issue #25): keys re-hashed from the stored signatures
and SPOT_CHECKS entries predicted again, against a load without the check, in the same process.

    PYTHONPATH=. python bench/cache_verify.py [--layers 1000] [--inflight 50]
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from memx.domain.catalog import load_cluster
from memx.learn import cache
from memx.planner.cost import AnalyticStageModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--inflight", type=int, default=50)
    args = ap.parse_args()
    cl = load_cluster("xy-2")
    inner = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    base = dict(gpu="vendor-y-64g", tp=1, micro_batch=1, seq_len=2048, recompute="none", recompute_layers=None,
                first=False, last=False, hidden=4096, ffn_hidden=11008, heads=32, query_groups=32, vocab=32000,
                mlp="swiglu", distributed_optimizer=False, dp=1, sequence_parallel=False)
    sigs = pd.DataFrame([dict(base, layers=n, inflight=i)
                         for n, i in itertools.product(range(1, args.layers + 1), range(1, args.inflight + 1))])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "predictions.parquet"
        cache.CachedPredictor(inner, version="v", path=path).predict(sigs)
        verify = cache.CachedPredictor._verify

        def load(check: bool) -> float:
            cache.CachedPredictor._verify = verify if check else (lambda *a: None)
            t0 = time.perf_counter()
            assert len(cache.CachedPredictor(inner, version="v", path=path)) == len(sigs)
            return time.perf_counter() - t0

        plain, checked = min(load(False) for _ in range(3)), min(load(True) for _ in range(3))
        cache.CachedPredictor._verify = verify
        print(f"entries {len(sigs)}: load {plain * 1e3:.0f} ms unverified, {checked * 1e3:.0f} ms verified "
              f"(ratio {checked / plain:.2f}); file {os.path.getsize(path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
