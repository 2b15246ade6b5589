"""Core specifications: GPU types, clusters, model architectures and the search space.

Frozen keyword-only dataclasses with units in field names (DESIGN.md §2–3). They are built from
catalog YAML by `memx.domain.catalog`; nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECOMPUTE_LEVELS = ("none", "selective", "full", "block")
MLP_KINDS = ("swiglu", "gelu")
WEIGHT_PROFILES = ("auto", "default", "safety", "throughput")


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model, with public spec-sheet numbers only (DESIGN.md §3)."""

    name: str
    vendor: str
    memory_gib: float
    peak_tflops_bf16: float
    memory_bandwidth_gbps: float  # GB/s, device memory
    intra_node_bandwidth_gbps: float  # GB/s, one direction, GPU<->GPU inside a node

    @property
    def memory_mib(self) -> float:
        return self.memory_gib * 1024.0


@dataclass(frozen=True, kw_only=True)
class Node:
    """A node holds `count` GPUs of one type."""

    gpu: GpuType
    count: int


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    inter_node_bandwidth_gbps: float  # GB/s between nodes
    nodes: tuple[Node, ...]
    inter_node_latency_ms: float = 0.01

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

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    vocab: int
    seq_len: int
    mlp: str = "swiglu"
    tied_embeddings: bool = False

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
    w_time: float
    w_mem: float
    w_var: float

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.w_time, self.w_mem, self.w_var)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The job and the space searched (conf/search/*.yaml)."""

    name: str
    global_batch: int
    tp_options: tuple[int, ...] = (1, 2, 4, 8)
    micro_batch_options: tuple[int, ...] = (1, 2, 4)
    recompute_levels: tuple[str, ...] = ("none", "selective", "full", "block")
    max_pp: int = 8
    min_pp: int = 1
    use_all_gpus: bool = True
    weights: str = "auto"  # a profile name or "wT,wM,wV"
    dtype: str = "bf16"
    optimizer: str = "adam"
    reserve_gib: float = 1.0  # kept free on every GPU (allocator, NCCL buffers)
    target_margin: float = 0.10  # refinement raises recompute while the smallest margin is below this
    epsilon_mib2: float = 1.0e4  # ε added to V (MiB²) in Φ: a 100 MiB std-dev noise floor
    seq_len: int | None = None  # None: the model's
    max_splits_per_layout: int = 5_000_000
    max_time_ratio: float = 0.0  # > 0: Φ picks only among plans within this × the fastest; 0 = Φ alone (paper)
    max_stage_slowdown: float = 2.0  # prune splits with a stage slower than this × the layout's best bottleneck; 0 = off
    extra: dict[str, object] = field(default_factory=dict)
