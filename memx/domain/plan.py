"""Stage and Plan: the unit the search ranks and the output users launch (docs/architecture.md §Plan JSON).

Plan JSON round-trips exactly through `plan_to_dict` / `plan_from_dict`; `validate_plan` checks a
plan against its cluster and model and names every offending field.

Plan-level job options (issue #14) have defaults that say what older plan files meant, and are
written only when they differ from them, so an older file loads and re-serialises unchanged:
`distributed_optimizer` (false: Adam states replicated on every data-parallel rank),
`sequence_parallel` (false: norms/dropouts replicated across the TP group), `idle_gpus`
(absent: not recorded; a plan may use a subset of the cluster's GPUs either way) and `heads` /
`query_groups` (absent: the model's; present only when the search changed them — a different training
job, `plan_model` gives the model the plan trains), `virtual_stages` (issue #27, absent: 1, Megatron's
plain 1F1B; v > 1: the interleaved 1F1B schedule, `interleave_problems`) and `precision` (absent: bf16, what
every plan meant before issue #23; memx.domain.precision), `context_parallel` (issue #27, absent: 1; cp > 1:
Megatron-LM's context parallelism, memx.domain.context_parallel) and `expert_parallel` (issue #27, absent: 1,
every rank holds every expert; `moe_problems`). A stage's `data_parallel` (issue #27, absent: the plan's dp) is
FlagScale's per-mesh dp (memx.domain.stage_dp: the plan's `dp` and `micro_batch` are then the first stage's), and in
such a plan a stage's `expert_parallel` (absent: the plan's) FlagScale's per-mesh ep (the plan's is the first stage's).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from memx.domain.context_parallel import context_problems
from memx.domain.errors import InputError, short_repr
from memx.domain.precision import DEFAULT_PRECISION, check_precision
from memx.domain.recompute import PLAN_RECOMPUTE, SEARCH_BLOCK, Recompute  # noqa: F401  (re-exported)
from memx.domain.specs import MAX_CLUSTER_GPUS, Cluster, ModelArch
from memx.domain.stage_dp import has_stage_dp, place_stage_groups, stage_dp_problems, stage_dps


@dataclass(frozen=True, kw_only=True)
class Stage:
    gpu: str
    tp: int
    layers: int
    recompute: Recompute = Recompute.NONE  # a plain string is converted; an unknown one raises ValueError
    recompute_layers: int | None = None  # with full: Megatron's block method, first N layers
    data_parallel: int | None = None
    """This stage's own data-parallel degree dp_i (issue #27, FlagScale's per-mesh dp, memx.domain.stage_dp):
    each micro batch of dp × micro_batch samples is split dp_i ways here. None: the plan's dp."""
    expert_parallel: int | None = None
    """This stage's own expert-parallel size ep_i in a per-stage-dp plan (FlagScale's per-mesh ep,
    memx.domain.stage_dp.stage_eps). None: the plan's expert_parallel."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", Recompute(self.recompute))

    @property
    def recomputed_layers(self) -> int:
        """Layers recomputed in full (0 for none/selective)."""
        if self.recompute != Recompute.FULL:
            return 0
        return self.layers if self.recompute_layers is None else self.recompute_layers


IdleGpus = tuple[tuple[str, int], ...]  # (gpu type, idle count) pairs, in the cluster's type order


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    cluster: str
    global_batch: int
    micro_batch: int
    seq_len: int
    dp: int
    stages: tuple[Stage, ...]
    distributed_optimizer: bool = False
    """Megatron-LM `--use-distributed-optimizer` (ZeRO-1, Rajbhandari et al. 2020 §5): fp32 main params
    and Adam m, v sharded over the dp ranks of every stage; grads reduce-scattered, params all-gathered."""
    sequence_parallel: bool = False
    """Megatron-LM `--sequence-parallel` (Korthikanti et al. 2022 §4.2.2): LayerNorm/dropout regions
    split over the TP group along the sequence; a no-op on stages with tp = 1 (Megatron disables it)."""
    idle_gpus: IdleGpus | None = None
    """Optional record of the cluster's GPUs the plan leaves idle (`with_idle_gpus`); None: not recorded."""
    heads: int | None = None
    """Attention heads the plan trains with when the search changed the model's (SearchSpace.heads_options,
    a different training job); None: the model's."""
    query_groups: int | None = None
    """K/V heads (GQA) when the search changed the model's (SearchSpace.query_groups_options); None: the model's."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (Megatron-LM `--num-virtual-stages-per-pipeline-rank`, the interleaved
    1F1B schedule of Narayanan et al. 2021 §2.2.2): each stage's layers are split into v equal chunks and
    rank s holds virtual stages s, s + pp, …, s + (v − 1)·pp. 1: plain 1F1B (the JSON key is then absent)."""
    precision: str = DEFAULT_PRECISION
    """Training precision, bf16 | fp16 | fp8 (memx.domain.precision; Megatron-LM `--bf16`, `--fp16` with dynamic
    loss scaling, `--bf16 --fp8-format hybrid`: docs/planner.md §Precision); written only when not bf16."""
    expert_parallel: int = 1
    """Expert-parallel size ep of a mixture-of-experts model (Megatron-LM `--expert-model-parallel-size`, one for
    every stage): each MoE layer's experts are split over ep consecutive data-parallel replicas of its stage,
    tokens reach them by all-to-all (memx.planner.moe). 1: every rank holds every expert (the key is then absent)."""

    context_parallel: int = 1
    """Context-parallel ranks per stage and TP rank (Megatron-LM `--context-parallel-size`, issue #27): each
    sequence is split over cp GPUs; a stage then uses dp × cp × tp GPUs (memx.domain.context_parallel).
    1: none (the JSON key is then absent)."""

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def micro_batches(self) -> int:
        """m = global_batch / (dp · micro_batch) (docs/architecture.md §Plan JSON)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def gpus_used(self) -> int:
        """dp × cp × Σ tp; with a per-stage dp, cp × Σ tp_i · dp_i (memx.domain.stage_dp)."""
        return sum(self.gpus_per_type().values())

    def gpus_per_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s, dp in zip(self.stages, stage_dps(self)):
            out[s.gpu] = out.get(s.gpu, 0) + dp * self.context_parallel * s.tp
        return out


def idle_gpus(plan: Any, cluster: Cluster) -> dict[str, int]:
    """GPUs of each type of `cluster` that `plan` (either schema: anything with `gpus_per_type`) leaves idle
    (cluster count − GPUs used; 0 when all
    are used). Negative counts mean the plan uses more than the cluster has (`validate_plan` rejects it)."""
    used = plan.gpus_per_type()
    return {g.name: cluster.gpu_count(g.name) - used.get(g.name, 0) for g in cluster.gpu_types}


def with_idle_gpus(plan: Any, cluster: Cluster) -> Any:
    """`plan` carrying the record of the GPUs it leaves idle on `cluster` (types with none idle omitted)."""
    idle = tuple((gpu, n) for gpu, n in idle_gpus(plan, cluster).items() if n > 0)
    return dataclasses.replace(plan, idle_gpus=idle)


def stage_to_dict(stage: Stage) -> dict[str, Any]:
    d: dict[str, Any] = {"gpu": stage.gpu, "tp": stage.tp, "layers": stage.layers, "recompute": stage.recompute.value}
    if stage.recompute_layers is not None:
        d["recompute_layers"] = stage.recompute_layers
    if stage.data_parallel is not None:
        d["data_parallel"] = stage.data_parallel
    if stage.expert_parallel is not None:
        d["expert_parallel"] = stage.expert_parallel
    return d


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "model": plan.model,
        "cluster": plan.cluster,
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "seq_len": plan.seq_len,
        "dp": plan.dp,
        "stages": [stage_to_dict(s) for s in plan.stages],
        **_options_to_dict(plan),
    }


def _options_to_dict(plan: Any) -> dict[str, Any]:
    """The job options that differ from their defaults (older plan files stay byte-identical)."""
    out: dict[str, Any] = {}
    if plan.distributed_optimizer:
        out["distributed_optimizer"] = True
    if plan.sequence_parallel:
        out["sequence_parallel"] = True
    if plan.idle_gpus is not None:
        out["idle_gpus"] = dict(plan.idle_gpus)
    if plan.precision != DEFAULT_PRECISION:
        out["precision"] = plan.precision
    out.update({k: getattr(plan, k) for k in _MODEL_KEYS if getattr(plan, k, None) is not None})  # schema 2 has none
    if getattr(plan, "virtual_stages", 1) > 1:  # schema 2 has none
        out["virtual_stages"] = plan.virtual_stages
    if getattr(plan, "context_parallel", 1) > 1:  # schema 2 has none
        out["context_parallel"] = plan.context_parallel
    if getattr(plan, "expert_parallel", 1) > 1:  # schema 2 has none
        out["expert_parallel"] = plan.expert_parallel
    return out


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), separators=(", ", ": "))


_PLAN_KEYS = ("model", "cluster", "global_batch", "micro_batch", "seq_len", "dp", "stages")
_OPTION_KEYS = ("distributed_optimizer", "sequence_parallel")  # optional booleans, default false
_STAGE_KEYS = ("gpu", "tp", "layers")
_MODEL_KEYS = ("heads", "query_groups")  # optional integers: the model's when absent (plan_model)


def _need_int(where: str, field: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}: field '{field}' must be an integer ≥ {minimum}, got {value!r}")
    return value


def _need_bool(where: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where}: field '{field}' must be true or false, got {value!r}")
    return value


def _idle_from_dict(source: str, value: Any) -> IdleGpus | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{source}: field 'idle_gpus' must be an object {{gpu type: idle count}}, got {value!r}")
    return tuple((str(gpu), _need_int(source, f"idle_gpus.{gpu}", n, 0)) for gpu, n in value.items())


def plan_from_dict(data: dict[str, Any], source: str = "plan") -> Plan:
    """Parse plan JSON; structural errors name the field (InputError, exit 2)."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: a plan must be a JSON object, got {type(data).__name__}")
    if "groups" in data or data.get("schema") == 2:
        raise InputError(f"{source}: a schema-2 plan (replica groups) where a schema-1 plan is expected; "
                         "read it with memx.domain.groups.any_plan_from_dict")
    missing = [k for k in _PLAN_KEYS if k not in data]
    if missing:
        raise InputError(f"{source}: missing field(s) {', '.join(missing)}; a plan has {', '.join(_PLAN_KEYS)}")
    stages = _stages_from_list(data["stages"], source)
    return Plan(
        model=str(data["model"]),
        cluster=str(data["cluster"]),
        global_batch=_need_int(source, "global_batch", data["global_batch"]),
        micro_batch=_need_int(source, "micro_batch", data["micro_batch"]),
        seq_len=_need_int(source, "seq_len", data["seq_len"]),
        dp=_need_int(source, "dp", data["dp"]),
        stages=stages,
        **{k: _need_bool(source, k, data[k]) for k in _OPTION_KEYS if k in data},
        idle_gpus=_idle_from_dict(source, data.get("idle_gpus")),
        **{k: _need_int(source, k, data[k]) for k in _MODEL_KEYS if data.get(k) is not None},
        **({"virtual_stages": _need_int(source, "virtual_stages", data["virtual_stages"])}
           if "virtual_stages" in data else {}),
        **({"context_parallel": _need_int(source, "context_parallel", data["context_parallel"])}
           if "context_parallel" in data else {}),
        **({"expert_parallel": _need_int(source, "expert_parallel", data["expert_parallel"])}
           if "expert_parallel" in data else {}),
        **_precision_from_dict(source, data),
    )


