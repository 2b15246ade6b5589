"""vTrain (MICRO 2024) ground_truth_single.csv: 1440 measured Megatron-DeepSpeed iterations on 2–8
A100s in one node, full activation recompute, 1F1B. GPT models: gelu MLP, ffn 4h, vocab 51200
(assumed; the file gives none), s 1024. The A100 traits were fitted to this file (docs/simulator.md);
the stack predates FlashAttention, so attention is eager here.

Bounds: MAPE < 12 %, Spearman > 0.95 over all rows (measured at calibration: MAPE 8.1 %, ρ 0.988).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from memx.domain.catalog import load_gpu
from memx.domain.plan import Plan, Stage
from memx.simulator import load_traits, simulate_plan
from memx.domain.specs import Cluster, ModelArch, Node

COLUMNS = ["gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp", "time_ms"]


def simulate_vtrain(df: pd.DataFrame) -> np.ndarray:
    a100 = load_gpu("a100-80g")
    traits = {a100.name: dataclasses.replace(load_traits("a100-80g"), flash_attention=False)}
    cluster = Cluster(name="vtrain-node", inter_node_bandwidth_gbps=25, nodes=(Node(gpu=a100, count=8),))
    out = []
    for r in df.itertuples(index=False):
        model = ModelArch(name="gpt", layers=r.layers, hidden=r.hidden, ffn_hidden=4 * r.hidden, heads=r.heads,
                          query_groups=r.heads, vocab=51200, seq_len=r.seq, mlp="gelu")
        stages = tuple(Stage(gpu=a100.name, tp=r.tp, layers=r.layers // r.pp, recompute="full") for _ in range(r.pp))
        plan = Plan(model="gpt", cluster=cluster.name, global_batch=r.gbs, micro_batch=r.mbs, seq_len=r.seq,
                    dp=r.dp, stages=stages)
        out.append(simulate_plan(plan, cluster, model, seed=7, traits=traits).iteration_time_ms)
    return np.array(out, dtype=float)


def test_vtrain_single_node_iteration_times(realdata):
    df = pd.read_csv(realdata / "vtrain" / "data" / "ground_truth_single.csv", encoding="utf-8-sig")
    df.columns = COLUMNS
    predicted = simulate_vtrain(df)
    measured = df.time_ms.to_numpy()
    mape = float(np.mean(np.abs(predicted - measured) / measured))
    rho = float(spearmanr(predicted, measured).statistic)
    print(f"vTrain ground_truth_single: n={len(df)} MAPE={100 * mape:.2f}% Spearman={rho:.3f}")
    assert not np.isnan(predicted).any()
    assert mape < 0.12
    assert rho > 0.95
