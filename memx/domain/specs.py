"""Core specifications: GPU types, clusters, model architectures, Φ weights and the search space.

One type per spec (docs/architecture.md §Catalogs): a frozen keyword-only dataclass with units in
field names and a docstring per field. Constraints live in the annotations (`annotated_types`) and
are checked once, at construction (`__post_init__` → `memx.domain.validation.check_spec`), together
with the cross-field checks; a bad spec raises one `SpecError` naming every offending field. Catalog
YAML is validated against these same types at the edge (`memx.domain.catalog`); nothing here reads
files.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval, MinLen

from memx.domain.plan import SEARCH_BLOCK, Recompute
from memx.domain.validation import Problem, check_spec

PositiveInt = Annotated[int, Gt(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]

MlpKind = Literal["swiglu", "gelu"]
MLP_KINDS: tuple[str, ...] = typing.get_args(MlpKind)
# The search may also ask for Megatron's block method (full recompute of a stage's first N layers),
# which a plan writes as recompute `full` with `recompute_layers` (docs/architecture.md §Recompute).
RECOMPUTE_LEVELS: tuple[str, ...] = (*(r.value for r in Recompute), SEARCH_BLOCK)
RecomputeLevel = Literal[RECOMPUTE_LEVELS]  # type: ignore[valid-type]  # the search levels, built from Recompute

# Read by pydantic when a catalog YAML is validated against a spec type: unknown keys are errors.
_FORBID_EXTRA = {"extra": "forbid"}


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model, with public spec-sheet numbers only (docs/architecture.md §Catalogs)."""

    __pydantic_config__ = _FORBID_EXTRA

    name: str
    """Catalog name, e.g. `a100-80g`."""
    vendor: str
    """Maker, e.g. `nvidia`."""
    memory_gib: PositiveFloat
    """Device memory, GiB."""
    peak_tflops_bf16: PositiveFloat
    """Dense bf16 peak, TFLOP/s (no sparsity)."""
    memory_bandwidth_gbps: PositiveFloat
    """Device-memory bandwidth, GB/s."""
    intra_node_bandwidth_gbps: PositiveFloat
    """GPU↔GPU bandwidth inside a node, GB/s, one direction."""

    def __post_init__(self) -> None:
        check_spec(self)

    @property
    def memory_mib(self) -> float:
        return self.memory_gib * 1024.0


@dataclass(frozen=True, kw_only=True)
class Node:
    """A node holds `count` GPUs of one type."""

    __pydantic_config__ = _FORBID_EXTRA

    gpu: GpuType
    """The GPU type of every GPU in the node (catalog YAML names it; the catalog resolves the name)."""
    count: PositiveInt
    """GPUs in the node."""

    def __post_init__(self) -> None:
        check_spec(self)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of (possibly different) GPU types joined by one inter-node network."""

    __pydantic_config__ = _FORBID_EXTRA

    name: str
    """Catalog name, e.g. `three-vendor-20`."""
    inter_node_bandwidth_gbps: PositiveFloat
    """Bandwidth between nodes, GB/s."""
    nodes: Annotated[tuple[Node, ...], MinLen(1)]
    """The nodes, in catalog order (placement packs them first-fit in this order)."""
    inter_node_latency_ms: NonNegativeFloat = 0.01
    """Latency of one inter-node message, ms."""

    def __post_init__(self) -> None:
        check_spec(self)

    @property
    def gpu_types(self) -> tuple[GpuType, ...]:
        """GPU types in order of first appearance."""
        seen: dict[str, GpuType] = {}
        for node in self.nodes:
            seen.setdefault(node.gpu.name, node.gpu)
        return tuple(seen.values())

    def gpu_count(self, gpu_name: str) -> int:
        return sum(n.count for n in self.nodes if n.gpu.name == gpu_name)

    def node_sizes(self, gpu_name: str) -> tuple[int, ...]:
        return tuple(n.count for n in self.nodes if n.gpu.name == gpu_name)

    def gpu(self, gpu_name: str) -> GpuType:
        for g in self.gpu_types:
            if g.name == gpu_name:
                return g
        raise KeyError(gpu_name)

    @property
    def total_gpus(self) -> int:
        return sum(n.count for n in self.nodes)


@dataclass(frozen=True, kw_only=True)
class ModelArch:
    """Decoder-only transformer structure (LLaMA / GPT style)."""

    __pydantic_config__ = _FORBID_EXTRA

    name: str
    """Catalog name, e.g. `llama2-7b`."""
    layers: PositiveInt
    """Transformer layers."""
    hidden: PositiveInt
    """Hidden size h; a multiple of `heads`."""
    ffn_hidden: PositiveInt
    """MLP inner size."""
    heads: PositiveInt
    """Attention (query) heads; a multiple of `query_groups`."""
    query_groups: PositiveInt
    """K/V heads (GQA); = heads for multi-head attention."""
    vocab: PositiveInt
    """Vocabulary size."""
    seq_len: PositiveInt
    """Sequence length, tokens."""
    mlp: MlpKind = "swiglu"
    """`swiglu` (LLaMA: RMSNorm, gated MLP) or `gelu` (GPT-2: LayerNorm, ffn = 4·hidden)."""
    tied_embeddings: bool = False
    """Output layer shares the embedding's weights."""

    def __post_init__(self) -> None:
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        problems: list[Problem] = []
        if self.hidden % self.heads:
            problems.append(("hidden", f"must be divisible by 'heads' ({self.heads})", self.hidden))
        if self.heads % self.query_groups:
            problems.append(("heads", f"must be divisible by 'query_groups' ({self.query_groups})", self.heads))
        return problems

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V) projections under GQA: query_groups · head_dim."""
        return self.query_groups * self.head_dim

    def structure(self) -> dict[str, object]:
        """The fields that define the model's structure (used in fingerprints and records)."""
        return {
            "hidden": self.hidden,
            "ffn_hidden": self.ffn_hidden,
            "heads": self.heads,
            "query_groups": self.query_groups,
            "vocab": self.vocab,
            "mlp": self.mlp,
            "layers": self.layers,
            "seq_len": self.seq_len,
        }


