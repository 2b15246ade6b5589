"""The mixture-of-experts columns of the measurement records (issue #27; docs/architecture.md §Measurement records).

Part of the `stage_runs` schema (memx.domain.records appends MOE_COLUMNS to its columns and validates them): the MoE
signature of a stage whose model has experts, with dense defaults, the derived columns, the model a MoE row's
closed-form terms need, and the ep group its all-to-all ran over.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import numpy as np

from memx.domain import specs
from memx.domain.experts import MAX_EXPERTS
from memx.domain.nulls import is_missing
from memx.domain.plan import Plan, Stage

# Mixture of experts (issue #27; docs/architecture.md §Measurement records): the MoE signature of a stage whose
# model has experts — the model's expert fields (as in the catalog, memx.domain.experts) and the stage's expert
# parallelism and all-to-all link (what memx.planner.moe.moe_columns hands a predictor: ep, the expert dp group,
# the link's effective GB/s per rank and latency). The other model columns of such a row are its dense
# equivalent's (ffn_hidden λ·k·f_e + f_sh, memx.planner.moe.dense_equivalent): the signature the search asks a
# stage predictor for. Defaults = a dense stage, so older rows and files load unchanged.
MOE_DEFAULTS: dict[str, Any] = {
    "num_experts": 0, "moe_router_topk": 0, "moe_ffn_hidden": 0, "moe_shared_expert_ffn_hidden": 0,
    "moe_load_imbalance": 1.0, "expert_parallel": 1, "expert_dp": 1, "a2a_gbps": 0.0, "a2a_latency_ms": 0.0,
}
# Derived (written for readers and learners, never hashed): E / ep, and the busiest rank's tokens per local expert
# per micro batch λ·k·b·s·ep / E (the rank's ep group gathers b·s tokens on each of ep ranks, k copies each, λ×
# the average on the busiest, split over its E/ep experts; memx.simulator.moe).
MOE_DERIVED = ("experts_per_gpu", "tokens_per_expert")
MOE_COLUMNS = (*MOE_DEFAULTS, *MOE_DERIVED)
MOE_STAGE_COLUMNS = ("expert_parallel", "expert_dp", "a2a_gbps", "a2a_latency_ms")  # per stage; the rest: the model
MOE_INT_RANGES: dict[str, tuple[int, int]] = {  # plausible ranges (memx.domain.records.INT_RANGES)
    "num_experts": (0, MAX_EXPERTS), "moe_router_topk": (0, MAX_EXPERTS), "moe_ffn_hidden": (0, specs.MAX_WIDTH),
    "moe_shared_expert_ffn_hidden": (0, specs.MAX_WIDTH), "expert_parallel": (1, MAX_EXPERTS),
    "expert_dp": (1, specs.MAX_CLUSTER_GPUS),
}
MOE_INT_COLUMNS = ("num_experts", "moe_router_topk", "moe_ffn_hidden", "moe_shared_expert_ffn_hidden",
                   "expert_parallel", "expert_dp")
MOE_FLOAT_COLUMNS = ("moe_load_imbalance", "a2a_gbps", "a2a_latency_ms", *MOE_DERIVED)


def moe_fields(point: Mapping[str, Any]) -> dict[str, Any]:
    """The MoE columns of a row or point (MOE_COLUMNS), canonical: defaults where absent or null (a dense stage,
    older rows), the derived columns recomputed (`experts_per_gpu`, `tokens_per_expert`; `moe_derived`)."""
    out = {c: d if is_missing(point.get(c)) else point.get(c) for c, d in MOE_DEFAULTS.items()}
    out.update({c: int(out[c]) for c in MOE_INT_COLUMNS if not isinstance(out[c], str)})
    out.update({c: float(out[c]) for c in MOE_FLOAT_COLUMNS if c in out and not isinstance(out[c], str)})
    e, ep = out["num_experts"], out["expert_parallel"]
    if isinstance(e, int) and e > 0 and isinstance(ep, int) and ep > 0:
        tokens = float(point.get("micro_batch") or 0) * float(point.get("seq_len") or 0)
        out["experts_per_gpu"] = e / ep
        out["tokens_per_expert"] = out["moe_load_imbalance"] * out["moe_router_topk"] * tokens * ep / e
    else:
        out.update(experts_per_gpu=0.0, tokens_per_expert=0.0)
    return out


def moe_derived(table: Any) -> dict[str, np.ndarray]:
    """`experts_per_gpu` and `tokens_per_expert` of every row of a table (a DataFrame or a mapping of columns) from
    its MoE and signature columns (`moe_fields`' rule, vectorised); 0 on dense rows and where the table has none."""
    n = len(table["gpu"])
    col = lambda c: (np.asarray(table[c], dtype=np.float64) if c in table else np.full(n, float(MOE_DEFAULTS[c])))
    e, ep = np.nan_to_num(col("num_experts")), np.maximum(np.nan_to_num(col("expert_parallel"), nan=1.0), 1.0)
    moe = e > 0
    tokens = np.asarray(table["micro_batch"], dtype=np.float64) * np.asarray(table["seq_len"], dtype=np.float64)
    per_gpu = np.where(moe, e / ep, 0.0)
    lam, k = np.nan_to_num(col("moe_load_imbalance"), nan=1.0), np.nan_to_num(col("moe_router_topk"))
    return {"experts_per_gpu": per_gpu,
            "tokens_per_expert": np.where(moe, lam * k * tokens * ep / np.where(moe, e, 1.0), 0.0)}


def is_moe_row(point: Mapping[str, Any]) -> bool:
    """A row of a mixture-of-experts stage: `num_experts` given and > 0."""
    e = point.get("num_experts")
    return not is_missing(e) and float(e) > 0


def expert_model(point: Mapping[str, Any]):
    """The MoE model a MoE row's closed-form terms need (memx.planner.moe takes a ModelArch): its attention and
    vocabulary columns and its expert fields; `ffn_hidden` is the dense equivalent's (no dense first layers are
    recorded: `moe_first_dense_layers` 0). None for a dense row."""
    if not is_moe_row(point):
        return None
    f = moe_fields(point)
    return _expert_model(tuple(int(point[c]) for c in ("hidden", "ffn_hidden", "heads", "query_groups", "vocab",
                                                        "seq_len")), str(point["mlp"]), f["num_experts"],
                         f["moe_router_topk"], f["moe_ffn_hidden"], f["moe_shared_expert_ffn_hidden"] or None,
                         f["moe_load_imbalance"])


@functools.lru_cache(maxsize=256)
def _expert_model(dims: tuple[int, ...], mlp: str, experts: int, topk: int, f_e: int, shared: int | None,
                  imbalance: float):
    h, ffn, heads, groups, vocab, seq = dims
    return specs.ModelArch(name="records-moe", layers=1, hidden=h, ffn_hidden=ffn, heads=heads, query_groups=groups,
                           vocab=vocab, seq_len=seq, mlp=mlp, num_experts=experts, moe_router_topk=topk,
                           moe_ffn_hidden=f_e, moe_shared_expert_ffn_hidden=shared, moe_load_imbalance=imbalance)


def expert_group_plan(point: Mapping[str, Any]) -> Plan:
    """The ep group a MoE row's stage ran in: one stage of its layers on ep TP groups of its GPU type, the
    ep replicas an expert-parallel group spans (placed first-fit by memx.domain.plan.place_plan, as a plan's
    replicas are). The profiler reads its all-to-all link off it (memx.planner.moe.a2a_links) and the virtual
    cluster runs the all-to-all over it (memx.simulator.moe), so both see one placement."""
    ep, mb = int(moe_fields(point)["expert_parallel"]), int(point["micro_batch"])
    stage = Stage(gpu=str(point["gpu"]), tp=int(point["tp"]), layers=max(int(point["layers"]), 1))
    return Plan(model="records-moe", cluster="records", global_batch=ep * mb, micro_batch=mb,
                seq_len=int(point["seq_len"]), dp=ep, stages=(stage,), expert_parallel=ep,
                sequence_parallel=bool(point.get("sequence_parallel")))


def model_moe_fields(model: Any) -> dict[str, Any]:
    """The model columns of MOE_DEFAULTS for a catalog model (memx.domain.specs.ModelArch); {} when dense."""
    if not getattr(model, "is_moe", False):
        return {}
    return {"num_experts": model.num_experts, "moe_router_topk": model.moe_router_topk,
            "moe_ffn_hidden": model.expert_ffn_hidden,
            "moe_shared_expert_ffn_hidden": model.moe_shared_expert_ffn_hidden or 0,
            "moe_load_imbalance": float(model.moe_load_imbalance)}
