"""Per-layer time-only profiles → whole plans: Sailor's published GH200 per-layer profiles
(profiles_sailor/*/GH-96/profile.json, layers = 1 plus embedding / output rows, memory missing) train the
predictor in time-only mode; it predicts 26 of the 27 measured Sailor plans on CSCS Clariden (OPT-350M and
GPT-Neo-2.7B, TP 4, PP 1–8, DP 1–32, uneven splits; GPT-NEO/N4_D4 is skipped: its layer list has 26 entries for a
34-entry model). Memory comes from the analytic model, and the
predictor says so (memory_source == "analytic").

Sailor's stage layer counts include the embedding (stage 0) and the output layer (last stage).
The GH200 is built here (96 GB HBM3, 989 TFLOPS bf16, 4 TB/s, 150 GB/s NVLink per direction), as in
tests/validation/test_simulator_aceso.py; Clariden's inter-node network is taken as 25 GB/s (our assumption).
Bounds are loose regression guards around the figures measured when this test was written (docs/predictor.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.domain.plan import Plan, Stage
from memx.learn import fit_predictor
from memx.profiling.backends.imported import read_sailor_profiles
from memx.domain.runtime import load_runtime
from memx.domain.specs import Cluster, GpuType, ModelArch, Node

GH200 = GpuType(name="gh200-96g", vendor="nvidia", memory_gib=96, peak_tflops_bf16=989,
                memory_bandwidth_gbps=4000, intra_node_bandwidth_gbps=150)
MODELS = {  # Sailor's training configs (model_configs/training_config_*.json)
    "OPT-350": ModelArch(name="OPT-350", layers=24, hidden=1024, ffn_hidden=4096, heads=16, query_groups=16,
                         vocab=50272, seq_len=2048, mlp="gelu"),
    "GPT-Neo-2.7": ModelArch(name="GPT-Neo-2.7", layers=32, hidden=2560, ffn_hidden=10240, heads=32, query_groups=32,
                             vocab=128256, seq_len=2048, mlp="gelu"),
}
MIB = 1024.0**2
SAILOR_RUNTIME = {GH200.name: dataclasses.replace(load_runtime("gh200-96g", "nvidia"), flash_attention=False)}


def sailor_plans(realdata) -> list[tuple[Plan, Cluster, ModelArch, float, float]]:
    df = pd.read_csv(realdata / "sailor" / "sailor_validation_summary.csv")
    out = []
    for r in df.itertuples(index=False):
        model = MODELS[r.model]
        counts = [int(x) for x in str(r.layers_per_stage).split()]
        if sum(counts) != model.layers + 2:  # GPT-NEO/N4_D4 lists 26 entries for a 34-entry model: skipped
            continue
        layers = list(counts)
        layers[0] -= 1  # the embedding
        layers[-1] -= 1  # the output layer
        dp = int(str(r.dp_per_stage).split()[0])
        stages = tuple(Stage(gpu=GH200.name, tp=4, layers=n) for n in layers)
        cluster = Cluster(name="clariden", inter_node_bandwidth_gbps=25,
                          nodes=tuple(Node(gpu=GH200, count=4) for _ in range(int(r.nodes))))
        plan = Plan(model=model.name, cluster=cluster.name, global_batch=int(r.gbs), micro_batch=int(r.mbs),
                    seq_len=model.seq_len, dp=dp, stages=stages)
        out.append((plan, cluster, model, float(r.measured_iter_time_s) * 1e3, float(r.measured_peak_mem_bytes) / MIB))
    return out


def predict_all(plans, predictor):
    t, m = [], []
    for plan, cluster, model, _, _ in plans:
        e = estimate_plans([plan], cluster, model, predictor)[0]
        t.append(e.iteration_time_ms)
        m.append(e.max_mem_mib)
    return np.array(t), np.array(m)


def gh200_profiles(realdata) -> pd.DataFrame:
    runs, _ = read_sailor_profiles(realdata / "sailor")
    src = runs["source"].astype(str)
    # The Metis-format GH-96 files: Sailor's GPT-Neo-2.7/GH-96/profile.json is OPT-350's (rejected on import).
    return runs[src.str.startswith("records:metis/") & src.str.contains("/GH-96/")].reset_index(drop=True)


def _gh200_fit(realdata):
    runs = gh200_profiles(realdata)
    assert runs["peak_mem_mib"].isna().all() and runs["layers"].max() <= 1
    # Memory without labels is the closed form's, under the stack Sailor ran: eager attention (neither Sailor's
    # nor Aceso's runtime uses a fused kernel: tests/validation/test_closed_form_published.py), where the
    # catalog's gh200-96g profile assumes FlashAttention (the modern Megatron stack): 51 % MAPE instead of 6.3 %.
    pred = fit_predictor(runs, {GH200.name: GH200}, variant="hybrid-calibrated", seed=0, runtime=SAILOR_RUNTIME)
    assert pred.memory_source == "analytic" and pred.time_only and pred.per_layer  # said in the output
    plans = sailor_plans(realdata)
    mt = np.array([p[3] for p in plans])
    mm = np.array([p[4] for p in plans])
    pt, pm = predict_all(plans, pred)
    at, am = predict_all(plans, AnalyticStageModel(gpus={GH200.name: GH200}))
    names = np.array([p[2].name for p in plans])
    return names, mt, mm, pt, pm, at


def test_time_only_per_layer_profiles_predict_sailor_gh200_plans(realdata):
    """Both models' plans from the Metis-format GH-96 per-layer profiles of OPT-350, GPT-Neo-2.7 and LLaMA-3-8,
    fitted together. Stage times are composed from the per-layer pieces (LearnedStagePredictor.per_layer):
    before, trees trained on layers ≤ 1 rows multiplied a 24-layer last stage by the output layer's
    correction and predicted OPT-350 ~16× too slow (time MAPE 16.3)."""
    from scipy.stats import spearmanr

    names, mt, mm, pt, pm, at = _gh200_fit(realdata)
    assert len(names) == 26 and (names == "GPT-Neo-2.7").sum() == 11
    for name in sorted(set(names)):
        sel = names == name
        ape, a_ape = np.abs(pt - mt)[sel] / mt[sel], np.abs(at - mt)[sel] / mt[sel]
        print(f"Sailor GH200 {name} n={sel.sum()} time MAPE {ape.mean():.3f} (max {ape.max():.3f}) Spearman "
              f"{spearmanr(pt[sel], mt[sel]).statistic:.3f}; analytic time MAPE {a_ape.mean():.3f}")
        # measured: GPT-Neo-2.7 8.7 %, OPT-350 8.8 % (the closed form alone: 57 % / 64 %)
        assert ape.mean() < 0.12 and ape.mean() < 0.5 * a_ape.mean()
    ape, mem_ape = np.abs(pt - mt) / mt, np.abs(pm - mm) / mm
    print(f"Sailor GH200 all n={len(mt)}: time MAPE {ape.mean():.3f}, peak memory MAPE {mem_ape.mean():.3f}")
    assert ape.mean() <= 0.15 and spearmanr(pt, mt).statistic > 0.9  # issue #16 goal: time ≤ 15 %
    # issue #16 goal: memory ≤ 10 %; measured 6.3 % while every closed-form peak held the 900 MiB driver reserve, which
    # no measured peak holds; without it (issue #27) 11.3 %, as the closed form's (test_closed_form_published.py):
    # the reserve was hiding the ~1 GB of GH200 non-allocator memory the catalog does not explain (open, docs/results.md)
    assert mem_ape.mean() <= 0.12
