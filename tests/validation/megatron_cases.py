"""Megatron-LM functional-test golden values (data/megatron_golden.yaml) as MemX plans, and the closed form's
predictions of them (issues #23/#27; docs/validation.md §Megatron-LM golden values).

One case = one test of NVIDIA/Megatron-LM's tests/functional_tests/test_cases at one platform: the published
Megatron arguments (model_config.yaml) and the measured steady-state iteration time and peak allocated memory of
rank world_size − 1 (golden_values_<env>_<platform>.json). `case_inputs` turns the arguments into a ModelArch, a
DGX cluster and the given plan; `evaluate` predicts them with memx.planner.estimate.estimate_plans and the
runtime-aware closed form (memx.planner.cost.AnalyticStageModel), memory with the allocator-only terms.
Shared by tests/validation/test_megatron_golden.py and bench/megatron_golden.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from memx.domain.catalog import load_gpu
from memx.domain.plan import Plan, Stage
from memx.domain.runtime import RuntimeProfile, load_runtime
from memx.domain.specs import Cluster, GpuType, ModelArch, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import _predict_stages, estimate_plans

DATA = Path(__file__).resolve().parent / "data" / "megatron_golden.yaml"
MIB = 2.0**20
ARGS_USED = frozenset("""
num-layers hidden-size ffn-hidden-size num-attention-heads group-query-attention num-query-groups seq-length
vocab-size tokenizer-type vocab-file make-vocab-size-divisible-by swiglu squared-relu untie-embeddings-and-output-weights
micro-batch-size global-batch-size step-batch-size-schedule tensor-model-parallel-size pipeline-model-parallel-size
num-layers-per-virtual-pipeline-stage num-virtual-stages-per-pipeline-rank context-parallel-size cp-comm-type
expert-model-parallel-size expert-tensor-parallel-size num-experts moe-router-topk moe-ffn-hidden-size
moe-shared-expert-intermediate-size moe-grouped-gemm moe-token-dispatcher-type use-distributed-optimizer
sequence-parallel recompute-granularity recompute-method recompute-num-layers bf16 fp16 transformer-impl
attention-backend use-flash-attn hidden-dropout attention-dropout deterministic-mode overlap-grad-reduce
overlap-param-gather""".split())

# Vocabulary sizes of the tokenizers the cases name, before Megatron pads them:
# - GPT-2 BPE (the CI data's bpe/vocab.json: Megatron-LM tools/common_pile_dataset/README.md "GPT-2 BPE vocabulary";
#   50,257 tokens, Radford et al. 2019 / openai-community/gpt2 config.json vocab_size);
# - Llama2Tokenizer: 32,000 (Touvron et al. 2023 §2.1); nemotron_2_256k.model: 256,000 (Parmar et al. 2024,
#   "Nemotron-4 15B Technical Report" §2: a 256,000-token SentencePiece vocabulary);
# - NullTokenizer: --vocab-size plus its end-of-document id (megatron/training/tokenizer NullTokenizer.vocab_size).
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000, "GPTSentencePieceTokenizer": 256000}
# DGX network, one NIC per GPU (NVIDIA DGX H100 user guide: 8 × ConnectX-7 400 Gb/s; DGX A100: 8 × ConnectX-6
# HDR 200 Gb/s), GB/s one direction
DGX_NIC_GBPS = {"h100-80g": 50.0, "a100-80g": 25.0}
GPUS_PER_NODE = 8


def load_data(path: Path = DATA) -> dict:
    import yaml

    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def padded_vocab(a: Mapping[str, Any]) -> int:
    """Megatron's padded vocabulary: a multiple of make-vocab-size-divisible-by (128) × tp
    (megatron/training/tokenizer: _vocab_size_with_padding)."""
    if "vocab-size" in a:
        v = int(a["vocab-size"]) + (a.get("tokenizer-type") == "NullTokenizer")
    else:
        v = TOKENIZER_VOCAB[a.get("tokenizer-type", "GPT2BPETokenizer")]
    m = int(a.get("make-vocab-size-divisible-by", 128)) * int(a.get("tensor-model-parallel-size", 1))
    return math.ceil(v / m) * m


def model_of(name: str, a: Mapping[str, Any]) -> ModelArch:
    """The transformer of Megatron arguments `a` (megatron/training/arguments.py defaults: ffn 4h, or
    int(4h·2/3 / 64)·64 with SwiGLU; MHA without --group-query-attention; tied embeddings unless untied)."""
    h, heads = int(a["hidden-size"]), int(a["num-attention-heads"])
    swiglu = bool(a.get("swiglu"))
    ffn = int(a.get("ffn-hidden-size") or (int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h))
    moe = {}
    if a.get("num-experts"):
        moe = dict(num_experts=int(a["num-experts"]), moe_router_topk=int(a.get("moe-router-topk", 2)),
                   moe_ffn_hidden=int(a.get("moe-ffn-hidden-size") or ffn))
    return ModelArch(name=name, layers=int(a["num-layers"]), hidden=h, ffn_hidden=ffn, heads=heads,
                     query_groups=int(a.get("num-query-groups", heads)) if a.get("group-query-attention") else heads,
                     vocab=padded_vocab(a), seq_len=int(a["seq-length"]), mlp="swiglu" if swiglu else "gelu",
                     tied_embeddings=not a.get("untie-embeddings-and-output-weights", False), **moe)


def dgx_cluster(gpu: GpuType, gpus: int) -> Cluster:
    nic = DGX_NIC_GBPS[gpu.name]
    node = Node(gpu=gpu, count=min(gpus, GPUS_PER_NODE), nic_bandwidth_gbps=nic, gpus_per_nic=1)
    return Cluster(name=f"dgx-{gpu.name}-{gpus}", inter_node_bandwidth_gbps=nic,
                   nodes=(node,) * max(1, gpus // GPUS_PER_NODE))


def global_batch(a: Mapping[str, Any]) -> int:
    """--global-batch-size, or the first step of --step-batch-size-schedule ("0:384 200B:768 …": the golden
    iterations all lie before the first switch)."""
    if "global-batch-size" in a:
        return int(a["global-batch-size"])
    return int(str(a["step-batch-size-schedule"]).split()[0].split(":")[1])


def virtual_stages(a: Mapping[str, Any]) -> int:
    pp = int(a.get("pipeline-model-parallel-size", 1))
    if "num-virtual-stages-per-pipeline-rank" in a:
        return int(a["num-virtual-stages-per-pipeline-rank"])
    if a.get("num-layers-per-virtual-pipeline-stage"):
        return int(a["num-layers"]) // pp // int(a["num-layers-per-virtual-pipeline-stage"])
    return 1


def plan_of(a: Mapping[str, Any], model: ModelArch, cluster: Cluster, gpu: GpuType, gpus: int) -> Plan:
    tp, pp = int(a.get("tensor-model-parallel-size", 1)), int(a.get("pipeline-model-parallel-size", 1))
    cp = int(a.get("context-parallel-size", 1))
    v = virtual_stages(a)
    rc = "full" if a.get("recompute-granularity") == "full" else a.get("recompute-granularity") or "none"
    stages = tuple(Stage(gpu=gpu.name, tp=tp, layers=model.layers // pp, recompute=rc) for _ in range(pp))
    return Plan(model=model.name, cluster=cluster.name, global_batch=global_batch(a),
                micro_batch=int(a["micro-batch-size"]), seq_len=model.seq_len, dp=gpus // (tp * pp * cp), stages=stages,
                distributed_optimizer=bool(a.get("use-distributed-optimizer")), precision=precision_of(a),
                sequence_parallel=bool(a.get("sequence-parallel")) and tp > 1, virtual_stages=v if v > 1 else 1,
                expert_parallel=int(a.get("expert-model-parallel-size", 1)), context_parallel=cp)


def precision_of(a: Mapping[str, Any]) -> str:
    """fp8 where the case runs Transformer Engine's fp8 GEMMs (--fp8-format, megatron/training/arguments.py), else
    bf16: the precision every golden runs in (memx.domain.precision)."""
    return "fp8" if a.get("fp8-format") else "bf16"


def fused_attention(a: Mapping[str, Any]) -> bool:
    """Transformer Engine's fused / flash attention unless the case runs the local (unfused) implementation."""
    return a.get("transformer-impl", "transformer_engine") != "local" and a.get("attention-backend") != "unfused"