def _precision_from_dict(source: str, data: dict[str, Any]) -> dict[str, str]:
    """{"precision": …} when the plan names one (checked: bf16, fp16, fp8); {} for older files (bf16)."""
    return {"precision": check_precision(data["precision"], source)} if "precision" in data else {}


def _stages_from_list(raw_stages: Any, source: str) -> tuple[Stage, ...]:
    """The `stages` list of a plan (or of a schema-2 replica group); errors name `stages[i].field`."""
    if not isinstance(raw_stages, list) or not raw_stages:
        raise InputError(f"{source}: field 'stages' must be a non-empty list")
    stages = []
    for i, raw in enumerate(raw_stages):
        where = f"{source}: stages[{i}]"
        if not isinstance(raw, dict):
            raise InputError(f"{where}: must be an object")
        miss = [k for k in _STAGE_KEYS if k not in raw]
        if miss:
            raise InputError(f"{where}: missing field(s) {', '.join(miss)}")
        extra = set(raw) - {"gpu", "tp", "layers", "recompute", "recompute_layers", "data_parallel", "expert_parallel"}
        if extra:
            raise InputError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
        recompute = raw.get("recompute", Recompute.NONE.value)
        if recompute not in PLAN_RECOMPUTE:
            raise InputError(f"{where}: field 'recompute' is {recompute!r}; allowed: {', '.join(PLAN_RECOMPUTE)}")
        layers = _need_int(where, "layers", raw["layers"])
        rl = raw.get("recompute_layers")
        if rl is not None:
            rl = _need_int(where, "recompute_layers", rl, 0)
            if recompute != Recompute.FULL or rl > layers:
                raise InputError(
                    f"{where}: field 'recompute_layers' ({rl}) needs recompute 'full' and at most 'layers' ({layers})"
                )
        dp, ep = (None if raw.get(k) is None else _need_int(where, k, raw[k]) for k in ("data_parallel", "expert_parallel"))
        stages.append(
            Stage(gpu=str(raw["gpu"]), tp=_need_int(where, "tp", raw["tp"]), layers=layers, recompute=recompute,
                  recompute_layers=rl, data_parallel=dp, expert_parallel=ep)
        )
    return tuple(stages)


