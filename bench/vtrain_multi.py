"""vTrain multi-node (MICRO 2024, ../shared/realdata/vtrain/data/ground_truth_multi.csv): the closed form and the
virtual cluster against 109 measured Megatron-DeepSpeed iterations on 64–512 A100s (issue #23: networks as the
runtime runs them, on the real multi-node data there is).

The measurements: 3.6 B on 64 GPUs, 18.4 B on 256, 39.1 B and 175 B on 512; s = 2048, full activation recompute,
1F1B, 8 GPUs per node. What the file does not say, taken from vTrain's own configs (github.com/VIA-Research/vTrain,
commit f8dda84; read for facts, nothing copied):
- the network: config/validation/multi/*.json `inter_node_bandwidth: 800`, "total bandwidth of inter-node
  communication in Gbps" (src/config.py) = 100 GB/s per node, given here as one NIC of 100 GB/s per node (NCCL
  spreads a ring's channels over all of a node's NICs, so one ring crossing a node gets them all);
- the precision: fp16 (src/predictor.py sets torch's default dtype to float16) — fp16 gradients in the DP
  all-reduce (memx.domain.precision);
- the vocabulary: GPT-2's 50,257 (src/config.py default), padded by Megatron to a multiple of 128 · tp
  (`--make-vocab-size-divisible-by 128`, megatron/training/tokenizer `_vocab_size_with_padding`);
- the attention: eager (the stack predates FlashAttention), as tests/validation/test_simulator_vtrain.py;
- the GPU: A100-80G (the 39.1 B plans at tp 2 × pp 8 hold 2.4 B parameters per GPU, 49 GB of fp16 model states
  before activations: they could not have run on 40 GB).
The 6 rows at tp 16 (tensor parallelism across two nodes) are left out: a MemX stage's tp stays inside a node
(memx.domain.plan.validate_plan).

Printed: per model and overall, time MAPE, the median predicted / measured ratio, within-model Spearman and whether
the measured-best plan is predicted first; the rows the closed form (or the virtual cluster) calls out of memory,
although they ran. Then the closed form with the cluster's `nic_efficiency` (memx.planner.network; issue #27, docs/results.md §The
NIC's achieved bandwidth) at Calculon's inter-node efficiency 0.9 (realdata/calculon/systems/a100_80g.json
`networks[1].efficiency`) and at the virtual cluster's A100 link efficiency 0.78.

Usage: PYTHONPATH=. .venv/bin/python bench/vtrain_multi.py   (about 10 s)
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_gpu  # noqa: E402
from memx.domain.plan import Plan, Stage  # noqa: E402
from memx.domain.runtime import load_runtime  # noqa: E402
from memx.domain.specs import Cluster, ModelArch, Node  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.simulator import load_traits, simulate_plan  # noqa: E402

COLUMNS = ["params_b", "gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp", "time_ms"]
GPU = "a100-80g"
NODE_NIC_GBPS = 100.0  # 800 Gb/s per node (vTrain config/validation/multi/*.json, src/config.py)
GPT2_VOCAB = 50257  # vTrain src/config.py vocab_size default
PRECISION = "fp16"  # vTrain src/predictor.py: torch.set_default_dtype(torch.float16)


def load_multi(realdata: Path) -> pd.DataFrame:
    """The measured rows MemX can write as plans (tp ≤ 8: inside one node)."""
    df = pd.read_csv(realdata / "vtrain" / "data" / "ground_truth_multi.csv", encoding="utf-8-sig")
    df.columns = COLUMNS
    return df[df.tp <= 8].reset_index(drop=True)


def padded_vocab(tp: int) -> int:
    """Megatron's padded vocabulary: the next multiple of 128 · tp (`--make-vocab-size-divisible-by 128`)."""
    step = 128 * tp
    return math.ceil(GPT2_VOCAB / step) * step