@lru_cache(maxsize=8)
def _gpu(name: str) -> GpuType:
    return load_gpu(name)


@lru_cache(maxsize=8)
def _profile(gpu: str, vendor: str, fused: bool) -> RuntimeProfile:
    """The GPU's runtime entry with only what torch.cuda.max_memory_allocated counts: no CUDA context,
    communicator buffers nor allocator overhead (those lie outside allocated bytes; as in
    test_closed_form_published.py's Aceso check; the driver reserve is in no peak at all, issue #27)."""
    return dataclasses.replace(load_runtime(gpu, vendor), flash_attention=fused, context_mib=0,
                               collective_comm_mib=0, p2p_comm_mib=0, allocator_overhead_fraction=0)


def case_inputs(case: Mapping[str, Any], gpus: int | None = None):
    """(plan, cluster, model, predictor) of one case; `gpus` overrides the case's GPU count (infer_dp)."""
    a, gpu = case["args"], _gpu(case["gpu"])
    n = gpus or case["gpus"]
    model = model_of(case["case"].split("/")[-1].replace("_", "-")[:60], a)
    cluster = dgx_cluster(gpu, n)
    predictor = AnalyticStageModel(gpus={gpu.name: gpu}, runtime={gpu.name: _profile(gpu.name, gpu.vendor,
                                                                                       fused_attention(a))})
    return plan_of(a, model, cluster, gpu, n), cluster, model, predictor