def plan_model(plan: Plan, model: ModelArch) -> ModelArch:
    """The model the plan trains: `model` with the plan's heads, query groups and sequence length (the search
    may change them, SearchSpace.heads_options …); `model` itself when the plan changes nothing. Raises
    SpecError (an InputError) when the plan's values do not fit the model (hidden % heads, heads % groups)."""
    heads = model.heads if plan.heads is None else plan.heads
    groups = model.query_groups if plan.query_groups is None else plan.query_groups
    if (heads, groups, plan.seq_len) == (model.heads, model.query_groups, model.seq_len):
        return model
    return dataclasses.replace(model, heads=heads, query_groups=groups, seq_len=plan.seq_len)


def with_model_changes(plan: Plan, trained: ModelArch, model: ModelArch) -> Plan:
    """`plan` recording the heads / query groups of `trained` where they differ from `model`'s (the plan's
    `seq_len` already says its sequence length); unchanged fields stay absent, so the JSON is as before."""
    return dataclasses.replace(plan, heads=trained.heads if trained.heads != model.heads else None,
                               query_groups=trained.query_groups if trained.query_groups != model.query_groups else None)


def json_document(text: str, source: str) -> Any:
    """The parsed JSON of a plan file or field; InputError naming `source` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not valid JSON: {exc}") from exc


def plan_from_json(text: str, source: str = "plan") -> Plan:
    return plan_from_dict(json_document(text, source), source)


def validate_plan(plan: Plan, cluster: Cluster, model: ModelArch, source: str = "plan") -> None:
    """Check a plan against its cluster and model; one InputError naming every problem."""
    problems: list[str] = []
    if plan.model != model.name:
        problems.append(f"field 'model' is {plan.model!r} but the model given is {model.name!r}")
    if plan.cluster != cluster.name:
        problems.append(f"field 'cluster' is {plan.cluster!r} but the cluster given is {cluster.name!r}")
    problems += model_problems(plan, model)
    known = {g.name for g in cluster.gpu_types}
    for i, s in enumerate(plan.stages):
        if s.gpu not in known:
            problems.append(f"stages[{i}].gpu {s.gpu!r} is not in cluster {cluster.name}; allowed: {', '.join(sorted(known))}")
            continue
        if s.tp > max(cluster.node_sizes(s.gpu)):
            problems.append(f"stages[{i}].tp ({s.tp}) exceeds the largest {s.gpu} node ({max(cluster.node_sizes(s.gpu))} GPUs)")
        if plan.precision not in cluster.gpu(s.gpu).precisions:
            problems.append(f"field 'precision' is {plan.precision}, which GPU {s.gpu} (stages[{i}]) cannot run; it has "
                            f"{', '.join(cluster.gpu(s.gpu).precisions)}")
    # fewer GPUs than the cluster has is a valid plan (the rest stay idle); more is not
    for gpu, used in plan.gpus_per_type().items():
        if gpu in known and used > cluster.gpu_count(gpu):
            problems.append(f"plan uses {used} × {gpu} ({_gpu_formula(plan)}), "
                            f"cluster {cluster.name} has {cluster.gpu_count(gpu)}")
    problems += _idle_record_problems(plan, cluster)
    problems += interleave_problems(plan)
    problems += context_problems(plan)
    problems += moe_problems(plan, model)
    problems += stage_dp_problems(plan, model)
    placed = place_stage_groups(plan, cluster) if has_stage_dp(plan) else place_plan(plan, cluster)
    if not problems and placed is None:
        problems.append("the stages' TP groups cannot be placed on the cluster's nodes (a TP group must fit in one node)")
    if problems:
        raise InputError(f"{source}: invalid plan: " + "; ".join(problems))


def _gpu_formula(plan: Plan) -> str:
    """How a plan's GPUs of one type are counted (Plan.gpus_per_type), for the message that names them."""
    cp = " × cp" if plan.context_parallel > 1 else ""
    return f"Σ tp_i × dp_i{cp}" if has_stage_dp(plan) else "dp × cp × Σ tp"