@dataclass(frozen=True, kw_only=True)
class Weights:
    """Exponents of Φ = T̂^wT · M̂^wM · V̂^wV (paper §3.1.2); `profile` names where they came from."""

    profile: str
    """`default`, `safety`, `throughput`, `custom` (from "wT,wM,wV") or the name `auto` chose."""
    w_time: float
    """wT: exponent of the normalised iteration time."""
    w_mem: float
    """wM: exponent of the normalised largest per-GPU peak memory."""
    w_var: float
    """wV: exponent of the normalised variance of per-GPU peak memory."""

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.w_time, self.w_mem, self.w_var)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The job and the space searched (conf/search/*.yaml).

    Built normalised: `tp_options` and `micro_batch_options` sorted without duplicates,
    `recompute_levels` without duplicates in the order given."""

    __pydantic_config__ = _FORBID_EXTRA

    name: str
    """Catalog name, e.g. `default`."""
    global_batch: PositiveInt
    """Sequences per iteration over all data-parallel replicas."""
    tp_options: Annotated[tuple[PositiveInt, ...], MinLen(1)] = (1, 2, 4, 8)
    """Tensor-parallel sizes a stage may use."""
    micro_batch_options: Annotated[tuple[PositiveInt, ...], MinLen(1)] = (1, 2, 4)
    """Micro-batch sizes, sequences."""
    recompute_levels: Annotated[tuple[RecomputeLevel, ...], MinLen(1)] = RECOMPUTE_LEVELS
    """Per-stage recompute levels searched: the `Recompute` levels and `block`."""
    max_pp: PositiveInt = 8
    """Most pipeline stages."""
    min_pp: PositiveInt = 1
    """Fewest pipeline stages; at most `max_pp`."""
    use_all_gpus: bool = True
    """Plans must use every GPU of the cluster."""
    weights: str = "auto"
    """Φ weights: a profile name (`auto`, `default`, `safety`, `throughput`) or "wT,wM,wV"."""
    dtype: Literal["bf16"] = "bf16"
    """Training precision."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer (sets the static bytes per parameter)."""
    reserve_gib: NonNegativeFloat = 1.0
    """Kept free on every GPU (allocator slack, NCCL buffers), GiB."""
    target_margin: Annotated[float, Interval(ge=0, lt=1)] = 0.10
    """Refinement raises recompute while the smallest memory margin (a fraction) is below this."""
    epsilon_mib2: PositiveFloat = 1.0e4
    """ε added to V in Φ, MiB²: a 100 MiB std-dev noise floor."""
    seq_len: PositiveInt | None = None
    """Sequence length of the job; None: the model's."""
    max_splits_per_layout: PositiveInt = 5_000_000
    """Cap on layer splits enumerated per (pp, tp, dp) layout."""
    max_time_ratio: NonNegativeFloat = 0.0
    """> 0: Φ picks only among plans within this × the fastest; 0 = Φ alone (paper)."""
    max_stage_slowdown: NonNegativeFloat = 2.0
    """Prune splits with a stage slower than this × the layout's best bottleneck; 0 = off."""
    extra: dict[str, object] = field(default_factory=dict)
    """Free-form additions carried with the space (not searched)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp_options", tuple(sorted(set(self.tp_options))))
        object.__setattr__(self, "micro_batch_options", tuple(sorted(set(self.micro_batch_options))))
        object.__setattr__(self, "recompute_levels", tuple(dict.fromkeys(self.recompute_levels)))
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        if self.min_pp > self.max_pp:
            return [("min_pp", f"must not exceed 'max_pp' ({self.max_pp})", self.min_pp)]
        return []
