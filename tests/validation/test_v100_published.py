"""Published measurements of fp16 training on V100-class GPUs (issue #23), against the closed form.

1. Megatron-LM, one V100 (DGX-2H), GPT-2 1.2B: Shoeybi et al. 2019 (arXiv:1909.08053) Table 1 gives the model
   (hidden 1536, 16 heads, 40 layers; vocabulary padded to 51,200, sequence 1024) and §5.1 its single-GPU
   throughput, 39 TFLOP/s (30 % of peak), trained in fp16 mixed precision with activation checkpointing; NVIDIA
   ADLR's "MegatronLM's Supercharged V1.0" (nv-adlr.github.io/MegatronLMV1, 2020) reports the same model with
   batch size 8 at 1288 ms per iteration, 62.4 TFLOP/s (48 % of peak). Both figures are typed in here; an
   iteration is 62.4e12 × 1.288 s = 80.4 TFLOP, so the 2019 code ran it in 80.4 / 39 = 2061 ms.
2. vTrain's measured NCCL all-reduce on 8 V100s (../shared/realdata/vtrain/trace/v100, MIT licence): the
   runtime catalog's link efficiency (conf/runtime/v100-16g.yaml) is calibrated on it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from memx.domain.catalog import load_gpu
from memx.domain.plan import Plan, Stage
from memx.domain.runtime import load_runtime
from memx.domain.specs import Cluster, ModelArch, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans

ITERATION_MS_V1 = 1288.0  # Megatron-LM v1.0 blog, Table 1, 1.2B on 1 GPU, batch 8
TFLOPS_V1, TFLOPS_2019 = 62.4, 39.0  # same blog; Shoeybi et al. 2019 §5.1
ITERATION_MS_2019 = TFLOPS_V1 * ITERATION_MS_V1 / TFLOPS_2019  # the same 80.4 TFLOP at 39 TFLOP/s


def _gpt2_1_2b_on_one_v100(runtime: str = "catalog"):
    gpu = load_gpu("v100-32g")
    cluster = Cluster(name="one-v100", inter_node_bandwidth_gbps=12.5, nodes=(Node(gpu=gpu, count=1),))
    model = ModelArch(name="gpt2-1.2b", layers=40, hidden=1536, ffn_hidden=6144, heads=16, query_groups=16,
                      vocab=51200, seq_len=1024, mlp="gelu", tied_embeddings=True)
    plan = Plan(model=model.name, cluster=cluster.name, global_batch=8, micro_batch=8, seq_len=1024, dp=1,
                stages=(Stage(gpu=gpu.name, tp=1, layers=40, recompute="full"),), precision="fp16")
    pred = AnalyticStageModel(gpus={gpu.name: gpu}, runtime=runtime)
    return estimate_plans([plan], cluster, model, pred, reserve_gib=0.0)[0]


def test_megatron_gpt2_1_2b_on_one_v100_fp16():
    m = _gpt2_1_2b_on_one_v100()
    flat = _gpt2_1_2b_on_one_v100("none")
    err = abs(m.iteration_time_ms - ITERATION_MS_V1) / ITERATION_MS_V1
    print(f"Megatron 1.2B on one V100: closed form {m.iteration_time_ms:.0f} ms (flat {flat.iteration_time_ms:.0f}); "
          f"published {ITERATION_MS_V1:.0f} ms (v1.0) / {ITERATION_MS_2019:.0f} ms (2019); error vs v1.0 {err:.3f}")
    # 1387 ms: between the two published code versions, 7.7 % slower than v1.0's fused kernels. It was 1566 ms
    # (21.6 %) while the attention core's per-head backward GEMMs were costed as one GEMM whose weight gradient
    # reduces over all b·a heads (k×n output tiles: 8 tiles on 80 SMs); batched, they are b·a × k×n tiles
    # (issue #23, runtime_terms.gemm_fwd_bwd_ms `batch`; the virtual cluster always batched them)
    assert ITERATION_MS_V1 < m.iteration_time_ms < ITERATION_MS_2019 and err < 0.10
    assert m.feasible  # it trained on one 32 GB V100 (fp16: 20 B/param, memx.domain.precision)


def _lut(path) -> pd.DataFrame:
    df = pd.read_csv(path, encoding="utf-8-sig")
    return pd.DataFrame({"bytes": df.iloc[:, 0].astype(float), "ms": df.iloc[:, 3].astype(float) / 1e6})


def test_v100_link_efficiency_calibrated_on_vtrain_allreduce(realdata):
    lut = _lut(realdata / "vtrain" / "trace" / "v100" / "AR_GPU8_1M_1024M_LUT")
    big = lut[lut.bytes >= 64 * 2**20]
    rt, gpu = load_runtime("v100-16g", "nvidia"), load_gpu("v100-16g")
    n = 8  # ring all-reduce, closed form's ring_ms: 2(n−1)/n · bytes / (bw · efficiency) + 2(n−1) steps
    pred = 2 * (n - 1) / n * big.bytes / (gpu.intra_node_bandwidth_gbps * 1e6 * rt.link_efficiency) \
        + 2 * (n - 1) * rt.collective_step_ms
    ape = np.abs(pred - big.ms) / big.ms
    busbw = 2 * (n - 1) / n * lut.bytes.iloc[-1] / (lut.ms.iloc[-1] * 1e6)
    print(f"vTrain V100 8-GPU all-reduce ≥ 64 MiB: MAPE {ape.mean():.3f}; busbw at 1 GiB {busbw:.1f} GB/s")
    assert ape.mean() < 0.05 and busbw / gpu.intra_node_bandwidth_gbps == pytest.approx(rt.link_efficiency, abs=0.02)
