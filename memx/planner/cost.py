"""Analytic stage model: FLOPs, parameter and activation memory, TP communication.

This is the baseline stage predictor and the prior of the learned one. All functions are
vectorised over numpy arrays of stage-signature columns. Units: bytes, FLOPs, ms, MiB.

Sources:
- Narayanan et al. 2021 (Megatron-LM PTD-P, arXiv:2104.04473) §5.1 / Appendix: FLOPs per layer.
- Korthikanti et al. 2022 (arXiv:2205.05198) §4: activation memory per layer, Eq. 1–2 (TP + SP),
  §5 selective recomputation, §4.3 embedding / output-layer activations.
- Distributed optimizer (Megatron-LM `--use-distributed-optimizer`): Megatron-LM docs, "Distributed
  Optimizer" (docs/source/api-guide/dist_optimizer.md, bytes-per-parameter table: bf16 params with
  fp32 grads 18 → 6 + 12/d); Rajbhandari et al. 2020 (ZeRO, arXiv:1910.02054) §5.1 (P_os: optimizer
  states partitioned over N_d) and §7.1 (reduce-scatter + all-gather move the same volume as one
  all-reduce, but the all-gather here moves bf16 params, Megatron's param_and_grad_buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from memx.domain.errors import InputError
from memx.domain.plan import Recompute
from memx.domain.precision import DEFAULT_PRECISION, GRAD_BYTES, PARAM_BYTES, PRECISIONS, STATIC_BYTES
from memx.domain.records import nullable_floats, option_array, signature_arrays
from memx.domain.runtime import RuntimeProfile, load_runtime
from memx.domain.specs import GpuType, ModelArch
from memx.planner.runtime_terms import (
    BF16,
    FP32,
    RuntimeColumns,
    Shapes,
    activation_bytes,
    attention_core_ms,
    backward_tp_ms,
    backward_workspace_bytes,
    communicator_mib,
    gemm_fwd_bwd_ms,
    layer_elementwise_bytes,
    layer_gemms_ms,
    logits_bytes,
    name_codes,
    per_run,
    ring_ms,
    shapes,
    uniform_precision,
)

if TYPE_CHECKING:
    import pandas as pd
# No pandas here: the planner predicts from numpy columns (AnalyticStageModel.predict_columns); `predict`
# takes and returns DataFrames for the learned stack, which imports pandas itself.

MIB = 1024.0 * 1024.0
# Megatron-LM bf16 training with fp32 gradient accumulation and Adam: bf16 weights (2) + fp32 grads
# (4) + fp32 master weights, momentum, variance (12) = 18 bytes/param (ZeRO paper §3.1 accounting,
# with Megatron's fp32 main grads). Other precisions: memx.domain.precision (fp16 20, fp8 18).
BYTES_PER_PARAM_STATIC = STATIC_BYTES[DEFAULT_PRECISION][0]
GRAD_BYTES_PER_PARAM = GRAD_BYTES[DEFAULT_PRECISION]  # fp32 main grads are what DP all-reduces (bf16)
ACT_BYTES = 2.0  # 16-bit activations (bf16 or fp16; fp8 keeps them in bf16, memx.domain.precision)


def option_columns(sigs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distributed_optimizer, dp, sequence_parallel) of signature rows (a DataFrame or a mapping of numpy
    columns); their defaults (memx.domain.records.OPTION_DEFAULTS) where a frame predates them."""
    def get(c: str) -> np.ndarray:
        return option_array(sigs, c)

    do = get("distributed_optimizer").astype(bool)
    return do, np.where(do, get("dp").astype(np.float64), 1.0), get("sequence_parallel").astype(bool)


def precision_column(sigs) -> np.ndarray:
    """The `precision` of signature rows (a DataFrame or a mapping of numpy columns; bf16 | fp16 | fp8,
    memx.domain.precision); bf16 where a table has none or a row is null (every record and frame before
    issue #23 meant bf16)."""
    n = len(next(iter(sigs.values()))) if isinstance(sigs, dict) else len(sigs)
    if "precision" not in sigs.keys():
        return np.full(n, DEFAULT_PRECISION, dtype=object)
    col = np.asarray(sigs["precision"].to_numpy(dtype=object) if hasattr(sigs["precision"], "to_numpy")
                     else sigs["precision"], dtype=object)
    if set(col.tolist()) <= set(PRECISIONS):  # the search's columns: every row named (no per-row Python loop)
        return col
    return np.where([isinstance(x, str) for x in col], col, DEFAULT_PRECISION).astype(object)


