"""Features of a stage signature for the learned stage predictor.

Three groups, all numbers (no one-hot GPU names), so a GPU type of known spec can be predicted
before it is profiled:
- the signature itself (tp, layers, micro batch, recompute code and fraction, first/last, ...);
- the GPU's spec sheet (peak bf16 TFLOPS, memory GiB, memory and intra-node bandwidth);
- the analytic stage model's answer for the same signature (log time, log memory, log static).

`time_bases` / `memory_bases` are the physically motivated terms (per rank, one micro batch) the
calibrated prior is a non-negative linear combination of: each is linear in layers, recomputed
layers and in-flight micro batches, so the prior extrapolates along those axes where trees cannot.
Sources: Narayanan et al. 2021 §5.1 (GEMM FLOPs), Korthikanti et al. 2022 §4–5 (activation bytes,
recomputation), Patarasuk & Yuan 2009 (ring all-reduce); the split into bases is our choice.

Mixture of experts (issue #27): a MoE stage's signature — ep, experts per GPU, tokens per local expert and the
all-to-all's GB/s (memx.learn.experts.MOE_FEATURES) — is a feature group of its own; the bases stay the dense
equivalent's, as the labels of MoE rows are (memx.learn.experts).

Job options (issue #14). Sequence parallelism (active only at tp > 1) is a feature, and the bases
follow it: the LayerNorm/dropout regions and layer inputs (the s·b·h terms) are sharded over tp, and
each TP all-reduce becomes a reduce-scatter + all-gather — the same ring volume in twice the
collectives (Korthikanti et al. 2022 §4.2.2, Table 2). The distributed optimizer changes only the
static bytes per parameter (memx.planner.cost.static_bytes_per_param: 18, or 6 + 12/dp), which the
static basis carries (`static_bpp`); the profiler does not sweep it, so the learned corrections see
every row as it would be without it and the prior adds its static difference (memx.learn.model.prepare).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from memx.planner.cost import (
    BYTES_PER_PARAM_STATIC,
    MIB,
    attention_core_flops,
    layer_forward_flops,
    option_columns,
    precision_column,
    recomputed_layers,
    stage_params_per_rank,
    static_bytes_per_param,
)
from memx.domain.records import option_array
from memx.domain.specs import GpuType
from memx.learn.experts import MOE_FEATURES, feature_arrays as expert_features

RECOMPUTE_CODE = {"none": 0.0, "selective": 1.0, "full": 2.0}
GPU_FEATURES = ("peak_tflops_bf16", "memory_gib", "memory_bandwidth_gbps", "intra_node_bandwidth_gbps")
SIGNATURE_FEATURES = ("tp", "layers", "micro_batch", "seq_len", "inflight", "hidden", "ffn_hidden", "heads",
                      "query_groups", "vocab")
FEATURE_NAMES = SIGNATURE_FEATURES + (
    "recompute_code", "recompute_fraction", "recomputed_layers", "first", "last", "gelu", "sequence_parallel",
) + GPU_FEATURES + ("log_analytic_time_ms", "log_analytic_mem_mib", "log_analytic_static_mib",
                    "log_prior_time_ms", "log_prior_mem_mib") + MOE_FEATURES  # issue #27: last, so older boosters
# (trained without them) take the matrix without its last len(MOE_FEATURES) columns (memx.learn.boosters.columns_for)


def signature_arrays(sigs: pd.DataFrame) -> dict[str, np.ndarray]:
    """The signature columns as float64 arrays, plus n_rec (layers recomputed in full), flags, `sp`
    (sequence parallelism in effect: set and tp > 1), `rep` (what the s·b·h activations are divided by:
    tp with it, else 1) and `static_bpp` (static bytes per parameter, the distributed optimizer's)."""
    a = {k: sigs[k].to_numpy(dtype=np.float64) for k in SIGNATURE_FEATURES}
    rec = sigs["recompute"].astype(str).to_numpy()
    a["n_rec"] = recomputed_layers(rec, sigs["recompute_layers"].to_numpy(), a["layers"])
    a["sel"] = (rec == "selective").astype(np.float64)
    a["any_rec"] = (rec != "none").astype(np.float64)
    a["recompute_code"] = np.array([RECOMPUTE_CODE.get(r, 2.0) for r in rec], dtype=np.float64)
    a["first"] = sigs["first"].to_numpy(dtype=bool).astype(np.float64)
    a["last"] = sigs["last"].to_numpy(dtype=bool).astype(np.float64)
    a["gelu"] = (sigs["mlp"].astype(str).to_numpy() == "gelu").astype(np.float64)
    a["mlp"] = sigs["mlp"].astype(str).to_numpy()
    do, dp, sp = option_columns(sigs)
    a["tied"] = option_array(sigs, "tied_embeddings").astype(bool)  # one weight on a pp = 1 stage (stage_params_per_rank)
    a["sp"] = (sp & (a["tp"] > 1)).astype(np.float64)
    a["rep"] = np.where(a["sp"] > 0, a["tp"], 1.0)
    # the profile measured each stage in the plans' precision and without the distributed optimizer, and records
    # carry no precision: rows are seen as 18 B/param (bf16) scaled by the distributed optimizer's share in the
    # row's precision (bf16: (6 + 12/dp)/18; fp16: (4 + 16/dp)/20, memx.domain.precision; issue #23). The fitted
    # static weight absorbs the profile's own bytes per parameter (20/18 for fp16), so the saving comes out in
    # the measured precision's bytes; the trees never see the precision itself
    prec = precision_column(sigs)
    a["static_bpp"] = BYTES_PER_PARAM_STATIC * static_bytes_per_param(do, dp, prec) / static_bytes_per_param(False, 1, prec)
    a.update(expert_features(sigs))  # a MoE stage's signature (issue #27; 0 / 1 on dense rows)
    return a


def without_distributed_optimizer(a: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same arrays as the stage would be without the distributed optimizer (18 B/param static)."""
    return {**a, "static_bpp": np.full_like(a["layers"], BYTES_PER_PARAM_STATIC)}


def gpu_arrays(names: np.ndarray, gpus: Mapping[str, GpuType]) -> dict[str, np.ndarray]:
    """Spec-sheet numbers per row; KeyError names GPUs without a spec."""
    uniq, inv = np.unique(np.asarray(names).astype(str), return_inverse=True)
    missing = [u for u in uniq if u not in gpus]
    if missing:
        raise KeyError(f"no GPU spec for {missing}")
    return {f: np.array([float(getattr(gpus[u], f)) for u in uniq])[inv] for f in GPU_FEATURES}


def _allreduce_bytes_factor(tp: np.ndarray) -> np.ndarray:
    """Ring all-reduce volume factor 2(n−1)/n (Patarasuk & Yuan 2009); 0 for one rank."""
    return np.where(tp > 1, 2.0 * (tp - 1.0) / np.maximum(tp, 1.0), 0.0)


def time_bases(a: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray]) -> np.ndarray:
    """(n, 16) time terms in ms (or counts for per-op constants) whose weights the prior learns."""
    L, n_rec, sel = a["layers"], a["n_rec"], a["sel"]
    b, s, h, f, tp, v = (a[k] for k in ("micro_batch", "seq_len", "hidden", "ffn_hidden", "tp", "vocab"))
    peak = g["peak_tflops_bf16"] * 1e9  # FLOP per ms
    bw = g["memory_bandwidth_gbps"] * 1e6  # bytes per ms
    link = g["intra_node_bandwidth_gbps"] * 1e6
    core = attention_core_flops(b, s, h) / tp
    gemm = layer_forward_flops(b, s, h, f, a["heads"], a["query_groups"], a["mlp"]) / tp - core
    bsh, bsf = b * s * h / a["rep"], b * s * f / tp  # s·b·h regions sharded under sequence parallelism
    passes = 3.0 * L  # forward 1× + backward 2× (Narayanan 2021 §5.1)
    ar = _allreduce_bytes_factor(tp) * 2.0 * b * s * h / link  # one bf16 b·s·h all-reduce (or RS + AG: same volume)
    n_ar = 4.0 * L + 2.0 * n_rec  # 2 fwd + 2 bwd per layer, 2 per recomputed forward (Narayanan 2021 §3.3)
    cols = [
        passes * gemm / peak, n_rec * gemm / peak,  # layer GEMMs; recomputed forwards
        passes * core / peak, (n_rec + sel * L) * core / peak,  # attention core; recomputed core
        passes * 2.0 * bsh / bw, passes * 2.0 * bsf / bw, n_rec * 2.0 * (bsh + bsf) / bw,  # elementwise
        n_ar * ar, n_ar * (tp > 1) * (1.0 + a["sp"]),  # TP volume; per-collective latency (SP: RS + AG)
        passes, n_rec,  # per-layer constant costs (kernel launches, host dispatch)
        a["last"] * 6.0 * b * s * h * v / tp / peak, a["last"] * b * s * v / tp / bw,  # output GEMM, loss
        (a["first"] + a["last"]) * bsh / bw, a["first"] + a["last"], np.ones_like(L),
    ]
    return np.column_stack(cols)


def memory_bases(a: Mapping[str, np.ndarray]) -> np.ndarray:
    """(n, 13) memory terms in MiB (Korthikanti 2022 §4: per-layer activations by tensor)."""
    L, n_rec, sel, k = a["layers"], a["n_rec"], a["sel"], a["inflight"]
    b, s, h, f, tp, v = (a[x] for x in ("micro_batch", "seq_len", "hidden", "ffn_hidden", "tp", "vocab"))
    kv = h * a["query_groups"] / a["heads"]
    kept = k * (L - n_rec)
    bsh = b * s * h / a["rep"] / MIB  # s·b·h tensors, sharded over tp under sequence parallelism
    has = (L > 0).astype(np.float64)
    static = stage_params_per_rank(L, tp, a["first"], a["last"], h, f, a["heads"], a["query_groups"], v,
                                   a["mlp"], tied=a["tied"]) * a["static_bpp"] / MIB
    cols = [
        np.ones_like(L), static,
        kept * bsh, kept * b * s * (h + kv) / tp / MIB, kept * b * s * f / tp / MIB,  # replicated, QKV, MLP
        k * (L - n_rec - sel * L) * a["heads"] * s * s * b / tp / MIB,  # attention scores (selective drops)
        k * n_rec * bsh, k * a["first"] * bsh, k * a["last"] * (bsh + b * s * v / tp / MIB),  # inputs, ends
        a["last"] * b * s * v / tp / MIB,  # logit-gradient workspace
        has * b * s * f / tp / MIB, has * bsh,  # gradient temporaries of the largest tensors
        a["any_rec"] * has * (bsh + b * s * (h + kv + f) / tp / MIB),  # a recomputed layer re-materialised
    ]
    return np.column_stack(cols)


def static_basis(a: Mapping[str, np.ndarray]) -> np.ndarray:
    return memory_bases(a)[:, 1]


def feature_matrix(a: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray], analytic: pd.DataFrame,
                   prior_time_ms: np.ndarray, prior_mem_mib: np.ndarray, moe: bool = False) -> np.ndarray:
    """(n, len(FEATURE_NAMES)) float32, C-contiguous (what Booster.inplace_predict wants); without the MoE features
    (the last len(MOE_FEATURES)) unless `moe`: a dense predictor's columns, sampled by colsample_bytree, stay
    those it always had (four constant columns more change which the trees draw)."""
    L = a["layers"]
    frac = np.divide(a["n_rec"], L, out=np.zeros_like(L), where=L > 0)
    cols = [a[k] for k in SIGNATURE_FEATURES] + [a["recompute_code"], frac, a["n_rec"], a["first"], a["last"],
                                                  a["gelu"], a["sp"]]
    cols += [g[k] for k in GPU_FEATURES]
    cols += [np.log(np.maximum(analytic[c].to_numpy(dtype=np.float64), 1e-6))
             for c in ("time_ms", "peak_mem_mib", "static_mem_mib")]
    cols += [np.log(np.maximum(prior_time_ms, 1e-6)), np.log(np.maximum(prior_mem_mib, 1e-6))]
    cols += [a[k] for k in MOE_FEATURES] if moe else []
    return np.ascontiguousarray(np.column_stack(cols), dtype=np.float32)