def model_problems(plan: Plan, model: ModelArch) -> list[str]:
    """What makes `plan` no plan of `model` whatever the cluster: layers that do not sum to the model's,
    a global batch dp × micro_batch does not divide, heads / query groups that do not fit, a tp that does
    not divide them, sizes beyond the catalog bounds (memx.domain.specs)."""
    problems = []
    total = sum(s.layers for s in plan.stages)
    if total != model.layers:
        problems.append(f"stage 'layers' sum to {total}, model {model.name} has {model.layers}")
    if plan.dp > MAX_CLUSTER_GPUS:
        problems.append(f"field 'dp' ({short_repr(plan.dp)}) exceeds {MAX_CLUSTER_GPUS} (the most GPUs a cluster has)")
    elif plan.global_batch % (plan.dp * plan.micro_batch):
        problems.append(
            f"field 'global_batch' ({plan.global_batch}) is not divisible by dp × micro_batch "
            f"({plan.dp} × {plan.micro_batch})"
        )
    try:
        model = plan_model(plan, model)
    except InputError as exc:
        problems.append(f"fields 'heads'/'query_groups' do not fit model {model.name}: {exc}")
    for i, s in enumerate(plan.stages):
        if model.heads % s.tp or model.query_groups % s.tp:
            problems.append(
                f"stages[{i}].tp ({s.tp}) must divide heads ({model.heads}) and query_groups ({model.query_groups})"
            )
    return problems