_INFERRED: dict[tuple[str, str], list[tuple[int, float]]] = {}


def infer_dp(case: Mapping[str, Any], max_gpus: int = 1024) -> list[tuple[int, float]]:
    """For a case whose GPU count is not published: every (GPU count, predicted / measured static bytes of the last
    stage) Megatron would start — dp·tp·pp·cp GPUs in whole nodes, ep dividing dp·cp, the global batch a multiple
    of dp·micro batch (megatron/training/arguments.py) — best first. mem-allocated-bytes after an iteration is the
    weights, gradients and optimizer state (activations are freed), which the data-parallel size shards."""
    key = (case["case"], case["golden"])
    if key not in _INFERRED:
        _INFERRED[key] = _candidates(case, max_gpus)
    return _INFERRED[key]


def _candidates(case: Mapping[str, Any], max_gpus: int) -> list[tuple[int, float]]:
    a = case["args"]
    per_replica = int(a.get("tensor-model-parallel-size", 1)) * int(a.get("pipeline-model-parallel-size", 1)) \
        * int(a.get("context-parallel-size", 1))
    cp, ep, mbs = int(a.get("context-parallel-size", 1)), int(a.get("expert-model-parallel-size", 1)), \
        int(a["micro-batch-size"])
    out = []
    for dp in range(1, max_gpus // per_replica + 1):
        n = dp * per_replica
        if n % GPUS_PER_NODE or (dp * cp) % ep or global_batch(a) % (dp * mbs):
            continue
        plan, cluster, model, predictor = case_inputs(case, n)
        _, _, pred = _predict_stages([plan], model, predictor, cluster)
        out.append((n, float(pred["static_mem_mib"][-1]) * MIB / case["mem_allocated_bytes"]))
    return sorted(out, key=lambda r: abs(math.log(r[1])))


IDENTIFIED_WITHIN, OTHERS_BEYOND = 0.05, 0.10  # identified_gpus: the best candidate's and the others' distance


def identified_gpus(case: Mapping[str, Any]) -> int | None:
    """The published GPU count; else the one candidate of infer_dp whose predicted static bytes are within 5 % of
    the measured mem-allocated-bytes while every other candidate is more than 10 % off; else None (undetermined:
    the case is left out of the MAPE)."""
    if case["gpus"]:
        return int(case["gpus"])
    cands = infer_dp(case)
    if abs(cands[0][1] - 1) > IDENTIFIED_WITHIN or any(abs(r - 1) <= OTHERS_BEYOND for _, r in cands[1:]):
        return None
    return cands[0][0]


class Row(NamedTuple):
    case: str
    golden: str
    kind: str
    scale: str
    gpus: int
    time_pred_s: float
    time_meas_s: float
    mem_pred_gb: float
    mem_meas_gb: float

    @property
    def group(self) -> str:
        return f"{self.kind}/{self.scale}"

    @property
    def time_err(self) -> float:
        return self.time_pred_s / self.time_meas_s - 1

    @property
    def mem_err(self) -> float:
        return self.mem_pred_gb / self.mem_meas_gb - 1


def evaluate(data: Mapping[str, Any], *, flat: bool = False, scale: str | None = None) -> list[Row]:
    """One Row per case whose GPU count is known (identified_gpus), of `scale` (full / proxy) or all; `flat`: the
    earlier flat closed form (AnalyticStageModel runtime="none") instead of the runtime-aware one."""
    rows = []
    for case in data["cases"]:
        n = identified_gpus(case)
        if n is None or scale not in (None, case["scale"]):
            continue
        plan, cluster, model, predictor = case_inputs(case, n)
        if flat:
            predictor = dataclasses.replace(predictor, runtime="none")
        m = estimate_plans([plan], cluster, model, predictor)[0]
        rows.append(Row(case["case"], case["golden"], case["kind"], case["scale"], n, m.iteration_time_ms / 1e3,
                        case["iteration_time_s"], m.stage_peak_mib[-1] * MIB / 1e9,
                        case["mem_max_allocated_bytes"] / 1e9))
    return rows


def mape_by_group(rows: list[Row]) -> dict[str, tuple[int, float, float]]:
    """{kind/scale: (cases, time MAPE, memory MAPE)}, groups in first-seen order."""
    out = {}
    for g in dict.fromkeys(r.group for r in rows):
        rs = [r for r in rows if r.group == g]
        out[g] = (len(rs), float(np.mean([abs(r.time_err) for r in rs])), float(np.mean([abs(r.mem_err) for r in rs])))
    return out


def korthikanti_table5_cases(papers: Path) -> list[dict]:
    """Korthikanti et al. 2022 Table 5 (end-to-end iteration time, A100-80GB, Megatron-LM; transcribed in
    ../shared/realdata/papers) as cases of the form above: the Table 3 configuration (tp, pp, GPUs, global and
    micro batch, seq 2048, vocab 51,200, interleaved stages) with full recomputation, and with sequence parallelism
    + selective recomputation. GPT layers (GELU, ffn 4h, MHA, tied embeddings, dropout), attention without a
    fused kernel (2022: Megatron's fused softmax, no FlashAttention); dp = GPUs / (tp·pp) = 1 everywhere."""
    import pandas as pd

    cfg = pd.read_csv(papers / "korthikanti2022_table3_configs.csv").set_index("model")
    t5 = pd.read_csv(papers / "korthikanti2022_table5_end_to_end.csv").set_index("model")
    out = []
    for name, c in cfg.iterrows():
        for mode, col in (("full", "iter_time_s_full_recompute"), ("selective", "iter_time_s_seqpar_selective")):
            a = {"num-layers": int(c.layers), "hidden-size": int(c.hidden), "num-attention-heads": int(c.heads),
                 "seq-length": int(c.seq), "vocab-size": int(c.vocab), "micro-batch-size": int(c.microbatch),
                 "global-batch-size": int(c.global_batch), "tensor-model-parallel-size": int(c.tp),
                 "pipeline-model-parallel-size": int(c.pp), "recompute-granularity": mode,
                 "sequence-parallel": mode == "selective", "attention-backend": "unfused"}
            if c.interleave_stages > 1:
                a["num-layers-per-virtual-pipeline-stage"] = int(c.layers) // int(c.pp) // int(c.interleave_stages)
            kind = "interleaved" if c.interleave_stages > 1 else "dense"
            out.append({"case": f"korthikanti2022/{name}", "golden": mode, "kind": kind, "scale": "full",
                        "gpu": "a100-80g", "gpus": int(c.gpus), "args": a, "iteration_time_s": float(t5.loc[name, col])})
    return out


BRIDGE_DATA = DATA.with_name("megatron_bridge_perf.yaml")


def bridge_perf_cases(data: Mapping[str, Any]) -> list[dict]:
    """The Megatron-Bridge performance summary's DGX-H100 configs (`data`: load_data(BRIDGE_DATA)) as time-only cases
    (evaluate_time): the iteration time global batch × sequence / (tokens per s per GPU × GPUs) of the median release,
    `spread` the fastest and slowest release's times."""
    out = []
    for c in data["configs"]:
        a, n = c["args"], int(c["gpus"])
        tokens = global_batch(a) * int(a["seq-length"])
        times = sorted(tokens / (float(v) * n) for v in c["tokens_per_s_per_gpu"].values())
        out.append({"case": f"megatron-bridge/{c['name']}", "golden": ", ".join(c["tokens_per_s_per_gpu"]),
                    "kind": "interleaved" if virtual_stages(a) > 1 else "dense", "scale": "full", "gpu": "h100-80g",
                    "gpus": n, "args": a, "iteration_time_s": float(np.median(times)),
                    "spread": (times[0], times[-1])})
    return out


def evaluate_time(cases: list[dict], *, flat: bool = False,
                  profile: Mapping[str, Any] | None = None) -> list[tuple[str, str, str, float, float]]:
    """(case, mode, kind, predicted s, measured s) of time-only cases (korthikanti_table5_cases). `profile`: runtime
    fields to override (an option measured side by side, e.g. tp_overlap_exposed_fraction=None)."""
    out = []
    for case in cases:
        plan, cluster, model, predictor = case_inputs(case)
        if flat:
            predictor = dataclasses.replace(predictor, runtime="none")
        elif profile:
            predictor = dataclasses.replace(predictor, runtime={
                k: dataclasses.replace(v, **profile) for k, v in predictor.runtime.items()})
        m = estimate_plans([plan], cluster, model, predictor)[0]
        out.append((case["case"], case["golden"], case["kind"], m.iteration_time_ms / 1e3, case["iteration_time_s"]))
    return out
