"""Memory estimates the baselines use for their fits-or-not decision (sigs → peak, static in MiB)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from memx.planner.cost import (
    BYTES_PER_PARAM_STATIC,
    MIB,
    AnalyticStageModel,
    layer_activation_bytes_tp_only,
    recomputed_layers,
    stage_params_per_rank,
)
from memx.domain.specs import GpuType


def analytic_memory(gpus: Mapping[str, GpuType], factor: float = 1.0):
    """The closed-form stage model's memory (memx.planner.cost: 18 B/param static + in-flight activations,
    Korthikanti 2022 generalised to GQA/SwiGLU) times `factor`. It knows nothing of the runtime context,
    allocator fragmentation or workspaces a real GPU adds."""
    model = AnalyticStageModel(gpus=gpus, runtime="none")  # the baselines' own (flat) memory model

    def memory(sigs: pd.DataFrame) -> pd.DataFrame:
        p = model.predict(sigs)
        return pd.DataFrame({"peak_mem_mib": factor * p["peak_mem_mib"].to_numpy(float),
                             "static_mem_mib": p["static_mem_mib"].to_numpy(float)}, index=sigs.index)

    return memory


def korthikanti_memory(gpus: Mapping[str, GpuType]):
    """The textbook formula: 18 B/param static + in-flight micro batches × per-layer activations of the
    GPT layer under tensor parallelism without sequence parallelism, s·b·h·(10 + 24/t + 5as/(ht))
    (Korthikanti 2022 Eq. 2); a fully recomputed layer keeps its input, 2sbh. No SwiGLU/GQA terms, no
    embedding/logit buffers, no runtime overheads."""
    del gpus

    def memory(sigs: pd.DataFrame) -> pd.DataFrame:
        c = {k: sigs[k].to_numpy() for k in sigs.columns}
        L = c["layers"].astype(float)
        params = stage_params_per_rank(L, c["tp"].astype(float), c["first"].astype(bool), c["last"].astype(bool),
                                       c["hidden"], c["ffn_hidden"], c["heads"], c["query_groups"], c["vocab"], c["mlp"])
        static = params * BYTES_PER_PARAM_STATIC
        n_rec = recomputed_layers(c["recompute"], c["recompute_layers"], L)
        act = layer_activation_bytes_tp_only(c["micro_batch"], c["seq_len"], c["hidden"], c["heads"], c["tp"])
        kept = 2.0 * np.asarray(c["micro_batch"], float) * np.asarray(c["seq_len"], float) * np.asarray(c["hidden"], float)
        peak = static + c["inflight"].astype(float) * ((L - n_rec) * act + n_rec * kept)
        return pd.DataFrame({"peak_mem_mib": peak / MIB, "static_mem_mib": static / MIB}, index=sigs.index)

    return memory
