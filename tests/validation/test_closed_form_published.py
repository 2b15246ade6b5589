"""The runtime-aware closed form (memx.planner.cost, runtime="catalog") against published
measurements read in place from ../shared/realdata (skipped when absent). Each check states its
tolerance and why.

- Korthikanti et al. 2022 (A100-80GB, Megatron-LM): Fig. 1 activations per GPU and Table 4 layer
  times with recomputation.
- Sailor on CSCS Clariden GH200 (sailor_validation_summary.csv): measured per-GPU peak memory of 26
  plans (OPT-350M, GPT-Neo-2.7B; TP 4, PP 1–8, DP 1–32, uneven splits).
- Aceso on Clariden GH200 (aceso_clariden_per_rank.csv): per-rank max_allocated / max_reserved and
  the process total, which separate activations, allocator overhead and non-allocator memory.

The GH200 (96 GB HBM3, 989 TFLOPS bf16, 4 TB/s, 150 GB/s NVLink per direction) is not in the
catalog: its runtime profile is conf/runtime/h100-80g.yaml (same Hopper die and software stack) with
eager attention — neither Sailor's nor Aceso's runtime uses a fused attention kernel (see
tests/validation/test_simulator_aceso.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from memx.domain.plan import Plan, Stage
from memx.domain.runtime import load_runtime
from memx.domain.specs import Cluster, GpuType, ModelArch, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.runtime_terms import activation_bytes, shapes
from test_predictor_sailor import sailor_plans  # same folder: pytest puts it on sys.path (rootdir, prepend mode)

GH200 = GpuType(name="gh200-96g", vendor="nvidia", memory_gib=96, peak_tflops_bf16=989,
                memory_bandwidth_gbps=4000, intra_node_bandwidth_gbps=150)
A100 = GpuType(name="a100-80g", vendor="nvidia", memory_gib=80, peak_tflops_bf16=312, memory_bandwidth_gbps=2039,
               intra_node_bandwidth_gbps=300)
OPT350 = ModelArch(name="opt-350m", layers=24, hidden=1024, ffn_hidden=4096, heads=16, query_groups=16,
                   vocab=50272, seq_len=2048, mlp="gelu")
GIB = 2**30


def gh200_profile(conf_root):
    return dataclasses.replace(load_runtime("h100-80g", "nvidia", conf_root), name="gh200", flash_attention=False)


def _korthikanti(realdata):
    return pd.read_csv(realdata / "papers" / "korthikanti2022_table3_configs.csv").set_index("model")


def layer_signatures(c, variants) -> pd.DataFrame:
    """One GPT layer of a Korthikanti Table 3 config on the A100, one signature row per variant (dict of
    columns to set: recompute, sequence_parallel, …)."""
    base = dict(gpu=A100.name, tp=int(c["tp"]), layers=1, micro_batch=int(c["microbatch"]), seq_len=int(c["seq"]),
                recompute="none", recompute_layers=pd.NA, first=False, last=False, inflight=1, hidden=int(c["hidden"]),
                ffn_hidden=4 * int(c["hidden"]), heads=int(c["heads"]), query_groups=int(c["heads"]),
                vocab=int(c["vocab"]), mlp="gelu")
    df = pd.DataFrame([{**base, **v} for v in variants])
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    return df


def test_korthikanti_fig1_activations_with_runtime_flags(realdata):
    """Fig. 1: TP-only without recomputation and sequence parallel + selective, GPT layers with dropout
    and eager attention (the paper's setup): activation_bytes with sequence_parallel off / on matches
    within 2 % (exact formulas; the chart values are read off a figure)."""
    fig1 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig1_memory_per_gpu_gib.csv")
    cfg = _korthikanti(realdata)
    for _, row in fig1.iterrows():
        c = cfg.loc[row["model"]]
        sp = row["mode"] != "tp_only_no_recompute"
        cols = {"micro_batch": [c["microbatch"]], "seq_len": [c["seq"]], "hidden": [c["hidden"]],
                "ffn_hidden": [4 * c["hidden"]], "heads": [c["heads"]], "query_groups": [c["heads"]],
                "vocab": [c["vocab"]], "tp": [c["tp"]], "mlp": ["gelu"]}
        none, selective, _ = activation_bytes(shapes(cols, np.array([sp])), np.array([False]))
        per_layer = selective if sp else none
        p, v = c["pp"], c["interleave_stages"]
        layers_held = c["layers"] * (1 + (p - 1) / (p * v)) if v > 1 else c["layers"]  # Korthikanti §4.2.3
        assert per_layer[0] * layers_held / GIB == pytest.approx(row["activations_GiB"], rel=0.02), row["model"]


def test_korthikanti_table4_layer_time(realdata, conf_root):
    """Table 4 (22B layer, A100, TP 8, no sequence parallelism): 19.6 ms without recomputation, +39 %
    full, +7 % selective. Runtime model: the absolute time within 15 % (the flat model needed 35 %:
    it assumed 50 % of peak throughout), full within 8 points (recomputed forward at the same
    efficiency; Megatron's measured +39 % includes extra synchronisation we do not model) and
    selective within 5 points."""
    t4 = pd.read_csv(realdata / "papers" / "korthikanti2022_table4_layer_time_22B.csv").set_index("experiment")
    c = _korthikanti(realdata).loc["22B"]
    prof = dataclasses.replace(load_runtime("a100-80g", "nvidia", conf_root), flash_attention=False)
    model = AnalyticStageModel(gpus={A100.name: A100}, runtime={A100.name: prof})
    t = model.predict(layer_signatures(c, [dict(recompute=rc) for rc in ("none", "full", "selective")]))["time_ms"]
    t = t.to_numpy()
    base = t4.loc["baseline no recompute", "combined_ms"]
    assert t[0] == pytest.approx(base, rel=0.15)
    assert t[1] / t[0] - 1 == pytest.approx(t4.loc["baseline with full recompute", "combined_ms"] / base - 1, abs=0.08)
    assert t[2] / t[0] - 1 == pytest.approx(t4.loc["selective recompute", "combined_ms"] / base - 1, abs=0.05)


def test_sailor_gh200_peak_memory(realdata, conf_root):
    """Measured per-GPU peak of 26 Sailor plans vs the closed form without any profiling: MAPE within
    12 % and every plan within −35 % / +35 % (uneven splits put different stages at the peak; the data gives one
    peak per plan). The flat closed form is off by ~35 % here and is checked to be worse. Issue #16's goal was 10 %,
    met (6.8 %, ratios 0.81..1.26) while every predicted peak held the 900 MiB driver reserve, which no measured
    peak holds; without it (issue #27) 11.3 %, ratios 0.69..1.23: the reserve was covering the ~1 GB of GH200
    non-allocator memory the catalog's context and communicator terms miss (test_aceso_non_allocator_memory_and_
    activation_share: predicted 1.8–2.1 against 2.9–3.9 GB measured; open, docs/results.md)."""
    plans = sailor_plans(realdata)
    gpus = {GH200.name: GH200}
    new = AnalyticStageModel(gpus=gpus, runtime={GH200.name: gh200_profile(conf_root)})
    old = AnalyticStageModel(gpus=gpus, runtime="none")
    ratio, ratio_old = [], []
    for plan, cluster, model, _, measured_mib in plans:
        ratio.append(estimate_plans([plan], cluster, model, new)[0].max_mem_mib / measured_mib)
        ratio_old.append(estimate_plans([plan], cluster, model, old)[0].max_mem_mib / measured_mib)
    r, r_old = np.array(ratio), np.array(ratio_old)
    print(f"Sailor GH200 peak memory: runtime MAPE {np.mean(np.abs(r - 1)):.3f} (ratios {r.min():.2f}..{r.max():.2f}); "
          f"flat MAPE {np.mean(np.abs(r_old - 1)):.3f}")
    assert len(r) == 26
    assert np.mean(np.abs(r - 1)) <= 0.12
    assert r.min() >= 0.65 and r.max() <= 1.35
    assert np.mean(np.abs(r - 1)) < np.mean(np.abs(r_old - 1))


def test_aceso_allocator_overhead_matches_catalog(realdata, conf_root):
    """Reserved / allocated at the peak over 740 ranks: the NVIDIA entry's fraction is the measured
    median (within 0.01) and the fallback for unmeasured parts covers the 90th percentile (safe side)."""
    d = pd.read_csv(realdata / "sailor" / "aceso_clariden_per_rank.csv")
    ratio = d["mem_max_reserved_MB"] / d["mem_max_allocated_MB"]
    assert load_runtime("nvidia", None, conf_root).allocator_overhead_fraction == pytest.approx(ratio.median() - 1, abs=0.01)
    assert load_runtime("no-such-gpu", "no-such-vendor", conf_root).allocator_overhead_fraction >= ratio.quantile(0.9) - 1 - 1e-3


def _aceso_plan(row) -> tuple[Plan, Cluster]:
    cluster = Cluster(name="clariden", inter_node_bandwidth_gbps=25,
                      nodes=tuple(Node(gpu=GH200, count=4) for _ in range(int(row.gpus) // 4)))
    pp = int(row.pp)
    plan = Plan(model=OPT350.name, cluster=cluster.name, global_batch=int(row.gbs), micro_batch=int(row.mbs_per_replica),
                seq_len=2048, dp=int(row.dp), stages=tuple(Stage(gpu=GH200.name, tp=int(row.tp), layers=24 // pp)
                                                            for _ in range(pp)))
    return plan, cluster


def test_aceso_non_allocator_memory_and_activation_share(realdata, conf_root):
    """Non-allocator memory (process total − max_reserved: context, NCCL communicators, workspaces)
    measured 2.9–3.9 GB per rank. The catalog's context + communicator terms (A100/H100 figures from
    PyTorch and NCCL sources) predict 1.8–2.1 GB: we accept ≥ 45 % and ≤ 100 % of the measured median
    per configuration (the one single-node run measured 3.9 GB, the others 2.9–3.3 GB) — a documented
    under-prediction on GH200 of about 1 GB that no published per-communicator figure explains (open;
    docs/planner.md). Allocated memory per stage: Aceso's op-by-op runtime keeps unfused intermediates
    Megatron's accounting does not (the simulator sees the same ~45 % gap, test_simulator_aceso.py), so
    only the falling shape is checked: each stage's share of stage 0 within 0.15."""
    summary = pd.read_csv(realdata / "sailor" / "aceso_clariden_summary.csv")
    per_rank = pd.read_csv(realdata / "sailor" / "aceso_clariden_per_rank.csv")
    prof = gh200_profile(conf_root)
    bare = dataclasses.replace(prof, context_mib=0, collective_comm_mib=0, p2p_comm_mib=0, allocator_overhead_fraction=0)
    for row in summary.itertuples(index=False):
        plan, cluster = _aceso_plan(row)
        full = estimate_plans([plan], cluster, OPT350, AnalyticStageModel(gpus={GH200.name: GH200},
                                                                          runtime={GH200.name: prof}))[0]
        alloc = np.array(estimate_plans([plan], cluster, OPT350, AnalyticStageModel(
            gpus={GH200.name: GH200}, runtime={GH200.name: bare}))[0].stage_peak_mib)
        fixed = np.array(full.stage_peak_mib) - alloc * (1 + prof.allocator_overhead_fraction)  # no driver reserve in a peak
        ranks = per_rank[per_rank["config"] == row.config]
        measured_fixed = float((ranks["mem_total_mb_MB"] - ranks["mem_max_reserved_MB"]).median())
        assert np.all(fixed >= 0.45 * measured_fixed) and np.all(fixed <= measured_fixed), row.config
        measured = np.array([float(x) for x in str(row.per_stage_max_allocated_MB).split()])
        assert alloc / alloc[0] == pytest.approx(measured / measured[0], abs=0.15), row.config
