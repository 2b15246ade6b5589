"""Core specifications: GPU types, clusters, model architectures, Φ weights and the search space.

One type per spec (docs/architecture.md §Catalogs): a frozen keyword-only dataclass with units in
field names and a docstring per field. Constraints live in the annotations (`annotated_types`) and
are checked once, at construction (`__post_init__` → `memx.domain.validation.check_spec`), together
with the cross-field checks; a bad spec raises one `SpecError` naming every offending field. Catalog
YAML is validated against these same types at the edge (`memx.domain.catalog`); nothing here reads
files.

Every size has a documented upper bound (the `MAX_*` constants below), far above any real system,
so that a typo or a hostile file (a node of 1e8 GPUs, a model of 1e8 layers, `seq_len: 1e308`) is
refused at the edge before any work, and no number is NaN or ±inf.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Interval, Le, MaxLen, MinLen

from memx.domain.experts import MAX_EXPERTS, ExpertFields
from memx.domain.precision import PRECISIONS, SEARCH_PRECISIONS, Precision
from memx.domain.recompute import SEARCH_BLOCK, Recompute
from memx.domain.validation import Matches, Problem, check_spec, value_problems

# --- Upper bounds (docs/architecture.md §Catalogs). Each is far above the largest real value
# (quoted), so only typos and hostile input hit them; they keep every later loop and array bounded.
MAX_NAME_CHARS = 128  # catalog names (clusters, models, search spaces)
MAX_GPU_NAME_CHARS = 64  # GPU names; they also name files (conf/simulator/NAME.yaml) and records rows
GPU_NAME_PATTERN = r"[a-z0-9][a-z0-9._-]*"  # lower-case letters, digits, '.', '_', '-'; no path separators
MAX_GPUS_PER_NODE = 1_024  # one node (one scale-up domain); largest sold: GB200 NVL576, 576 GPUs
MAX_CLUSTER_GPUS = 65_536  # a whole cluster; largest published training job: 16,384 H100 (Llama 3, 2024)
MAX_GPU_MEMORY_GIB = 16_384.0  # 16 TiB per GPU; largest today 288 GiB (MI355X, B300)
MAX_GPU_MEMORY_MIB = MAX_GPU_MEMORY_GIB * 1024.0  # the same bound in MiB (measured peaks)
MAX_TFLOPS = 100_000.0  # dense bf16 per GPU (100 PFLOP/s); B200: 2,250
MAX_BANDWIDTH_GBPS = 1_000_000.0  # any bandwidth, GB/s (1 PB/s); B200 HBM3e: 8,000; NVLink 5: 900 per direction
MAX_LATENCY_MS = 1_000.0  # one message or kernel overhead, ms; InfiniBand: ~0.005
MAX_LAYERS = 1_024  # transformer layers; Llama 3 405B: 126, PaLM 540B: 118
MAX_WIDTH = 262_144  # hidden and ffn_hidden; PaLM 540B: 18,432 and 73,728
MAX_HEADS = 4_096  # attention heads and query groups; Llama 3 405B: 128
MAX_VOCAB = 1_048_576  # vocabulary entries; Gemma: 256,000
MAX_SEQ_LEN = 1_048_576  # tokens per sequence in training; long-context stages reach 1M (2^20)
MAX_GLOBAL_BATCH = 1_048_576  # sequences per iteration; Llama 3 405B: 2,048 (16M tokens / 8,192)
MAX_MICRO_BATCH = 65_536  # sequences per micro batch
MAX_TP = MAX_GPUS_PER_NODE  # tensor parallelism stays inside a node
MAX_PP = MAX_LAYERS  # pipeline stages (each holds at least one layer)
MAX_OPTIONS = 64  # entries of tp_options / micro_batch_options
MAX_VIRTUAL_STAGES = 64  # model chunks per pipeline rank (virtual_stages_options)
MAX_CONTEXT_PARALLEL = 64  # context-parallel ranks per stage and TP rank (context_parallel_options)
MAX_REPLICA_GROUPS = 8  # replica groups of a schema-2 plan the search may form
MAX_SPLITS = 1_000_000_000  # max_splits_per_layout
MAX_RATIO = 1_000.0  # max_time_ratio, max_stage_slowdown
MAX_EPSILON_MIB2 = 1.0e12  # ε of Φ, MiB² (a 1 TiB std-dev)

GpuName = Annotated[str, MaxLen(MAX_GPU_NAME_CHARS),
                    Matches(GPU_NAME_PATTERN, f"must match {GPU_NAME_PATTERN} (lower case, no '/')")]
SpecName = Annotated[str, MinLen(1), MaxLen(MAX_NAME_CHARS)]


def gpu_name_problem(value: object) -> str | None:
    """Why `value` is not a GPU name (`GPU_NAME_PATTERN`, ≤ 64 characters); None when it is one."""
    if not isinstance(value, str):
        return "must be a GPU name (text)"
    return "; ".join(value_problems(GpuName, value)) or None

Bandwidth = Annotated[float, Gt(0), Le(MAX_BANDWIDTH_GBPS)]
Latency = Annotated[float, Gt(0), Le(MAX_LATENCY_MS)]
Width = Annotated[int, Gt(0), Le(MAX_WIDTH)]
Heads = Annotated[int, Gt(0), Le(MAX_HEADS)]
SeqLen = Annotated[int, Gt(0), Le(MAX_SEQ_LEN)]
Stages = Annotated[int, Gt(0), Le(MAX_PP)]
Ratio = Annotated[float, Ge(0), Le(MAX_RATIO)]
Exponent = Annotated[float, Interval(ge=0, le=1)]

MlpKind = Literal["swiglu", "gelu"]
Launcher = Literal["any", "megatron", "flagscale"]
# How plain 1F1B is assembled (SearchSpace.pipeline_assembly; memx.planner.schedule.steady_period_ms)
PIPELINE_ASSEMBLIES = ("paper", "cycle-mean", "cycle-mean-drain")  # the last: + memx.planner.drain
PipelineAssembly = Literal[PIPELINE_ASSEMBLIES]  # type: ignore[valid-type]
DEFAULT_PIPELINE_ASSEMBLY = "cycle-mean-drain"  # by docs/results.md §The 1F1B assembly (session 11: the drain)
LAUNCHERS: tuple[str, ...] = typing.get_args(Launcher)
MLP_KINDS: tuple[str, ...] = typing.get_args(MlpKind)
# The search may also ask for Megatron's block method (full recompute of a stage's first N layers),
# which a plan writes as recompute `full` with `recompute_layers` (docs/architecture.md §Recompute).
RECOMPUTE_LEVELS: tuple[str, ...] = (*(r.value for r in Recompute), SEARCH_BLOCK)
RecomputeLevel = Literal[RECOMPUTE_LEVELS]  # type: ignore[valid-type]  # the search levels, built from Recompute

# Read by pydantic when a catalog YAML is validated against a spec type: unknown keys are errors,
# and `.inf` / `.nan` are refused (`check_spec` refuses them in code-built specs).
_FORBID_EXTRA = {"extra": "forbid", "allow_inf_nan": False}


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model, with public spec-sheet numbers only (docs/architecture.md §Catalogs)."""

    __pydantic_config__ = _FORBID_EXTRA

    name: GpuName
    """Catalog name, e.g. `a100-80g`: `GPU_NAME_PATTERN`, ≤ 64 characters."""
    vendor: SpecName
    """Maker, e.g. `nvidia`."""
    memory_gib: Annotated[float, Gt(0), Le(MAX_GPU_MEMORY_GIB)]
    """Device memory, GiB (≤ 16,384)."""
    peak_tflops_bf16: Annotated[float, Gt(0), Le(MAX_TFLOPS)]
    """Dense 16-bit tensor peak, TFLOP/s (no sparsity; ≤ 100,000): bf16, or the fp16 peak on a part without
    bf16 units (V100, T4: `precisions` lacks bf16). The reference peak of the learned features and Φ's scale."""
    memory_bandwidth_gbps: Bandwidth
    """Device-memory bandwidth, GB/s (≤ 1,000,000)."""
    intra_node_bandwidth_gbps: Bandwidth
    """GPU↔GPU bandwidth inside a node, GB/s, one direction (≤ 1,000,000)."""
    precisions: Annotated[tuple[Precision, ...], MinLen(1), MaxLen(len(PRECISIONS))] = ("bf16", "fp16")
    """Training precisions the part runs (memx.domain.precision): bf16, fp16, fp8 (vendor spec sheet)."""
    peak_tflops_fp16: Annotated[float, Gt(0), Le(MAX_TFLOPS)] | None = None
    """Dense fp16 tensor peak, TFLOP/s; None: the same as `peak_tflops_bf16` (every bf16 part runs fp16 at
    the bf16 rate)."""
    peak_tflops_fp8: Annotated[float, Gt(0), Le(MAX_TFLOPS)] | None = None
    """Dense fp8 tensor peak, TFLOP/s; required when `precisions` lists fp8, else None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "precisions", tuple(dict.fromkeys(self.precisions)))
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        has_fp8 = "fp8" in self.precisions
        if has_fp8 != (self.peak_tflops_fp8 is not None):
            return [("peak_tflops_fp8", "must be given exactly when 'precisions' lists fp8", self.peak_tflops_fp8)]
        return []

    @property
    def memory_mib(self) -> float:
        return self.memory_gib * 1024.0

    def peak_tflops(self, precision: str, strict: bool = True) -> float:
        """Dense tensor peak in `precision` (KeyError for one the part cannot run). `strict=False`: a 16-bit
        precision the part lacks is its own 16-bit mode (`peak_tflops_bf16`) — how a stage signature without a
        precision (bf16, what records meant before issue #23) reads on V100 / T4, which measured it in fp16."""
        if not strict and precision in ("bf16", "fp16") and precision not in self.precisions:
            return self.peak_tflops_bf16
        if precision not in self.precisions:
            raise KeyError(f"GPU {self.name} has no {precision} (it has {', '.join(self.precisions)})")
        if precision == "fp8":
            return float(self.peak_tflops_fp8)  # type: ignore[arg-type]
        if precision == "fp16" and self.peak_tflops_fp16 is not None:
            return self.peak_tflops_fp16
        return self.peak_tflops_bf16


@dataclass(frozen=True, kw_only=True)
class Node:
    """A node holds `count` GPUs of one type."""

    __pydantic_config__ = _FORBID_EXTRA

    gpu: GpuType
    """The GPU type of every GPU in the node (catalog YAML names it; the catalog resolves the name)."""
    count: Annotated[int, Gt(0), Le(MAX_GPUS_PER_NODE)]
    """GPUs in the node (≤ 1,024)."""
    nic_bandwidth_gbps: Bandwidth | None = None
    """Bandwidth of one of the node's network interfaces (NICs), GB/s, one direction (≤ 1,000,000); None: the
    cluster's `inter_node_bandwidth_gbps`. docs/planner.md §Network."""
    nic_latency_ms: Latency | None = None
    """Latency of one message through the node's NIC, ms (> 0, ≤ 1,000); None: the cluster's
    `inter_node_latency_ms`."""
    gpus_per_nic: Annotated[int, Gt(0), Le(MAX_GPUS_PER_NODE)] | None = None
    """GPUs sharing one NIC (a divisor of `count`: the node has count / gpus_per_nic NICs); None: one NIC for
    the whole node (every GPU of the node shares it)."""

    def __post_init__(self) -> None:
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        if self.gpus_per_nic is not None and self.count % self.gpus_per_nic:
            allowed = ", ".join(str(d) for d in range(1, self.count + 1) if self.count % d == 0)
            return [("gpus_per_nic", f"must divide 'count' ({self.count}): one of {allowed}", self.gpus_per_nic)]
        return []

    @property
    def nics(self) -> int:
        """Network interfaces of the node (1 unless `gpus_per_nic` says otherwise)."""
        return 1 if self.gpus_per_nic is None else self.count // self.gpus_per_nic


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of (possibly different) GPU types joined by one inter-node network."""

    __pydantic_config__ = _FORBID_EXTRA

    name: SpecName
    """Catalog name, e.g. `three-vendor-20`."""
    inter_node_bandwidth_gbps: Bandwidth
    """Bandwidth between nodes, GB/s (≤ 1,000,000)."""
    nodes: Annotated[tuple[Node, ...], MinLen(1), MaxLen(MAX_CLUSTER_GPUS)]
    """The nodes, in catalog order (placement packs them first-fit in this order); ≤ 65,536 GPUs in all."""
    inter_node_latency_ms: Annotated[float, Ge(0), Le(MAX_LATENCY_MS)] = 0.01
    """Latency of one inter-node message, ms (≤ 1,000); the default of nodes whose `nic_latency_ms` is not given."""
    cross_vendor_bandwidth_gbps: Bandwidth | None = None
    """Bandwidth of one path between GPUs of different vendors on different nodes, GB/s (NCCL ↔ RCCL/HCCL have
    no GPUDirect path: host-staged over TCP or a cross-vendor library); None: as between nodes of one vendor
    (the two NICs). docs/planner.md §Network."""
    cross_vendor_latency_ms: Latency | None = None
    """Latency of one cross-vendor message, ms (> 0, ≤ 1,000); None: as between nodes of one vendor."""
    nic_efficiency: Annotated[float, Gt(0), Le(1)] | None = None
    """Achieved / line rate of the NICs (nccl-tests busbw across nodes ÷ NIC bandwidth; 0 < x ≤ 1) in the closed
    form's inter-node hops; None: line rate, the paper's B. docs/planner.md §Network (the simulator ignores it)."""

    def __post_init__(self) -> None:
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        if self.total_gpus > MAX_CLUSTER_GPUS:
            return [("nodes", f"hold at most {MAX_CLUSTER_GPUS} GPUs in all", f"{self.total_gpus} GPUs")]
        return []

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
        return {g.name: g for g in self.gpu_types}[gpu_name]  # KeyError for a name not in the cluster

    @property
    def total_gpus(self) -> int:
        return sum(n.count for n in self.nodes)

    def nic_gbps(self, node: int) -> float:
        """Bandwidth of one NIC of node `node` (its own, else the cluster's `inter_node_bandwidth_gbps`), GB/s."""
        own = self.nodes[node].nic_bandwidth_gbps
        return self.inter_node_bandwidth_gbps if own is None else own

    def nic_latency(self, node: int) -> float:
        """Latency of a message through node `node`'s NIC (its own, else `inter_node_latency_ms`), ms."""
        own = self.nodes[node].nic_latency_ms
        return self.inter_node_latency_ms if own is None else own

    def cross_vendor(self, node_a: int, node_b: int) -> bool:
        """Whether traffic between the two nodes crosses vendors (different GPU makers)."""
        return self.nodes[node_a].gpu.vendor != self.nodes[node_b].gpu.vendor


@dataclass(frozen=True, kw_only=True)
class ModelArch(ExpertFields):
    """Decoder-only transformer structure (LLaMA / GPT style); a mixture of experts with `num_experts`
    (ExpertFields, memx.domain.experts)."""

    __pydantic_config__ = _FORBID_EXTRA

    name: SpecName
    """Catalog name, e.g. `llama2-7b`."""
    layers: Annotated[int, Gt(0), Le(MAX_LAYERS)]
    """Transformer layers (≤ 1,024)."""
    hidden: Width
    """Hidden size h; a multiple of `heads` (≤ 262,144)."""
    ffn_hidden: Width
    """MLP inner size (≤ 262,144)."""
    heads: Heads
    """Attention (query) heads; a multiple of `query_groups` (≤ 4,096)."""
    query_groups: Heads
    """K/V heads (GQA); = heads for multi-head attention."""
    vocab: Annotated[int, Gt(0), Le(MAX_VOCAB)]
    """Vocabulary size (≤ 1,048,576)."""
    seq_len: SeqLen
    """Sequence length, tokens (≤ 1,048,576)."""
    mlp: MlpKind = "swiglu"
    """`swiglu` (LLaMA: RMSNorm, gated MLP) or `gelu` (GPT-2: LayerNorm, ffn = 4·hidden)."""
    tied_embeddings: bool = False
    """Output layer shares the embedding's weights."""
    rotary_base: Annotated[int, Gt(0), Le(1_000_000_000)] = 10_000
    """RoPE base θ (`swiglu` models; Megatron-LM `--rotary-base`, default 10,000 as in RoFormer and LLaMA 1/2;
    Llama 3: 500,000, Meta's config.json `rope_theta`). Changes the trained network, not its cost."""
    def __post_init__(self) -> None:
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        problems: list[Problem] = []
        if self.hidden % self.heads:
            problems.append(("hidden", f"must be divisible by 'heads' ({self.heads})", self.hidden))
        if self.heads % self.query_groups:
            problems.append(("heads", f"must be divisible by 'query_groups' ({self.query_groups})", self.heads))
        return problems + self._moe_problems()

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
            **self.expert_structure(),  # {} for a dense model: its fingerprint unchanged
        }


@dataclass(frozen=True, kw_only=True)
class Weights:
    """Exponents of Φ = T̂^wT · M̂^wM · V̂^wV (paper §3.1.2); `profile` names where they came from."""

    profile: str
    """`default`, `safety`, `throughput`, `custom` (from "wT,wM,wV") or the name `auto` chose."""
    w_time: Exponent
    """wT: exponent of the normalised iteration time, in [0, 1]."""
    w_mem: Exponent
    """wM: exponent of the normalised largest per-GPU peak memory, in [0, 1]."""
    w_var: Exponent
    """wV: exponent of the normalised variance of per-GPU peak memory, in [0, 1]."""

    def __post_init__(self) -> None:
        check_spec(self)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.w_time, self.w_mem, self.w_var)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The job and the space searched (conf/search/*.yaml).

    Built normalised: `tp_options` and `micro_batch_options` sorted without duplicates,
    `recompute_levels` without duplicates in the order given."""

    __pydantic_config__ = _FORBID_EXTRA

    name: SpecName
    """Catalog name, e.g. `default`."""
    global_batch: Annotated[int, Gt(0), Le(MAX_GLOBAL_BATCH)]
    """Sequences per iteration over all data-parallel replicas (≤ 1,048,576)."""
    tp_options: Annotated[tuple[Annotated[int, Gt(0), Le(MAX_TP)], ...], MinLen(1), MaxLen(MAX_OPTIONS)] = (1, 2, 4, 8)
    """Tensor-parallel sizes a stage may use (each ≤ 1,024; ≤ 64 of them)."""
    micro_batch_options: Annotated[tuple[Annotated[int, Gt(0), Le(MAX_MICRO_BATCH)], ...], MinLen(1),
                                   MaxLen(MAX_OPTIONS)] = (1, 2, 4)
    """Micro-batch sizes, sequences (each ≤ 65,536; ≤ 64 of them)."""
    recompute_levels: Annotated[tuple[RecomputeLevel, ...], MinLen(1)] = RECOMPUTE_LEVELS
    """Per-stage recompute levels searched: the `Recompute` levels and `block`."""
    max_pp: Stages = 8
    """Most pipeline stages (≤ 1,024)."""
    min_pp: Stages = 1
    """Fewest pipeline stages; at most `max_pp`."""
    use_all_gpus: bool = True
    """Plans must use every GPU of the cluster; false: a plan may leave GPUs idle (any subset of types, any
    count of stages per type), and records them in `idle_gpus`."""
    distributed_optimizer: Annotated[tuple[bool, ...], MinLen(1), MaxLen(2)] = (True,)
    """Distributed optimizer (ZeRO-1, Megatron-LM `--use-distributed-optimizer`) settings searched:
    [true] (Megatron's usual), [false] (the paper's space), [false, true] both."""
    sequence_parallel: Annotated[tuple[bool, ...], MinLen(1), MaxLen(2)] = (True,)
    """Sequence parallelism at tp > 1 (Megatron-LM `--sequence-parallel`) settings searched: [true]
    (Megatron's usual), [false] (the paper's space), [false, true] both."""
    virtual_stages_options: Annotated[tuple[Annotated[int, Gt(0), Le(MAX_VIRTUAL_STAGES)], ...], MinLen(1),
                                      MaxLen(MAX_OPTIONS)] = (1,)
    """Opt-in (issue #27): model chunks per pipeline rank searched (Megatron-LM
    `--num-virtual-stages-per-pipeline-rank`, the interleaved 1F1B schedule; each ≤ 64); [1] (default):
    plain 1F1B only, the paper's space. A value v > 1 is tried on layouts with pp > 1, m a multiple of pp and
    every stage's layers a multiple of v (memx.planner.space.interleavings)."""
    context_parallel_options: Annotated[tuple[Annotated[int, Gt(0), Le(MAX_CONTEXT_PARALLEL)], ...], MinLen(1),
                                        MaxLen(MAX_OPTIONS)] = (1,)
    """Opt-in (issue #27): context-parallel sizes searched (Megatron-LM `--context-parallel-size`, each ≤ 64;
    one cp for the whole plan, as Megatron has); [1] (default): none, the paper's space. A value cp > 1 is tried
    where the sequence is a multiple of 2·cp and dp·cp replicas fit (memx.planner.space.context_sizes)."""
    expert_parallel_options: Annotated[tuple[Annotated[int, Gt(0), Le(MAX_EXPERTS)], ...], MinLen(1),
                                       MaxLen(MAX_OPTIONS)] = (1,)
    """Opt-in (issue #27): expert-parallel sizes searched for a mixture-of-experts model (Megatron-LM
    `--expert-model-parallel-size`, one for every stage; each ≤ 4,096); [1] (default): every rank holds every
    expert. A value ep > 1 is tried on layouts whose dp it divides (memx.planner.space.expert_parallelisms);
    each must divide the model's num_experts (exit 2 otherwise); a dense model searches ep 1 only."""
    stage_data_parallel: bool = False
    """Opt-in (issue #27): also search plans whose GPU types run different data-parallel degrees (FlagScale's
    per-mesh dp, Metis' per-stage dp; plan stages carry `data_parallel`, memx.domain.stage_dp), scored by the
    per-stage-dp closed form outside the batched engine (memx.planner.stage_dp_search); the faster pick that
    clears the margin floor wins. false (default): today's space exactly. Not with launcher megatron (one dp)."""
    weights: str = "auto"
    """Φ weights: a profile name (`auto`, `default`, `safety`, `throughput`) or "wT,wM,wV"."""
    precision: Literal[SEARCH_PRECISIONS] = "auto"  # type: ignore[valid-type]  # memx.domain.precision
    """Training precision: auto (bf16 where every GPU of the plan has it, else fp16), bf16, fp16 or fp8
    (memx.domain.precision.resolve_precision; a GPU without it: exit 2)."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer (sets the static bytes per parameter)."""
    reserve_gib: Annotated[float, Ge(0), Le(MAX_GPU_MEMORY_GIB)] = 1.0
    """Kept free on every GPU (allocator slack, NCCL buffers), GiB."""
    target_margin: Annotated[float, Interval(ge=0, lt=1)] = 0.10
    """Refinement raises recompute while the smallest memory margin (a fraction) is below this."""
    epsilon_mib2: Annotated[float, Gt(0), Le(MAX_EPSILON_MIB2)] = 1.0e4
    """ε added to V in Φ, MiB²: a 100 MiB std-dev noise floor."""
    seq_len: SeqLen | None = None
    """Sequence length of the job; None: the model's (≤ 1,048,576)."""
    heads_options: Annotated[tuple[Heads, ...], MaxLen(MAX_OPTIONS)] = ()
    """Opt-in: attention heads the search may give the model instead of its own (each ≤ 4,096; ≤ 64 of
    them); empty: the model's. This changes the training job (the paper's deployment space searched it);
    a plan that uses another value records it and the output says so. memx.planner.variants."""
    query_groups_options: Annotated[tuple[Heads, ...], MaxLen(MAX_OPTIONS)] = ()
    """Opt-in: K/V heads (GQA query groups) the search may use (each ≤ 4,096; ≤ 64 of them); empty: the
    model's (multi-head attention models keep query_groups = heads)."""
    seq_len_options: Annotated[tuple[SeqLen, ...], MaxLen(MAX_OPTIONS)] = ()
    """Opt-in: sequence lengths the search may train with (each ≤ 1,048,576; ≤ 64 of them); empty: `seq_len`
    (or the model's). Not together with `seq_len`."""
    max_splits_per_layout: Annotated[int, Gt(0), Le(MAX_SPLITS)] = 5_000_000
    """Cap on layer splits enumerated per (pp, tp, dp) layout (≤ 1e9)."""
    max_time_ratio: Ratio = 0.0
    """> 0: Φ picks only among plans within this × the fastest; 0 = Φ alone (paper)."""
    max_stage_slowdown: Ratio = 2.0
    """Prune splits with a stage slower than this × the layout's best bottleneck; 0 = off."""
    margin_floor: Annotated[float, Interval(ge=0, lt=1)] = 0.10
    """Smallest memory margin (a fraction, upper memory bound where the predictor gives one) the pick must
    clear; default = the paper's safety threshold (§3.1.2). memx.planner.pick."""
    balance_tolerance: Annotated[float, Interval(ge=0, lt=1)] = 0.02
    """The balanced rules pick among plans that clear margin_floor within (1 + this) × the fastest of them
    (a fraction in [0, 1); issue #22, memx.planner.pick)."""
    front_tolerance: Annotated[float, Interval(ge=0, lt=1)] | None = 0.10
    """The kept and reported Pareto front covers (1 + max(this, balance_tolerance)) × the fastest plan that clears
    margin_floor, within max_time_ratio's window; null, with phi / phi-bounded, or when no plan clears the floor: that
    whole window (issue #26; docs/results.md §The front's tolerance; memx.planner.candidates.Keeper.front_window_ms)."""
    pick_rule: Literal["phi", "phi-bounded", "fastest-above-floor", "balanced-phi",
                       "balanced-margin", "balanced-front"] = "balanced-front"
    """How the pick is chosen: phi (the paper's Φ alone), phi-bounded (Φ within max_time_ratio, margin floor, never
    dominated), fastest-above-floor (the fastest plan that clears the floor), balanced-phi / balanced-margin (least
    Φ / largest margin within balance_tolerance of it), balanced-front (least Φ among those no plan dominates on
    time and margin; the default, docs/results.md §Balance where it is free). memx.planner.pick."""
    pipeline_assembly: PipelineAssembly = DEFAULT_PIPELINE_ASSEMBLY
    """How a plain-1F1B plan's iteration time is assembled (memx.planner.schedule, docs/architecture.md §1F1B
    assembly): `paper` (§3.1.2, (m − 1)·max_s t_s + …) or `cycle-mean` ((m − 1)·the maximum cycle mean over
    contiguous stage ranges, stage-boundary p2p in the loop, + …; issues #22, #27). Interleaved plans keep their
    own formula either way."""
    extra: dict[str, object] = field(default_factory=dict)
    """Free-form additions carried with the space (not searched)."""
    # Replica groups (issue #15, memx.planner.replica_search; docs/planner.md §Replica groups):
    max_replica_groups: Annotated[int, Ge(1), Le(MAX_REPLICA_GROUPS)] = 1
    """Most data-parallel replica groups a plan may have (plan schema 2). 1 (default): today's schema-1 search
    exactly (stock Megatron-LM cannot launch replicas of different layouts); ≥ 2 also searches groups of nodes."""
    # Launch target (issue #24, memx.planner.launcher; docs/megatron.md, docs/flagscale.md):
    launcher: Launcher = "any"
    """What must be able to start the plan: `any` (the full MemX space), `megatron` (stock Megatron-LM: one tp and one
    recompute setting for every stage, the GPUs of one vendor; the others idle) or `flagscale` (process meshes per
    GPU type; with tied embeddings the first and last stage share tp; selective recompute on all stages or none)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp_options", tuple(sorted(set(self.tp_options))))
        object.__setattr__(self, "micro_batch_options", tuple(sorted(set(self.micro_batch_options))))
        object.__setattr__(self, "recompute_levels", tuple(dict.fromkeys(self.recompute_levels)))
        object.__setattr__(self, "distributed_optimizer", tuple(dict.fromkeys(self.distributed_optimizer)))
        object.__setattr__(self, "sequence_parallel", tuple(dict.fromkeys(self.sequence_parallel)))
        object.__setattr__(self, "virtual_stages_options", tuple(sorted(set(self.virtual_stages_options))))
        object.__setattr__(self, "context_parallel_options", tuple(sorted(set(self.context_parallel_options))))
        object.__setattr__(self, "expert_parallel_options", tuple(sorted(set(self.expert_parallel_options))))
        for name in ("heads_options", "query_groups_options", "seq_len_options"):
            object.__setattr__(self, name, tuple(sorted(set(getattr(self, name)))))
        check_spec(self, self._cross_problems)

    def _cross_problems(self) -> list[Problem]:
        problems: list[Problem] = []
        if self.min_pp > self.max_pp:
            problems.append(("min_pp", f"must not exceed 'max_pp' ({self.max_pp})", self.min_pp))
        if self.seq_len is not None and self.seq_len_options:
            problems.append(("seq_len_options", "set either 'seq_len' or 'seq_len_options', not both",
                             list(self.seq_len_options)))
        variants = [f for f in ("heads_options", "query_groups_options", "seq_len_options") if getattr(self, f)]
        if self.max_replica_groups > 1 and variants:
            problems.append(("max_replica_groups", f"must be 1 when {', '.join(variants)} lists values (every replica "
                             "group trains the same job; search the variants with one group)", self.max_replica_groups))
        return problems + self._launcher_problems()

    def _launcher_problems(self) -> list[Problem]:
        """What `launcher` cannot run: replica groups of different pipelines (neither Megatron-LM nor FlagScale
        runs them as one job), and, for megatron, a recompute level list with no level it applies uniformly."""
        if self.launcher == "any":
            return []
        problems: list[Problem] = []
        if self.max_replica_groups > 1:
            problems.append(("max_replica_groups", f"must be 1 with launcher: {self.launcher} (replica groups with "
                             f"different pipelines and micro batches cannot run as one {self.launcher} job)",
                             self.max_replica_groups))
        if self.launcher == "megatron" and self.stage_data_parallel:
            problems.append(("stage_data_parallel", "must be false with launcher: megatron (Megatron-LM runs one "
                             "--data-parallel size for every stage)", True))
        if self.launcher == "megatron" and set(self.recompute_levels) <= {SEARCH_BLOCK}:
            problems.append(("recompute_levels", "must list none, selective or full with launcher: megatron (one "
                             "setting for every stage; block is searched per stage)", list(self.recompute_levels)))
        return problems
