"""Memory estimates the baselines use for their fits-or-not decision (sigs → peak, static in MiB).

Both follow the job options a signature carries (issue #14): with the distributed optimizer the static part is
6 + 12/dp bytes per parameter instead of 18 (memx.planner.cost.static_bytes_per_param: Megatron-LM's
distributed-optimizer documentation; ZeRO §5.1 P_os), and without sequence parallelism (or at tp = 1) the
norm / dropout activations and a recomputed layer's input are replicated on every TP rank rather than split
(Korthikanti et al. 2022 Eq. 2 vs Eq. 4, §4.2.2). Whether a baseline may turn the options on at all is its
Planner's `distributed_optimizer` / `sequence_parallel` (memx.planner.baselines.base).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from memx.planner.cost import (
    MIB,
    AnalyticStageModel,
    layer_activation_bytes_tp_only,
    option_columns,
    recomputed_layers,
    stage_params_per_rank,
    static_bytes_per_param,
)
from memx.domain.records import option_array
from memx.domain.specs import GpuType


def analytic_memory(gpus: Mapping[str, GpuType], factor: float = 1.0):
    """The closed-form stage model's memory (memx.planner.cost: 18 B/param static + in-flight activations,
    Korthikanti 2022 generalised to GQA/SwiGLU) times `factor`. It knows nothing of the runtime context,
    allocator fragmentation or workspaces a real GPU adds."""
    model = AnalyticStageModel(gpus=gpus, runtime="none")  # the baselines' own (flat) memory model

    def memory(sigs: pd.DataFrame) -> pd.DataFrame:
        p = model.predict(sigs)  # static at the distributed optimizer's bytes; activations as with SP (Eq. 4)
        peak = p["peak_mem_mib"].to_numpy(float) + unsplit_activation_bytes(sigs) / MIB
        return pd.DataFrame({"peak_mem_mib": factor * peak,
                             "static_mem_mib": p["static_mem_mib"].to_numpy(float)}, index=sigs.index)

    return memory


def replicated_share(sigs: pd.DataFrame) -> np.ndarray:
    """Divisor of the activations Korthikanti et al. 2022 §4.2.2 replicate over the TP group: tp with
    sequence parallelism at tp > 1, else 1."""
    _, _, sp = option_columns(sigs)
    tp = sigs["tp"].to_numpy(np.float64)
    return np.where(sp & (tp > 1), tp, 1.0)


def unsplit_activation_bytes(sigs: pd.DataFrame) -> np.ndarray:
    """Bytes the flat closed form (which assumes sequence parallelism, memx.planner.cost) misses per stage when
    the stage runs without it: per kept layer the norm inputs, QKV / MLP inputs and dropout masks, 8sbh (+ 2sbh
    with dropout, GELU models), and per fully recomputed layer its input 2sbh, each (1 − 1/t) of it, times the
    micro batches in flight (Korthikanti 2022 §4.2.2; memx.planner.runtime_terms.activation_bytes)."""
    c = {k: sigs[k].to_numpy() for k in ("tp", "layers", "micro_batch", "seq_len", "hidden", "mlp", "recompute",
                                        "recompute_layers", "inflight")}
    t, L = c["tp"].astype(float), c["layers"].astype(float)
    sbh = c["micro_batch"].astype(float) * c["seq_len"].astype(float) * c["hidden"].astype(float)
    n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
    per_layer = np.where(c["mlp"] == "gelu", 10.0, 8.0) * sbh
    missing = ((L - n_rec) * per_layer + n_rec * 2.0 * sbh) * (1.0 - 1.0 / t)
    return np.where(replicated_share(sigs) > 1, 0.0, missing * c["inflight"].astype(float))


def korthikanti_memory(gpus: Mapping[str, GpuType]):
    """The textbook formula: 18 B/param static (6 + 12/dp with the distributed optimizer) + in-flight micro
    batches × per-layer activations of the GPT layer under tensor parallelism, s·b·h·(10 + 24/t + 5as/(ht))
    without sequence parallelism (Korthikanti 2022 Eq. 2) and s·b·h·(34/t + 5as/(ht)) with it (Eq. 4); a
    fully recomputed layer keeps its input, 2sbh (2sbh/t with sequence parallelism). No SwiGLU/GQA terms, no
    embedding/logit buffers, no runtime overheads."""
    del gpus

    def memory(sigs: pd.DataFrame) -> pd.DataFrame:
        c = {k: sigs[k].to_numpy() for k in sigs.columns}
        L = c["layers"].astype(float)
        params = stage_params_per_rank(L, c["tp"].astype(float), c["first"].astype(bool), c["last"].astype(bool),
                                       c["hidden"], c["ffn_hidden"], c["heads"], c["query_groups"], c["vocab"], c["mlp"],
                                       tied=option_array(sigs, "tied_embeddings"))
        do, dp, _ = option_columns(sigs)
        static = params * static_bytes_per_param(do, dp)
        n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
        rep = replicated_share(sigs)
        sbh = np.asarray(c["micro_batch"], float) * np.asarray(c["seq_len"], float) * np.asarray(c["hidden"], float)
        act = layer_activation_bytes_tp_only(c["micro_batch"], c["seq_len"], c["hidden"], c["heads"], c["tp"])
        act = act - 10.0 * sbh * (1.0 - 1.0 / rep)  # Eq. 4: the replicated 10sbh split over the TP group
        kept = 2.0 * sbh / rep
        peak = static + c["inflight"].astype(float) * ((L - n_rec) * act + n_rec * kept)
        return pd.DataFrame({"peak_mem_mib": peak / MIB, "static_mem_mib": static / MIB}, index=sigs.index)

    return memory