def interleave_problems(plan: Plan) -> list[str]:
    """What the interleaved 1F1B schedule (virtual_stages v > 1) needs, one message per factor that does not
    divide (Megatron-LM, megatron/training/arguments.py and core/pipeline_parallel/schedules.py): pp > 1
    ('pipeline-model-parallel size should be greater than 1'); every stage's layers a multiple of v (equal
    chunks); a block recompute's `recompute_layers` a multiple of v (Megatron applies --recompute-num-layers
    to each chunk); m a multiple of pp (micro batches are scheduled in groups of pp per chunk,
    `microbatch_group_size_per_vp_stage` = pp: a remainder raises 'dependency bubbles')."""
    v = plan.virtual_stages
    if v == 1:
        return []
    out = [] if plan.pp > 1 else [f"field 'virtual_stages' ({v}) needs pp > 1, the plan has one stage"]
    out += [f"stages[{i}].layers ({s.layers}) is not divisible by virtual_stages ({v})"
            for i, s in enumerate(plan.stages) if s.layers % v]
    out += [f"stages[{i}].recompute_layers ({s.recompute_layers}) is not divisible by virtual_stages ({v})"
            for i, s in enumerate(plan.stages) if s.recompute_layers is not None and s.recompute_layers % v]
    if plan.pp > 1 and plan.micro_batches % plan.pp:
        out.append(f"micro batches m = global_batch / (dp × micro_batch) ({plan.micro_batches}) is not divisible "
                   f"by pp ({plan.pp}), which virtual_stages {v} needs")
    return out


