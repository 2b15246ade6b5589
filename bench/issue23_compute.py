"""Issue #23 (compute side): precision, micro batch from a profile at one micro batch, older GPUs' efficiency.

Prints, in one process unless noted:
1. Megatron-LM GPT-2 1.2B on one V100 in fp16 (Shoeybi et al. 2019; Megatron-LM v1.0 blog: 1288 ms): the
   closed form's iteration time and error (tests/validation/test_v100_published.py);
2. vTrain's measured 8-GPU V100 all-reduce (≥ 64 MiB): the closed form's ring time MAPE with the earlier link
   efficiency (0.75) and the calibrated one (conf/runtime/v100-16g.yaml);
3. the learned path trained on a simulated profile at micro batch 1 only (v100-t4-6, gpt2-1024, the virtual
   cluster), stage times at micro batches 2..8: MAPE with the prior's linear growth in b (before) and with the
   closed form's GEMM-efficiency transfer (after, memx.learn.transfer.micro_batch_transfer);
4. search time on the default scenario (three-vendor-20 / llama2-7b / default), this tree vs a baseline tree
   run as a subprocess (--baseline DIR: a checkout of the commit before, e.g. `git worktree add ../base d172f51`),
   best of --repeats; skipped without --baseline.

Usage: PYTHONPATH=. .venv/bin/python bench/issue23_compute.py [--baseline ../base] [--repeats 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.runtime import load_runtime  # noqa: E402

SEARCH = ("import time; from memx.domain.catalog import load_cluster, load_model, load_search; "
          "from memx.planner.cost import AnalyticStageModel; from memx.planner.search import search; "
          "c, m, s = load_cluster('three-vendor-20'), load_model('llama2-7b'), load_search('default'); "
          "p = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types}); t = time.perf_counter(); "
          "search(c, m, s, p); print(time.perf_counter() - t)")


def megatron_v100() -> None:
    from tests.validation.test_v100_published import ITERATION_MS_V1, _gpt2_1_2b_on_one_v100

    m = _gpt2_1_2b_on_one_v100()
    print(f"megatron-1.2b-v100 closed form {m.iteration_time_ms:.0f} ms vs {ITERATION_MS_V1:.0f} ms: "
          f"time_ape={abs(m.iteration_time_ms - ITERATION_MS_V1) / ITERATION_MS_V1:.3f} fits={m.feasible}")


def vtrain_allreduce(realdata: Path) -> None:
    from tests.validation.test_v100_published import _lut

    lut = _lut(realdata / "vtrain" / "trace" / "v100" / "AR_GPU8_1M_1024M_LUT")
    big, rt, n = lut[lut.bytes >= 64 * 2**20], load_runtime("v100-16g", "nvidia"), 8
    for label, eff in (("before (0.75)", 0.75), (f"after ({rt.link_efficiency})", rt.link_efficiency)):
        pred = 2 * (n - 1) / n * big.bytes / (150.0 * 1e6 * eff) + 2 * (n - 1) * rt.collective_step_ms
        print(f"vtrain-v100-allreduce {label}: time_mape={np.mean(np.abs(pred - big.ms) / big.ms):.3f}")


def micro_batch_transfer() -> None:
    from memx.learn import fit_predictor
    from memx.planner.signatures import SIGNATURE_COLUMNS
    from memx.profiling import profile
    from memx.simulator import measure_stages

    cl, mo, sp = load_cluster("v100-t4-6"), load_model("gpt2-1024"), load_search("small")
    runs = profile(cl, mo, sp, backend="simulated", seed=0).stage_runs
    one = runs[runs.micro_batch == 1]
    pred = fit_predictor(one, {g.name: g for g in cl.gpu_types}, variant="hybrid-calibrated", seed=0)
    base = one[one.status == "ok"].loc[:, list(SIGNATURE_COLUMNS)].drop_duplicates().head(40)
    sigs = base.loc[base.index.repeat(3)].assign(micro_batch=np.tile([2, 4, 8], len(base))).reset_index(drop=True)
    meas = measure_stages(sigs.assign(precision="fp16"), seed=3, gpus=cl)
    ok = meas.status == "ok"
    for label, p in (("before (linear prior)", dataclasses.replace(pred, micro_batch_seen={})), ("after (GEMM-efficiency transfer)", pred)):
        t = p.predict(sigs.assign(precision="fp16"))["time_ms"][ok]
        print(f"learned-mb1-to-2..8 {label}: time_mape={np.mean(np.abs(t - meas.time_ms[ok]) / meas.time_ms[ok]):.3f} n={ok.sum()}")


def search_time(baseline: Path, repeats: int) -> None:
    def best(root: Path) -> float:
        out = [float(subprocess.run([sys.executable, "-c", SEARCH], cwd=root, env={"PYTHONPATH": str(root)},
                                    capture_output=True, text=True, check=True).stdout.split()[-1])
               for _ in range(repeats)]
        return min(out)

    new, old = best(REPO), best(baseline)
    print(f"search three-vendor-20/llama2-7b/default: {new:.2f} s vs baseline {old:.2f} s: ratio {new / old:.2f} (goal ≤ 1.2)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--realdata", type=Path, default=REPO.parent / "shared" / "realdata")
    args = ap.parse_args()
    megatron_v100()
    if (args.realdata / "vtrain").is_dir():
        vtrain_allreduce(args.realdata)
    micro_batch_transfer()
    if args.baseline is not None:
        search_time(args.baseline, args.repeats)


if __name__ == "__main__":
    main()
