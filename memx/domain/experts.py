"""The mixture-of-experts fields of a model (issue #27; memx.planner.moe, docs/planner.md §Mixture of experts).

`ExpertFields` is the base of memx.domain.specs.ModelArch: every layer's MLP is then a MoE block (Megatron-LM's
default `--moe-layer-freq 1`): a router, `num_experts` routed experts of which each token takes
`moe_router_topk`, and optionally shared experts every token takes. A model without `num_experts` is dense and
none of this applies. Nothing here imports memx.domain.specs (it is imported by it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt, Le

MAX_EXPERTS = 4_096  # experts per MoE layer; DeepSeek-V3: 256 routed, Qwen1.5-MoE: 60, Mixtral: 8
MAX_IMBALANCE = 64.0  # moe_load_imbalance: the busiest expert-parallel rank's tokens ÷ the average
MAX_EXPERT_WIDTH = 262_144  # an expert's MLP inner size: the bound of ffn_hidden (memx.domain.specs.MAX_WIDTH)
ExpertWidth = Annotated[int, Gt(0), Le(MAX_EXPERT_WIDTH)]


@dataclass(frozen=True, kw_only=True)
class ExpertFields:
    """The MoE fields of ModelArch (all optional: a dense model by default)."""

    num_experts: Annotated[int, Gt(1), Le(MAX_EXPERTS)] | None = None
    """Routed experts per MoE layer (Megatron-LM `--num-experts`, ≤ 4,096); None: a dense model."""
    moe_router_topk: Annotated[int, Gt(0), Le(MAX_EXPERTS)] = 2
    """Experts each token is routed to (Megatron-LM `--moe-router-topk`, default 2); at most `num_experts`."""
    moe_ffn_hidden: ExpertWidth | None = None
    """MLP inner size of one routed expert (Megatron-LM `--moe-ffn-hidden-size`); None: `ffn_hidden`, as
    Megatron defaults it."""
    moe_shared_expert_ffn_hidden: ExpertWidth | None = None
    """Total MLP inner size of the shared experts every token also takes (Megatron-LM
    `--moe-shared-expert-intermediate-size` = shared experts × each one's size); None: no shared expert."""
    moe_load_imbalance: Annotated[float, Ge(1), Le(MAX_IMBALANCE)] = 1.25
    """λ ≥ 1: tokens the busiest expert-parallel rank computes ÷ the average rank's (every rank waits for it in
    the combine all-to-all). Default 1.25, the capacity factor Switch Transformers train with (Fedus et al.
    2022, JMLR 23, §2.1 and Table 1: capacity factor 1.0–1.25; with `--moe-expert-capacity-factor` 1.25
    Megatron caps each expert at that); 1: perfectly balanced routing."""

    moe_first_dense_layers: Annotated[int, Ge(0), Le(1_024)] = 0
    """The first k layers have a dense MLP of `ffn_hidden` instead of experts (DeepSeek-V2/V3 config.json
    `first_k_dense_replace`; Megatron-LM `--moe-layer-freq "([0]*k+[1]*(L-k))"`); 0: every layer MoE (Mixtral,
    Qwen1.5-MoE). Fewer than the model's layers."""

    def _moe_problems(self) -> list[tuple[str, str, object]]:
        """A router top-k above the experts (Megatron's router takes the top k of num_experts logits), and MoE
        sizes given for a dense model (memx.domain.validation.Problem triples)."""
        if self.num_experts is None:
            given = [f for f in ("moe_ffn_hidden", "moe_shared_expert_ffn_hidden") if getattr(self, f) is not None]
            given += ["moe_first_dense_layers"] if self.moe_first_dense_layers else []
            return [(f, "needs 'num_experts' (a dense model has no experts)", getattr(self, f)) for f in given]
        if self.moe_first_dense_layers >= self.layers:  # type: ignore[attr-defined]
            return [("moe_first_dense_layers", f"must be below 'layers' ({self.layers})",  # type: ignore[attr-defined]
                     self.moe_first_dense_layers)]
        if self.moe_router_topk > self.num_experts:
            return [("moe_router_topk", f"must not exceed 'num_experts' ({self.num_experts})", self.moe_router_topk)]
        return []

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a mixture of experts (num_experts given)."""
        return self.num_experts is not None

    @property
    def expert_ffn_hidden(self) -> int:
        """One routed expert's MLP inner size (`moe_ffn_hidden`, else the model's `ffn_hidden`)."""
        return self.ffn_hidden if self.moe_ffn_hidden is None else self.moe_ffn_hidden  # type: ignore[attr-defined]

    def expert_structure(self) -> dict[str, object]:
        """The MoE fields in a model's structure (fingerprints, records); {} for a dense model."""
        if self.num_experts is None:
            return {}
        return {"num_experts": self.num_experts, "moe_router_topk": self.moe_router_topk,
                "moe_ffn_hidden": self.expert_ffn_hidden,
                "moe_shared_expert_ffn_hidden": self.moe_shared_expert_ffn_hidden,
                "moe_load_imbalance": self.moe_load_imbalance,
                **({"moe_first_dense_layers": self.moe_first_dense_layers} if self.moe_first_dense_layers else {})}