def case(r, nic_efficiency: float | None = None) -> tuple[Plan, Cluster, ModelArch]:
    """One measured row as (plan, cluster of gpus/8 nodes with one 100 GB/s NIC each, model); `nic_efficiency`:
    the cluster field (memx.planner.network), None: line rate."""
    gpu = load_gpu(GPU)
    cluster = Cluster(name="vtrain-multi", inter_node_bandwidth_gbps=NODE_NIC_GBPS, nic_efficiency=nic_efficiency,
                      nodes=tuple(Node(gpu=gpu, count=8) for _ in range(int(r.gpus) // 8)))
    model = ModelArch(name="gpt", layers=int(r.layers), hidden=int(r.hidden), ffn_hidden=4 * int(r.hidden),
                      heads=int(r.heads), query_groups=int(r.heads), vocab=padded_vocab(int(r.tp)), seq_len=int(r.seq),
                      mlp="gelu")
    plan = Plan(model="gpt", cluster=cluster.name, global_batch=int(r.gbs), micro_batch=int(r.mbs), seq_len=int(r.seq),
                dp=int(r.dp), precision=PRECISION,
                stages=tuple(Stage(gpu=GPU, tp=int(r.tp), layers=int(r.layers) // int(r.pp), recompute="full")
                             for _ in range(int(r.pp))))
    return plan, cluster, model


def closed_form(df: pd.DataFrame, nic_efficiency: float | None = None, *, line_rate: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """(predicted ms, predicted feasible) of every row by the runtime-aware closed form with eager attention, the
    cluster's `nic_efficiency` as given (None: the runtime catalog's, 0.9; `line_rate`: the catalog's figure
    taken away, the NICs at line rate as before issue #27 made 0.9 the default)."""
    gpu = load_gpu(GPU)
    runtime = dataclasses.replace(load_runtime(gpu.name, gpu.vendor), flash_attention=False,
                                  **({"nic_efficiency": None} if line_rate else {}))
    pred = AnalyticStageModel(gpus={gpu.name: gpu}, runtime={gpu.name: runtime})
    times, feasible = [], []
    for r in df.itertuples(index=False):
        plan, cluster, model = case(r, nic_efficiency)
        est = estimate_plans([plan], cluster, model, pred)[0]
        times.append(est.iteration_time_ms)
        feasible.append(est.feasible)
    return np.array(times), np.array(feasible)


def virtual_cluster(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(simulated ms, ran without OOM) of every row: the vTrain-calibrated A100 traits with eager attention (as
    tests/validation/test_simulator_vtrain.py), on the same cluster."""
    traits = {GPU: dataclasses.replace(load_traits(GPU), flash_attention=False)}
    times, ran = [], []
    for r in df.itertuples(index=False):
        plan, cluster, model = case(r)
        run = simulate_plan(plan, cluster, model, seed=7, traits=traits)
        times.append(math.nan if run.oom else run.iteration_time_ms)
        ran.append(not run.oom)
    return np.array(times), np.array(ran)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scores:
    n: int
    mape: float
    median_ratio: float
    called_oom: int  # rows that ran, called out of memory
    per_model: dict[float, tuple[int, float, float, float, bool]]  # params_b → (n, mape, median ratio, ρ, best first)

    def lines(self, label: str) -> list[str]:
        out = [f"{label}: n={self.n} MAPE={100 * self.mape:.2f}% median pred/measured={self.median_ratio:.3f} "
               f"ran but called OOM={self.called_oom}"]
        for p, (n, mape, ratio, rho, first) in self.per_model.items():
            out.append(f"  {p:g}B n={n:3d} MAPE={100 * mape:.2f}% median ratio={ratio:.3f} Spearman={rho:.3f} "
                       f"best first={'yes' if first else 'no'}")
        return out


def scores(df: pd.DataFrame, pred_ms: np.ndarray, ok: np.ndarray) -> Scores:
    """MAPE over the rows with a time (the closed form times a row it calls OOM; the virtual cluster does not run
    one that runs out of memory), per model too."""
    frame = df.assign(pred=pred_ms, ratio=pred_ms / df.time_ms.to_numpy()).dropna(subset=["pred"])
    per = {}
    for p, g in frame.groupby("params_b"):
        per[float(p)] = (len(g), float((g.ratio - 1).abs().mean()), float(g.ratio.median()),
                         float(spearmanr(g.pred, g.time_ms).statistic), bool(g.pred.idxmin() == g.time_ms.idxmin()))
    return Scores(n=len(frame), mape=float((frame.ratio - 1).abs().mean()), median_ratio=float(frame.ratio.median()),
                  called_oom=int((~ok).sum()), per_model=per)


def main() -> None:
    realdata = Path(os.environ.get("MEMX_REALDATA", REPO.parent / "shared" / "realdata"))
    if not realdata.is_dir():
        sys.exit(f"published measurements not present at {realdata}")
    df = load_multi(realdata)
    print(f"vTrain ground_truth_multi: {len(df)} rows with tp ≤ 8 (of 109)")
    for line in scores(df, *closed_form(df)).lines("closed form (runtime catalog, eager attention, NICs at 0.9)"):
        print(line)
    link_efficiency = load_traits(GPU).link_efficiency  # the virtual cluster's A100 hop efficiency
    for line in scores(df, *virtual_cluster(df)).lines(f"virtual cluster (vTrain-calibrated A100, link efficiency "
                                                       f"{link_efficiency:g})"):
        print(line)
    for eff in (None, 1.0, link_efficiency):
        s = scores(df, *closed_form(df, eff, line_rate=eff is None))
        print(f"closed form, nic_efficiency {'line rate (catalog null)' if eff is None else f'{eff:g}'}: MAPE={100 * s.mape:.2f}% median "
              f"ratio={s.median_ratio:.3f} " + " ".join(f"{p:g}B={100 * v[1]:.2f}%" for p, v in s.per_model.items()))


if __name__ == "__main__":
    main()
