"""Load catalogs (conf/gpus, clusters, models, search) by name or path into specs.

Pydantic validates the YAML at this edge; every error names the file, the field and the allowed
values, and is raised as `InputError` (exit code 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from memx.domain.errors import InputError
from memx.domain.specs import (
    MLP_KINDS,
    RECOMPUTE_LEVELS,
    Cluster,
    GpuType,
    ModelArch,
    Node,
    SearchSpace,
)

KINDS = ("gpus", "clusters", "models", "search")


def default_conf_root() -> Path:
    """`$MEMX_CONF`, else the conf/ folder shipped beside the package."""
    env = os.environ.get("MEMX_CONF")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "conf"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuYaml(_Strict):
    name: str
    vendor: str
    memory_gib: PositiveFloat
    peak_tflops_bf16: PositiveFloat
    memory_bandwidth_gbps: PositiveFloat
    intra_node_bandwidth_gbps: PositiveFloat
    notes: str | None = None


class NodeYaml(_Strict):
    gpu: str
    count: PositiveInt


class ClusterYaml(_Strict):
    name: str
    inter_node_bandwidth_gbps: PositiveFloat
    inter_node_latency_ms: float = Field(default=0.01, ge=0)
    nodes: list[NodeYaml] = Field(min_length=1)
    notes: str | None = None


class ModelYaml(_Strict):
    name: str
    layers: PositiveInt
    hidden: PositiveInt
    ffn_hidden: PositiveInt
    heads: PositiveInt
    query_groups: PositiveInt
    vocab: PositiveInt
    seq_len: PositiveInt
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    notes: str | None = None


class SearchYaml(_Strict):
    name: str
    global_batch: PositiveInt
    tp_options: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1)
    micro_batch_options: list[PositiveInt] = Field(default=[1, 2, 4], min_length=1)
    recompute_levels: list[Literal["none", "selective", "full", "block"]] = Field(
        default=["none", "selective", "full", "block"], min_length=1
    )
    max_pp: PositiveInt = 8
    min_pp: PositiveInt = 1
    use_all_gpus: bool = True
    weights: str = "auto"
    dtype: Literal["bf16"] = "bf16"
    optimizer: Literal["adam"] = "adam"
    reserve_gib: float = Field(default=1.0, ge=0)
    target_margin: float = Field(default=0.10, ge=0, lt=1)
    epsilon_mib2: PositiveFloat = 1.0e4
    seq_len: PositiveInt | None = None
    max_splits_per_layout: PositiveInt = 5_000_000
    max_stage_slowdown: float = Field(default=2.0, ge=0)
    max_time_ratio: float = Field(default=0.0, ge=0)
    notes: str | None = None


def _format_validation(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid catalog entry"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        ctx = e.get("ctx") or {}
        if "expected" in ctx:
            msg += f" (allowed: {ctx['expected']})"
        lines.append(f"  field '{loc}': {msg}; got {e.get('input')!r}")
    return "\n".join(lines)


def known_names(kind: str, conf_root: Path | None = None) -> list[str]:
    folder = (conf_root or default_conf_root()) / kind
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve(kind: str, name_or_path: str | Path, conf_root: Path | None = None) -> Path:
    """A catalog entry by name (conf_root/kind/NAME.yaml) or by path to a YAML file."""
    root = conf_root or default_conf_root()
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        if not candidate.is_file():
            raise InputError(f"{candidate}: no such {kind[:-1] if kind != 'search' else 'search'} file")
        return candidate
    path = root / kind / f"{name_or_path}.yaml"
    if not path.is_file():
        names = ", ".join(known_names(kind, root)) or "(none)"
        raise InputError(f"unknown {kind.rstrip('s')} '{name_or_path}' in {root / kind}; known: {names}")
    return path


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_yaml(model: type[BaseModel], path: Path) -> Any:
    """Read a YAML mapping and validate it with a pydantic model; InputError names file and fields."""
    try:
        return model.model_validate(_read_yaml(path))
    except ValidationError as exc:
        raise InputError(_format_validation(path, exc)) from exc


def load_gpu(name_or_path: str | Path, conf_root: Path | None = None) -> GpuType:
    y = parse_yaml(GpuYaml, resolve("gpus", name_or_path, conf_root))
    return GpuType(
        name=y.name,
        vendor=y.vendor,
        memory_gib=y.memory_gib,
        peak_tflops_bf16=y.peak_tflops_bf16,
        memory_bandwidth_gbps=y.memory_bandwidth_gbps,
        intra_node_bandwidth_gbps=y.intra_node_bandwidth_gbps,
    )


def load_cluster(name_or_path: str | Path, conf_root: Path | None = None) -> Cluster:
    path = resolve("clusters", name_or_path, conf_root)
    y = parse_yaml(ClusterYaml, path)
    gpus: dict[str, GpuType] = {}
    for i, node in enumerate(y.nodes):
        if node.gpu not in gpus:
            try:
                gpus[node.gpu] = load_gpu(node.gpu, conf_root)
            except InputError as exc:
                raise InputError(f"{path}: field 'nodes.{i}.gpu': {exc}") from exc
    nodes = tuple(Node(gpu=gpus[n.gpu], count=n.count) for n in y.nodes)
    return Cluster(
        name=y.name,
        inter_node_bandwidth_gbps=y.inter_node_bandwidth_gbps,
        inter_node_latency_ms=y.inter_node_latency_ms,
        nodes=nodes,
    )


def load_model(name_or_path: str | Path, conf_root: Path | None = None) -> ModelArch:
    path = resolve("models", name_or_path, conf_root)
    y = parse_yaml(ModelYaml, path)
    problems = []
    if y.hidden % y.heads:
        problems.append(f"field 'hidden' ({y.hidden}) must be divisible by 'heads' ({y.heads})")
    if y.heads % y.query_groups:
        problems.append(f"field 'heads' ({y.heads}) must be divisible by 'query_groups' ({y.query_groups})")
    if problems:
        raise InputError(f"{path}: " + "; ".join(problems))
    assert y.mlp in MLP_KINDS
    return ModelArch(
        name=y.name,
        layers=y.layers,
        hidden=y.hidden,
        ffn_hidden=y.ffn_hidden,
        heads=y.heads,
        query_groups=y.query_groups,
        vocab=y.vocab,
        seq_len=y.seq_len,
        mlp=y.mlp,
        tied_embeddings=y.tied_embeddings,
    )


def load_search(name_or_path: str | Path, conf_root: Path | None = None) -> SearchSpace:
    path = resolve("search", name_or_path, conf_root)
    y = parse_yaml(SearchYaml, path)
    if y.min_pp > y.max_pp:
        raise InputError(f"{path}: field 'min_pp' ({y.min_pp}) exceeds field 'max_pp' ({y.max_pp})")
    assert all(level in RECOMPUTE_LEVELS for level in y.recompute_levels)
    return SearchSpace(
        name=y.name,
        global_batch=y.global_batch,
        tp_options=tuple(sorted(set(y.tp_options))),
        micro_batch_options=tuple(sorted(set(y.micro_batch_options))),
        recompute_levels=tuple(dict.fromkeys(y.recompute_levels)),
        max_pp=y.max_pp,
        min_pp=y.min_pp,
        use_all_gpus=y.use_all_gpus,
        weights=y.weights,
        dtype=y.dtype,
        optimizer=y.optimizer,
        reserve_gib=y.reserve_gib,
        target_margin=y.target_margin,
        epsilon_mib2=y.epsilon_mib2,
        seq_len=y.seq_len,
        max_splits_per_layout=y.max_splits_per_layout,
        max_stage_slowdown=y.max_stage_slowdown,
        max_time_ratio=y.max_time_ratio,
    )