def moe_problems(plan: Plan, model: ModelArch) -> list[str]:
    """What expert parallelism (expert_parallel ep > 1) needs, one message per factor (Megatron-LM,
    megatron/training/arguments.py: 'Number of experts should be a multiple of expert model parallel_size';
    megatron/core/parallel_state.py: world_size divisible by expert_tensor_parallel × ep × pp, the expert tensor
    parallel size defaulting to tp — per stage of tp × dp GPUs that is ep dividing dp; model_parallel_config.py:
    'When using expert parallelism and tensor parallelism … sequence parallelism must be used'). With context
    parallelism the expert grid has no cp axis (parallel_state.py: the expert RankGenerator's cp=1, expert dp =
    world / (etp × ep × pp)), so ep groups are carved from the dp × cp ranks: ep divides dp × cp. A mixture-of-experts
    model with tp > 1 needs sequence parallelism at every ep, 1 included (megatron/core/transformer/moe/moe_layer.py,
    MoELayer.forward raises ValueError in training when the attention tp group is > 1 and sequence_parallel is off;
    since Megatron-LM commit 28c8dd7, May 2024: session 14)."""
    ep, cp = plan.expert_parallel, plan.context_parallel
    if ep == 1:
        return _moe_sequence_parallel(plan, model)
    if not model.is_moe:
        return [f"field 'expert_parallel' ({ep}) needs a mixture-of-experts model; {model.name} has no 'num_experts'"]
    out = [] if model.num_experts % ep == 0 else [
        f"field 'expert_parallel' ({ep}) does not divide num_experts ({model.num_experts}) of model {model.name}"]
    if plan.dp * cp % ep and not has_stage_dp(plan):  # a per-stage dp: every stage's, stage_dp_problems
        ranks = f"dp × context_parallel ({plan.dp} × {cp})" if cp > 1 else f"dp ({plan.dp})"
        out.append(f"field 'expert_parallel' ({ep}) does not divide {ranks}: each stage's tp × dp{' × cp' * (cp > 1)} "
                   f"GPUs must split into expert tp (= tp) × ep × expert dp")
    return out + _moe_sequence_parallel(plan, model)


def _moe_sequence_parallel(plan: Plan, model: ModelArch) -> list[str]:
    if not model.is_moe or plan.sequence_parallel or all(s.tp == 1 for s in plan.stages):
        return []
    return [f"field 'sequence_parallel' (false) with a mixture-of-experts model ({model.name}) and tp > 1: "
            "Megatron-LM refuses it (MoELayer.forward raises ValueError in training); allowed: true"]


def _idle_record_problems(plan: Plan, cluster: Cluster) -> list[str]:
    """A recorded `idle_gpus` must match what the plan leaves idle on the cluster (types with 0 may be omitted)."""
    if plan.idle_gpus is None:
        return []
    recorded = dict(plan.idle_gpus)
    actual = {gpu: n for gpu, n in idle_gpus(plan, cluster).items() if n > 0}
    unknown = sorted(set(recorded) - {g.name for g in cluster.gpu_types})
    if unknown:
        return [f"field 'idle_gpus' names {', '.join(unknown)}, not in cluster {cluster.name}"]
    if {g: n for g, n in recorded.items() if n} != actual:
        return [f"field 'idle_gpus' is {recorded}, but the plan leaves {actual or 'no GPU'} idle on {cluster.name}"]
    return []


def place_plan(plan: Plan, cluster: Cluster, free: list[int] | None = None) -> list[list[int]] | None:
    """Node index of every (replica, stage) TP group, packed first-fit, or None if it does not fit. With
    context parallelism (cp > 1) there are dp·cp rows, row r·cp + c holding cp rank c of replica r
    (memx.domain.context_parallel.cp_groups).

    Replicas are placed stage by stage so a stage's DP replicas share a node when they can. `free`
    (GPUs free per node, updated in place) lets several replica groups share one cluster
    (memx.domain.groups.place_groups); None: the whole cluster is free.
    """
    if has_stage_dp(plan):
        raise ValueError("a plan with a per-stage data_parallel has no replicas: memx.domain.stage_dp.place_stage_groups")
    free = [n.count for n in cluster.nodes] if free is None else free
    n_rep = plan.dp * getattr(plan, "context_parallel", 1)  # cp > 1: dp·cp TP groups per stage, cp-major
    where = [[-1] * plan.pp for _ in range(n_rep)]
    nodes_of: dict[str, list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        nodes_of.setdefault(node.gpu.name, []).append(i)
    # First fit, a node at a time: the replicas a node takes in turn are the next ones, up to free // tp. The first
    # node of a type with ≥ tp free never moves back (free only falls), so each (type, tp) keeps its cursor.
    cursor: dict[tuple[str, int], int] = {}
    for s, stage in enumerate(plan.stages):
        idx, tp = nodes_of.get(stage.gpu, []), stage.tp
        j, r = cursor.get((stage.gpu, tp), 0), 0
        while r < n_rep:
            while j < len(idx) and free[idx[j]] < tp:
                j += 1
            if j == len(idx):
                return None
            i = idx[j]
            k = min(n_rep - r, free[i] // tp) if tp > 0 else n_rep - r
            free[i] -= k * tp
            for row in where[r:r + k]:
                row[s] = i
            r += k
        cursor[(stage.gpu, tp)] = j
    return where