def _by_precision(precision, values: Mapping[str, float]) -> np.ndarray:
    """values[precision] per row (a scalar precision broadcasts); KeyError for an unknown one."""
    p = np.asarray(precision, dtype=object)
    if p.ndim == 0 or (p.size and (p == p.flat[0]).all()):  # one precision for every row (the usual case)
        first = str(p.flat[0]) if p.size else DEFAULT_PRECISION
        if first not in values:
            raise KeyError(f"unknown precision {first!r}; allowed: {', '.join(PRECISIONS)}")
        return np.full(p.shape, values[first], dtype=np.float64)
    uniq, inv = name_codes(p.reshape(-1))
    bad = set(uniq.tolist()) - set(PRECISIONS)
    if bad:
        raise KeyError(f"unknown precision(s) {sorted(bad)}; allowed: {', '.join(PRECISIONS)}")
    return np.array([values[k] for k in uniq.tolist()], dtype=np.float64)[inv].reshape(p.shape)


def gemm_peak_tflops(names: np.ndarray, precision, gpus: Mapping[str, GpuType]) -> np.ndarray:
    """Dense tensor peak of each row's GPU in its precision (GpuType.peak_tflops; spec sheets in conf/gpus)."""
    n = np.asarray(names)
    if not n.size:
        return np.zeros(0)
    p = np.broadcast_to(np.asarray(precision, dtype=object), n.shape)
    uniq, inv = name_codes(n.reshape(-1))
    if np.ndim(precision) == 0 or (p == p.flat[0]).all():  # one precision (the usual case): per GPU name only
        return np.array([gpus[g].peak_tflops(str(p.flat[0]), strict=False) for g in uniq])[inv].reshape(n.shape)
    prec, p_inv = name_codes(p.reshape(-1))
    pairs, pair_inv = np.unique(inv * len(prec) + p_inv, return_inverse=True)  # each (GPU, precision) once
    # a 16-bit precision a part lacks reads as its own 16-bit mode (GpuType.peak_tflops); plans are checked
    peak = [gpus[str(uniq[k // len(prec)])].peak_tflops(str(prec[k % len(prec)]), strict=False) for k in pairs.tolist()]
    return np.asarray(peak, dtype=np.float64)[pair_inv.reshape(-1)].reshape(n.shape)


def optimizer_shards(distributed_optimizer, dp) -> np.ndarray:
    """Ranks one parameter's optimizer state is split over: dp with the distributed optimizer, else 1."""
    return np.where(np.asarray(distributed_optimizer, dtype=bool), np.asarray(dp, dtype=np.float64), 1.0)


def static_bytes_per_param(distributed_optimizer, dp, precision=DEFAULT_PRECISION) -> np.ndarray:
    """Weights + grads + optimizer state per parameter: bf16/fp8 18 B, or 6 + 12/dp with the distributed
    optimizer; fp16 20 B, or 4 + 16/dp (Megatron-LM dist_optimizer docs table, memx.domain.precision;
    ZeRO §5.1 P_os)."""
    shards = optimizer_shards(distributed_optimizer, dp)
    plain, rep, shard = (_by_precision(precision, {k: v[i] for k, v in STATIC_BYTES.items()}) for i in range(3))
    return np.where(shards > 1, rep + shard / shards, plain)


def dp_step_ms(params_per_rank, dp, bandwidth_gbps, distributed_optimizer=False,
               precision=DEFAULT_PRECISION) -> np.ndarray:
    """The data-parallel gradient step of a stage (the T_dp of paper §3.1.2). Plain: ring all-reduce
    of the grads, 2(n−1)/n · gP. Distributed optimizer: ring reduce-scatter of the grads, (n−1)/n · gP,
    then ring all-gather of the updated 16-bit params, (n−1)/n · 2P (ZeRO §7.1; Megatron-LM
    dist_optimizer docs) — (g + 2)P(n−1)/n instead of 2gP(n−1)/n. g = 4 (fp32 main grads) for bf16 and
    fp8, 2 for fp16 (fp16 grads; memx.domain.precision)."""
    n = np.asarray(dp, dtype=np.float64)
    p = np.asarray(params_per_rank, dtype=np.float64)
    g = _by_precision(precision, GRAD_BYTES)
    plain = ring_allreduce_ms(p * g, n, bandwidth_gbps)
    sharded = 0.5 * ring_allreduce_ms(p * (g + _by_precision(precision, PARAM_BYTES)), n, bandwidth_gbps)
    return np.where(np.asarray(distributed_optimizer, dtype=bool), sharded, plain)


def layer_params(hidden, ffn_hidden, heads, query_groups, mlp):
    """Parameters of one transformer layer (whole layer, all TP ranks).

    Attention: Q and output projections h·h each, K and V h·(g·h/a) each under GQA.
    MLP: SwiGLU has three h×f matrices, GELU two (plus biases). Norms: 2 vectors (RMSNorm) or
    2×(weight, bias) (LayerNorm). (Narayanan 2021 §5.1 counts 12h² for the GPT layer: 4h² + 8h².)
    """
    h = np.asarray(hidden, dtype=np.float64)
    f = np.asarray(ffn_hidden, dtype=np.float64)
    kv = h * np.asarray(query_groups, dtype=np.float64) / np.asarray(heads, dtype=np.float64)
    gelu = np.asarray(mlp) == "gelu"
    attn = 2 * h * h + 2 * h * kv + np.where(gelu, h + 2 * kv + h, 0.0)
    mlp_p = np.where(gelu, 2 * h * f + f + h, 3 * h * f)
    norms = np.where(gelu, 4 * h, 2 * h)
    return attn + mlp_p + norms


def embedding_params(hidden, vocab):
    """Input embedding (first stage) or output layer (last stage): vocab × hidden."""
    return np.asarray(vocab, dtype=np.float64) * np.asarray(hidden, dtype=np.float64)


def stage_params_per_rank(layers, tp, first, last, hidden, ffn_hidden, heads, query_groups, vocab, mlp, *, tied):
    """Parameters held by one TP rank of a stage. The first stage holds the input embedding, the last the
    output layer and the final norm. `tied` (the model's tied_embeddings, per row or scalar): the output layer
    reuses the embedding's weight. Megatron-LM (megatron/core/models/gpt/gpt_model.py, GPTModel.__init__: the
    output layer's `skip_weight_param_allocation=pre_process and share_embeddings_and_output_weights`;
    megatron/core/models/common/language_module/language_module.py, setup_embeddings_and_output_layer) keeps
    ONE weight on a stage that is both first and last (pp = 1), and with pp > 1 a copy on the last stage,
    zero-initialised and kept equal to the first stage's by an all-reduce of their gradients
    (megatron/core/distributed/finalize_model_grads.py, _allreduce_word_embedding_grads): two weights, one
    per end stage. Untied: an embedding and an output weight wherever they lie."""
    per_layer = layer_params(hidden, ffn_hidden, heads, query_groups, mlp)
    emb = embedding_params(hidden, vocab)
    first, last = np.asarray(first, dtype=bool), np.asarray(last, dtype=bool)
    own_output = ~(np.asarray(tied, dtype=bool) & first)  # the output layer has a weight of its own
    total = np.asarray(layers) * per_layer + first * emb + last * (own_output * emb + np.asarray(hidden))
    return total / np.asarray(tp, dtype=np.float64)


def layer_forward_flops(micro_batch, seq_len, hidden, ffn_hidden, heads, query_groups, mlp):
    """Forward FLOPs of one layer for one micro batch (all TP ranks together).

    Narayanan 2021 §5.1: a GEMM of (m×k)·(k×n) costs 2mkn. Per token: QKV 2h(h+2·kv), scores QK^T
    and attention over V 2·2·s·h, output projection 2h², MLP 2·h·f per matrix (3 for SwiGLU, 2 GELU).
    """
    b = np.asarray(micro_batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    h = np.asarray(hidden, dtype=np.float64)
    f = np.asarray(ffn_hidden, dtype=np.float64)
    kv = h * np.asarray(query_groups, dtype=np.float64) / np.asarray(heads, dtype=np.float64)
    n_mats = np.where(np.asarray(mlp) == "gelu", 2.0, 3.0)
    per_token = 2 * h * (h + 2 * kv) + 2 * h * h + n_mats * 2 * h * f
    return b * s * per_token + attention_core_flops(b, s, h)


def attention_core_flops(micro_batch, seq_len, hidden):
    """QK^T and attention-over-V: 2·2·b·s²·h (Narayanan 2021 §5.1); what selective recompute redoes
    (Korthikanti 2022 §5)."""
    return 4.0 * np.asarray(micro_batch, dtype=np.float64) * np.asarray(seq_len, dtype=np.float64) ** 2 * np.asarray(
        hidden, dtype=np.float64
    )


def layer_activation_bytes_tp_only(micro_batch, seq_len, hidden, heads, tp):
    """Tensor parallelism without sequence parallelism, GPT layer: s·b·h·(10 + 24/t + 5·a·s/(h·t))
    (Korthikanti 2022 Eq. 2): norms, dropouts and the layer inputs are replicated on every rank."""
    s, b, h = (np.asarray(x, dtype=np.float64) for x in (seq_len, micro_batch, hidden))
    t = np.asarray(tp, dtype=np.float64)
    return s * b * h * (10.0 + 24.0 / t + 5.0 * np.asarray(heads) * s / (h * t))


def layer_activation_bytes(micro_batch, seq_len, hidden, ffn_hidden, heads, query_groups, mlp, tp):
    """Activation bytes one layer stores for backward, per TP rank, no recomputation.

    Korthikanti 2022 §4.1–4.2 with tensor + sequence parallelism (Eq. 4: sbh(34 + 5as/h)/t for
    the GPT layer), generalised to GQA and SwiGLU: attention 7sbh + 4sbh·(g/a) + 5as²b, MLP
    sbh(3) + 4sbf (GELU) or 6sbf (SwiGLU), two norms 4sbh.
    """
    b = np.asarray(micro_batch, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    h = np.asarray(hidden, dtype=np.float64)
    f = np.asarray(ffn_hidden, dtype=np.float64)
    a = np.asarray(heads, dtype=np.float64)
    ratio = np.asarray(query_groups, dtype=np.float64) / a
    gelu = np.asarray(mlp) == "gelu"
    sbh = s * b * h
    attn = 7 * sbh + 4 * sbh * ratio
    mlp_b = 3 * sbh + np.where(gelu, 4.0, 6.0) * s * b * f
    return (attn + mlp_b + 4 * sbh + attention_scores_bytes(b, s, a)) / np.asarray(tp, dtype=np.float64)


def attention_scores_bytes(micro_batch, seq_len, heads):
    """Softmax input/output and dropout mask: 5·a·s²·b bytes (Korthikanti 2022 §4.1); selective
    recomputation drops exactly this term (§5)."""
    return 5.0 * np.asarray(heads, dtype=np.float64) * np.asarray(seq_len, dtype=np.float64) ** 2 * np.asarray(
        micro_batch, dtype=np.float64
    )


def layer_input_bytes(micro_batch, seq_len, hidden, tp):
    """Full recomputation keeps only each layer's input: 2sbh bytes, sharded by sequence parallelism
    (Korthikanti 2022 §4.2, 'full activation recomputation')."""
    return 2.0 * np.asarray(micro_batch) * np.asarray(seq_len) * np.asarray(hidden) / np.asarray(tp, dtype=np.float64)


def output_layer_bytes(micro_batch, seq_len, hidden, vocab, tp):
    """Last stage: the output layer's input (2sbh) and fp32 logits for the cross-entropy (4sbv),
    per TP rank (Korthikanti 2022 §4.3)."""
    b, s = np.asarray(micro_batch, dtype=np.float64), np.asarray(seq_len, dtype=np.float64)
    return (2.0 * s * b * np.asarray(hidden) + 4.0 * s * b * np.asarray(vocab)) / np.asarray(tp, dtype=np.float64)


def embedding_output_bytes(micro_batch, seq_len, hidden, tp):
    """First stage: the embedding dropout mask, sbh/t (Korthikanti 2022 §4.3)."""
    return np.asarray(micro_batch) * np.asarray(seq_len) * np.asarray(hidden) / np.asarray(tp, dtype=np.float64)


def ring_allreduce_ms(nbytes, ranks, bandwidth_gbps):
    """Ring all-reduce: 2·(n−1)/n · bytes / bandwidth (Patarasuk & Yuan 2009; docs/architecture.md §1F1B assembly)."""
    n = np.asarray(ranks, dtype=np.float64)
    return np.where(n > 1, 2.0 * (n - 1) / np.maximum(n, 1) * nbytes / (np.asarray(bandwidth_gbps) * 1e9) * 1e3, 0.0)


@dataclass(frozen=True, kw_only=True)
class AnalyticStageModel:
    """Closed-form stage predictor (baseline and prior).

    `runtime`: "catalog" (default) adds what a real process holds and achieves beyond the textbook
    formulas, per GPU type from conf/runtime (memx.domain.runtime; memx.planner.runtime_terms);
    a mapping GPU name → RuntimeProfile gives the profiles directly; "none" is the earlier closed
    form, kept selectable so both can be measured side by side (bench/closed_form_accuracy.py):
    `mfu`: achieved fraction of bf16 peak for the GEMMs. Narayanan 2021 Table 1 reports 44–52% of
    peak on A100 for end-to-end Megatron training; we take 0.5 for the layer GEMMs.
    `elementwise_passes`: memory-bound kernels (norms, activations, dropout, residuals) read and write
    each stored activation byte about this many times per forward (our assumption; it is what makes
    recomputation cost depend on memory bandwidth, the paper's §3.1.1 observation).
    """

    ROW_WISE: ClassVar[bool] = True  # each row's prediction is a function of that row alone (memx.planner.predictions.predict_rows)
    gpus: Mapping[str, GpuType]
    mfu: float = 0.5
    elementwise_passes: float = 2.0
    runtime: str | Mapping[str, RuntimeProfile] = "catalog"
    conf_root: Path | None = None
    name: str = "analytic"

    def profiles(self) -> Mapping[str, RuntimeProfile]:
        """The runtime profile of every GPU in `gpus` (InputError for a bad catalog entry)."""
        if not isinstance(self.runtime, str):
            return self.runtime
        if self.runtime != "catalog":
            raise InputError(f"AnalyticStageModel: field 'runtime' is {self.runtime!r}; allowed: catalog, none, "
                             "or a mapping of GPU name to RuntimeProfile")
        return {n: load_runtime(n, g.vendor, self.conf_root) for n, g in self.gpus.items()}

    def nic_efficiency(self, gpu_types) -> float | None:
        """The NICs' achieved / line rate among `gpu_types` per the runtime catalog (the smallest: a ring runs at its
        slowest hop); None with runtime "none" (the paper's B) or no entry giving one (memx.planner.network.achieved)."""
        if self.runtime == "none":
            return None
        given = self.profiles()
        found = [(given.get(g.name) or load_runtime(g.name, g.vendor, self.conf_root)).nic_efficiency for g in gpu_types]
        return min((x for x in found if x is not None), default=None)

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.predict_columns(sigs), index=sigs.index)

    def predict_columns(self, sigs: Any) -> dict[str, np.ndarray]:
        """PREDICTION_COLUMNS as numpy arrays from a signature table (a mapping of numpy columns, as
        memx.planner.signatures.signature_columns builds, or a DataFrame): the planner's path, no pandas."""
        if self.runtime == "none":
            return predict_stage_frame(sigs, self.gpus, mfu=self.mfu, elementwise_passes=self.elementwise_passes)
        return predict_runtime_frame(sigs, self.gpus, self.profiles())


def _gpu_columns(names: np.ndarray, gpus: Mapping[str, GpuType]) -> dict[str, np.ndarray]:
    uniq, inv = name_codes(names)
    missing = [u for u in uniq if u not in gpus]
    if missing:
        raise KeyError(f"no GPU spec for {missing}")
    cols = {
        "peak": np.array([gpus[u].peak_tflops_bf16 for u in uniq]) * 1e12,
        "membw": np.array([gpus[u].memory_bandwidth_gbps for u in uniq]) * 1e9,
        "intra": np.array([gpus[u].intra_node_bandwidth_gbps for u in uniq]),
    }
    return {k: v[inv] for k, v in cols.items()}


def recomputed_layers(recompute: np.ndarray, recompute_layers: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Layers recomputed in full: all for `full` without a count, N for the block method."""
    rl = nullable_floats(recompute_layers)  # null: all layers
    full = np.asarray(recompute) == Recompute.FULL.value
    return np.where(full, np.where(np.isnan(rl), layers, np.minimum(rl, layers)), 0.0)


def predict_stage_frame(sigs: Any, gpus: Mapping[str, GpuType], *, mfu: float, elementwise_passes: float) -> dict[str, np.ndarray]:
    """time_ms, peak_mem_mib, static_mem_mib for each stage signature row (numpy columns)."""
    c = signature_arrays(sigs)
    g = _gpu_columns(c["gpu"], gpus)
    L = c["layers"].astype(np.float64)
    tp = c["tp"].astype(np.float64)
    first = c["first"].astype(bool)
    last = c["last"].astype(bool)
    shape = (c["hidden"], c["ffn_hidden"], c["heads"], c["query_groups"], c["mlp"])
    b, s, h, v = c["micro_batch"], c["seq_len"], c["hidden"], c["vocab"]
    n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
    selective = c["recompute"] == Recompute.SELECTIVE.value

    # --- time: forward 1×, backward 2× the forward FLOPs (Narayanan 2021 §5.1); recomputation adds
    # one forward per recomputed layer, selective adds the attention core (Korthikanti 2022 §5).
    f_layer = layer_forward_flops(b, s, *shape) / tp
    f_core = attention_core_flops(b, s, h) / tp
    f_out = 2.0 * b * s * h * v / tp * last  # output layer GEMM, forward
    flops = 3.0 * (L * f_layer + f_out) + n_rec * f_layer + selective * L * f_core
    # fp8 (Transformer Engine) runs the layers' linear GEMMs at the fp8 peak; the attention core and the
    # output layer stay 16-bit (TE docs, "Using FP8 with Transformer Engine": fp8 autocast covers te.Linear)
    prec = precision_column(sigs)
    linear = (3.0 * L + n_rec) * (f_layer - f_core)
    lin_peak = gemm_peak_tflops(c["gpu"], prec, gpus) * 1e12
    compute_ms = ((flops - linear) / g["peak"] + linear / lin_peak) / mfu * 1e3
    act_none = layer_activation_bytes(b, s, *shape, tp)
    passes = elementwise_passes * (3.0 * L + n_rec + selective * L * 0.5)
    membound_ms = passes * act_none / g["membw"] * 1e3
    # TP: 2 all-reduces of the b·s·h bf16 activation forward, 2 backward, per layer; a recomputed
    # forward repeats its 2 (Narayanan 2021 §3.3, Fig. 4).
    n_ar = 4.0 * L + 2.0 * n_rec
    tp_ms = n_ar * ring_allreduce_ms(ACT_BYTES * b * s * h, tp, g["intra"])
    time_ms = compute_ms + membound_ms + tp_ms

    # --- memory
    params = stage_params_per_rank(L, tp, first, last, *shape[:4], v, shape[4], tied=c["tied_embeddings"])
    do, dp, _ = option_columns(c)  # this form keeps Korthikanti Eq. 4 (SP) activations in any case
    static = params * static_bytes_per_param(do, dp, prec)
    keep = act_none - selective * attention_scores_bytes(b, s, c["heads"]) / tp
    act_mb = (L - n_rec) * keep + n_rec * layer_input_bytes(b, s, h, tp)
    act_mb = act_mb + first * embedding_output_bytes(b, s, h, tp) + last * output_layer_bytes(b, s, h, v, tp)
    # Backward of a recomputed layer re-materialises that layer's activations: one layer's worth.
    work = np.where(n_rec > 0, act_none, 0.0)
    peak = static + c["inflight"].astype(np.float64) * act_mb + work
    return {"time_ms": time_ms, "peak_mem_mib": peak / MIB, "static_mem_mib": static / MIB}


def model_static_bytes(model: ModelArch) -> float:
    """Weights + grads + optimizer state of the whole model (18 B/param)."""
    total = model.layers * layer_params(model.hidden, model.ffn_hidden, model.heads, model.query_groups, model.mlp)
    total = total + embedding_params(model.hidden, model.vocab) * (1 if model.tied_embeddings else 2)
    return float(total) * BYTES_PER_PARAM_STATIC


def _end_layers_ms(x: Shapes, rc: RuntimeColumns, first: np.ndarray, last: np.ndarray,
                   t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Embedding (first stage) and output layer + cross entropy (last stage): device ms, host ops
    and TP communication of the forward and backward passes.

    Embedding: vocab-parallel lookup (read + write 2 B per element of b·s·h, GPT adds learned
    positions and dropout) and one TP all-reduce of b·s·h (Shoeybi 2019 §3); backward scatter-adds
    into the fp32 gradient rows (read-modify-write). Output: final norm, the logits GEMM
    [b·s × h]·[h × v/t], Megatron's vocab-parallel cross entropy in fp32 (reads bf16 logits, writes
    fp32, max / exp / sum passes: ~18 B per logit forward, ~10 B backward) with three small
    all-reduces (max, sum-exp, target logit). `t`: `_layer_terms` (the logits GEMM, the all-reduces)."""
    T, th = x.tokens, x.tokens * x.h / x.rep
    logits = T * x.v / x.t
    out_f, out_b = t["out_f"], t["out_b"]
    mb = rc.membw_bytes_per_ms
    return {
        "fwd": first * ((4.0 + 6.0 * x.dropout) * th / mb) + last * (out_f + (4.0 * th + 18.0 * logits) / mb),
        "bwd": first * (10.0 * th / mb) + last * (out_b + (8.0 * th + 10.0 * logits) / mb),
        "ops_fwd": first * 3.0 + last * 7.0,
        "ops_bwd": first * 3.0 + last * 5.0,
        "comm": first * t["ring_act"] + last * 3.0 * t["ring_loss"],
    }


def _layer_terms(x: Shapes, rc: RuntimeColumns, rc_linear: RuntimeColumns) -> dict[str, np.ndarray]:
    """What one layer costs (GEMMs, attention core, memory-bound kernels, TP all-reduce) and the output
    layer's logits GEMM: functions of the row's shapes and GPU columns alone, not of its layer count,
    recomputation or place in the pipeline."""
    g_f, g_b = layer_gemms_ms(x, rc_linear)
    a_f, a_b, a_ops = attention_core_ms(x, rc)
    ew_ops = 6.0 + x.swiglu  # 2 norms, 2 bias-dropout-adds, activation, 2 layout copies (+ RoPE)
    ew = layer_elementwise_bytes(x) / rc.membw_bytes_per_ms + ew_ops * rc.launch_ms
    out_f, out_b = gemm_fwd_bwd_ms(x.tokens, x.v / x.t, x.h, rc)
    ring_act = ring_ms(BF16 * x.tokens * x.h, x.t, rc)  # one all-reduce of the b·s·h activation
    return {"g_f": g_f, "g_b": g_b, "a_f": a_f, "a_b": a_b, "a_ops": a_ops, "ew_ops": ew_ops, "ew": ew,
            "comm": 2.0 * ring_act, "ring_act": ring_act, "ring_loss": ring_ms(FP32 * x.tokens, x.t, rc),
            "out_f": out_f, "out_b": out_b}


def _runtime_time_ms(x: Shapes, rc: RuntimeColumns, L, n_rec, selective, first, last,
                     rc_linear: RuntimeColumns | None = None) -> np.ndarray:
    """Forward + backward of one micro batch. Each pass takes the longer of device time and host
    dispatch (ops × host_op_ms: the host issues eager operators asynchronously), plus the blocking
    TP collectives (2 all-reduces of b·s·h per layer and pass, Shoeybi 2019 §3 f/g operators; a
    recomputed forward repeats its 2). Recomputation reruns the layer forward (full, Chen 2016) or the
    attention core (selective, Korthikanti 2022 §5). In 1F1B with at most pp − s micro batches in
    flight, the activation and gradient hops to the neighbours lie on the cycle every micro batch
    goes around (Narayanan 2021 §2.2): 2 transfers per micro batch, latency + b·s·h/t bytes (scatter-
    gather over TP) at the intra-node link, a lower bound the assembly completes with the real link.
    `rc_linear`: the columns the layers' linear GEMMs run at (their precision's peak); default `rc`."""
    t = per_run(_layer_terms, x, rc, rc if rc_linear is None else rc_linear)
    a_f, a_ops, ew_ops, ew, comm = t["a_f"], t["a_ops"], t["ew_ops"], t["ew"], t["comm"]
    lay_f, lay_b = t["g_f"] + a_f + ew, t["g_b"] + t["a_b"] + 2.0 * ew
    ops_f = 4.0 + a_ops + ew_ops + 2.0 * (x.t > 1)
    end = _end_layers_ms(x, rc, first, last, t)
    sel = selective * L
    dev_f = L * lay_f + end["fwd"]
    dev_b = L * lay_b + n_rec * lay_f + sel * a_f + end["bwd"]
    host_f = (L * ops_f + end["ops_fwd"]) * rc.host_ms
    host_b = (L * 2.0 * ops_f + n_rec * ops_f + sel * a_ops + end["ops_bwd"]) * rc.host_ms
    comm_f, comm_b = L * comm + end["comm"], L * backward_tp_ms(x, rc, t["ring_act"], comm) + n_rec * comm
    p2p = 2.0 * ~(first & last) * (rc.p2p_ms + BF16 * x.tokens * x.h / x.t / rc.link_bytes_per_ms)
    return np.maximum(dev_f, host_f) + comm_f + np.maximum(dev_b, host_b) + comm_b + p2p


def predict_runtime_frame(sigs: Any, gpus: Mapping[str, GpuType],
                          profiles: Mapping[str, RuntimeProfile]) -> dict[str, np.ndarray]:
    """time_ms, peak_mem_mib, static_mem_mib with the runtime terms (memx.planner.runtime_terms).

    Peak = context + communicators + (static + inflight × activations + workspace) × (1 + allocator overhead),
    as measured: no driver reserve (off the capacity, memx.domain.runtime.usable_capacity_mib); the ratio applies
    to everything it holds (PyTorch CUDA memory management docs; measured 1.01–1.12 by Aceso
    on Clariden, conf/runtime). The workspace is the larger of one layer's backward transients (plus
    the re-materialised layer under recomputation, Korthikanti 2022 §5) and the logits gradient."""
    c = signature_arrays(sigs)
    rc = RuntimeColumns.of(c["gpu"], gpus, profiles)
    do, dp, sp = option_columns(c)
    x = shapes(c, sp | rc.sp)  # the stage's --sequence-parallel, or a GPU entry that always runs it
    L = c["layers"].astype(np.float64)
    first, last = c["first"].astype(bool), c["last"].astype(bool)
    n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
    selective = c["recompute"] == Recompute.SELECTIVE
    prec = uniform_precision(precision_column(sigs))
    rc_linear = replace(rc, peak_flop_per_ms=gemm_peak_tflops(c["gpu"], prec, gpus) * 1e9)  # fp8: te.Linear only
    time_ms = _runtime_time_ms(x, rc, L, n_rec, selective, first, last, rc_linear)

    none, sel, full = activation_bytes(x, rc.flash)
    keep = np.where(selective, sel, none)
    kept_logits, logits_grad = logits_bytes(x)
    act = (L - n_rec) * keep + n_rec * full + first * x.dropout * x.tokens * x.h / x.rep + last * kept_logits
    rematerialised = np.where(n_rec > 0, none, np.where(selective, none - sel, 0.0))
    work = np.maximum((L > 0) * (backward_workspace_bytes(x, rc.flash) + rematerialised), last * logits_grad)
    params = stage_params_per_rank(L, x.t, first, last, c["hidden"], c["ffn_hidden"], c["heads"], c["query_groups"],
                                   c["vocab"], c["mlp"], tied=c["tied_embeddings"])
    static = params * static_bytes_per_param(do, dp, prec)
    allocated = static + c["inflight"].astype(np.float64) * act + work
    peak = allocated * (1.0 + rc.frag) / MIB + rc.fixed_mib + communicator_mib(first, last, x, rc, c["tied_embeddings"])
    return {"time_ms": time_ms, "peak_mem_mib": peak, "static_mem_mib": static / MIB}
