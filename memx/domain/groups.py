"""Plan schema 2: data-parallel replica groups (issue #15; docs/architecture.md §Plan JSON, schema 2).

A schema-2 plan is a list of replica groups. Each group is a pipeline of its own — stages with GPU
type, tp, layers, recompute — replicated `dp` times, and takes its own share of the global batch:
`dp × micro_batch × micro_batches` sequences per iteration. The shares add up to `global_batch`.
This is the plan form AMP's heterogeneous trials, Metis' uneven batch split and Sailor's per-stage
(GPU type, tp) replicas can express (AMP: Li et al. 2022 §3.2; Metis: Um et al. 2024 §4;
Sailor: Strati et al. 2024 §4) and a schema-1 plan cannot.

Groups may hold DIFFERENT layer partitions (a group of fast GPUs may run pp = 1 while a group of slow
ones runs pp = 4). Every layer's gradient is then synchronised across the groups per layer, after
each group's own data-parallel reduction: the cross-group term of the iteration time
(docs/architecture.md §Replica groups). Different partitions are supported because the natural plan
on a 4-fast + 12-slow cluster gives each type the pipeline depth its memory needs; requiring equal
boundaries would force the fast group into the slow group's depth.

The distributed optimizer, when on, shards optimizer states over each group's own `dp` ranks (the
groups' states are replicas of one another); sequence parallelism applies per stage as in schema 1.

`memx.domain.plan.idle_gpus` / `with_idle_gpus` serve both schemas (they read `gpus_per_type`).

A schema-1 `Plan` is the one-group case: `as_grouped` lifts it, `simplest` lowers a one-group plan
back, and `group_plans` gives every group as a schema-1 `Plan` whose `global_batch` is the group's
share — the form the per-pipeline machinery (stage signatures, 1F1B assembly, simulator) consumes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from memx.domain.errors import InputError
from memx.domain.precision import DEFAULT_PRECISION
from memx.domain.plan import (
    IdleGpus, Plan, Stage, _idle_from_dict, _options_to_dict, _precision_from_dict, idle_gpus, json_document, _need_bool, _need_int, _stages_from_list, place_plan, plan_from_dict,
    model_problems, plan_to_dict, stage_to_dict, validate_plan,
)
from memx.domain.specs import Cluster, ModelArch

SCHEMA = 2


@dataclass(frozen=True, kw_only=True)
class ReplicaGroup:
    """One data-parallel replica group: a pipeline replicated `dp` times with its own batch share."""

    dp: int
    """Replicas of this group's pipeline (data-parallel inside the group)."""
    micro_batch: int
    """Sequences per micro batch in this group."""
    micro_batches: int
    """Micro batches per iteration per replica of this group (the group's 1F1B m)."""
    stages: tuple[Stage, ...]
    """The group's pipeline stages, first to last."""

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def samples(self) -> int:
        """The group's share of the global batch: dp × micro_batch × micro_batches sequences."""
        return self.dp * self.micro_batch * self.micro_batches

    @property
    def gpus(self) -> int:
        return self.dp * sum(s.tp for s in self.stages)


@dataclass(frozen=True, kw_only=True)
class GroupedPlan:
    """A schema-2 plan: replica groups sharing one model, cluster, global batch and job options."""

    model: str
    cluster: str
    global_batch: int
    """Sequences per iteration, the sum of the groups' shares."""
    seq_len: int
    groups: tuple[ReplicaGroup, ...]
    distributed_optimizer: bool = False
    """As schema 1, sharded over each group's own dp ranks."""
    sequence_parallel: bool = False
    idle_gpus: IdleGpus | None = None
    """Optional record of the cluster's GPUs no group uses."""
    precision: str = DEFAULT_PRECISION
    """As schema 1: one training precision for every group (memx.domain.precision)."""

    def gpus_per_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for plan in group_plans(self):
            for gpu, n in plan.gpus_per_type().items():
                out[gpu] = out.get(gpu, 0) + n
        return out

    @property
    def gpus_used(self) -> int:
        return sum(g.gpus for g in self.groups)


AnyPlan = Plan | GroupedPlan


def group_plans(plan: AnyPlan) -> tuple[Plan, ...]:
    """Every replica group as a schema-1 plan whose global batch is the group's share (a schema-1
    plan is its own only group). `idle_gpus` is not carried: it describes the whole plan."""
    if isinstance(plan, Plan):
        return (plan,)
    return tuple(
        Plan(model=plan.model, cluster=plan.cluster, global_batch=g.samples, micro_batch=g.micro_batch,
             seq_len=plan.seq_len, dp=g.dp, stages=g.stages, distributed_optimizer=plan.distributed_optimizer,
             sequence_parallel=plan.sequence_parallel, precision=plan.precision)
        for g in plan.groups
    )


def as_grouped(plan: AnyPlan) -> GroupedPlan:
    """The schema-2 form of any plan (a schema-1 plan becomes one group)."""
    if isinstance(plan, GroupedPlan):
        return plan
    group = ReplicaGroup(dp=plan.dp, micro_batch=plan.micro_batch, micro_batches=plan.micro_batches,
                         stages=plan.stages)
    return GroupedPlan(model=plan.model, cluster=plan.cluster, global_batch=plan.global_batch,
                       seq_len=plan.seq_len, groups=(group,), distributed_optimizer=plan.distributed_optimizer,
                       sequence_parallel=plan.sequence_parallel, idle_gpus=plan.idle_gpus,
                       precision=plan.precision)


def simplest(plan: AnyPlan) -> AnyPlan:
    """A one-group schema-2 plan as the schema-1 plan it equals; anything else unchanged."""
    if isinstance(plan, Plan) or len(plan.groups) > 1:
        return plan
    (only,) = group_plans(plan)
    return dataclasses.replace(only, global_batch=plan.global_batch, idle_gpus=plan.idle_gpus)


def shared_partition(plan: AnyPlan) -> bool:
    """Whether every replica group splits the layers the same way (same stage boundaries and the same tp per
    stage, GPU types may differ): then the runtime runs ONE data-parallel collective per stage over the
    replicas of every group, as stock Megatron-LM / NCCL do for any dp group (issue #23). A one-group plan
    shares its own partition."""
    parts = group_plans(plan)
    return all([(st.layers, st.tp) for st in p.stages] == [(st.layers, st.tp) for st in parts[0].stages]
               for p in parts[1:])


# ------------------------------------------------------------------------------------------- JSON

def any_plan_to_dict(plan: AnyPlan) -> dict[str, Any]:
    """Plan JSON of either schema; schema 2 carries `"schema": 2` and `groups`."""
    if isinstance(plan, Plan):
        return plan_to_dict(plan)
    out: dict[str, Any] = {
        "schema": SCHEMA, "model": plan.model, "cluster": plan.cluster, "global_batch": plan.global_batch,
        "seq_len": plan.seq_len,
        "groups": [{"dp": g.dp, "micro_batch": g.micro_batch, "micro_batches": g.micro_batches,
                    "stages": [stage_to_dict(s) for s in g.stages]} for g in plan.groups],
    }
    return {**out, **_options_to_dict(plan)}


def any_plan_to_json(plan: AnyPlan) -> str:
    return json.dumps(any_plan_to_dict(plan), separators=(", ", ": "))


_GROUPED_KEYS = ("model", "cluster", "global_batch", "seq_len", "groups")
_GROUPED_ALLOWED = set(_GROUPED_KEYS) | {"schema", "distributed_optimizer", "sequence_parallel", "idle_gpus", "precision"}
_GROUP_KEYS = ("dp", "micro_batch", "micro_batches", "stages")


def is_grouped_dict(data: Any) -> bool:
    return isinstance(data, dict) and ("groups" in data or data.get("schema") == SCHEMA)


def any_plan_from_dict(data: Any, source: str = "plan") -> AnyPlan:
    """Parse plan JSON of either schema (schema 2 when it has `groups` or `"schema": 2`); every
    structural error names the field (InputError, exit 2)."""
    if not is_grouped_dict(data):
        return plan_from_dict(data, source)
    if data.get("schema", SCHEMA) != SCHEMA:
        raise InputError(f"{source}: field 'schema' is {data['schema']!r}; allowed: 2 (or absent for schema 1)")
    missing = [k for k in _GROUPED_KEYS if k not in data]
    if missing:
        raise InputError(f"{source}: missing field(s) {', '.join(missing)}; a schema-2 plan has {', '.join(_GROUPED_KEYS)}")
    extra = sorted(set(data) - _GROUPED_ALLOWED)
    if extra:
        raise InputError(f"{source}: unknown field(s) {', '.join(extra)} in a schema-2 plan; "
                         f"allowed: {', '.join(sorted(_GROUPED_ALLOWED))}")
    raw_groups = data["groups"]
    if not isinstance(raw_groups, list) or not raw_groups:
        raise InputError(f"{source}: field 'groups' must be a non-empty list of replica groups")
    groups = tuple(_group_from_dict(raw, f"{source}: groups[{i}]") for i, raw in enumerate(raw_groups))
    options = {k: _need_bool(source, k, data[k]) for k in ("distributed_optimizer", "sequence_parallel") if k in data}
    return GroupedPlan(model=str(data["model"]), cluster=str(data["cluster"]),
                       global_batch=_need_int(source, "global_batch", data["global_batch"]),
                       seq_len=_need_int(source, "seq_len", data["seq_len"]), groups=groups, **options,
                       idle_gpus=_idle_from_dict(source, data.get("idle_gpus")), **_precision_from_dict(source, data))


def _group_from_dict(raw: Any, where: str) -> ReplicaGroup:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: must be an object with {', '.join(_GROUP_KEYS)}")
    missing = [k for k in _GROUP_KEYS if k not in raw]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}; a replica group has {', '.join(_GROUP_KEYS)}")
    extra = sorted(set(raw) - set(_GROUP_KEYS))
    if extra:
        raise InputError(f"{where}: unknown field(s) {', '.join(extra)}; allowed: {', '.join(_GROUP_KEYS)}")
    stages = _stages_from_list(raw["stages"], where)
    if any(st.data_parallel is not None for st in stages):  # issue #27: a replica group has one dp
        raise InputError(f"{where}: field 'data_parallel' on a stage of a replica group; a group has one 'dp' "
                         "(a per-stage data_parallel is a schema-1 plan's)")
    if any(st.expert_parallel is not None for st in stages):  # and no experts split: memx.planner.moe
        raise InputError(f"{where}: field 'expert_parallel' on a stage of a replica group; a plan of replica groups "
                         "has no expert parallelism (a per-stage expert_parallel is a per-stage-dp plan's)")
    return ReplicaGroup(dp=_need_int(where, "dp", raw["dp"]), micro_batch=_need_int(where, "micro_batch", raw["micro_batch"]),
                        micro_batches=_need_int(where, "micro_batches", raw["micro_batches"]), stages=stages)


def any_plan_from_json(text: str, source: str = "plan") -> AnyPlan:
    return any_plan_from_dict(json_document(text, source), source)


# ------------------------------------------------------------------------------------- validation

def validate_for_model(plan: AnyPlan, model: ModelArch, source: str = "plan") -> None:
    """A plan of either schema is a plan of `model` whatever the cluster (memx.domain.plan.model_problems,
    each group's pipeline on its own); InputError naming every problem. A plan that passes may still not
    fit a cluster: that is validate_any_plan's question."""
    pipelines = [("", plan)] if isinstance(plan, Plan) else [(f"groups[{i}]: ", gp) for i, gp in enumerate(group_plans(plan))]
    problems = [where + p for where, gp in pipelines for p in model_problems(gp, model)]
    if problems:
        raise InputError(f"{source}: invalid plan of model {model.name}: " + "; ".join(problems))


def validate_any_plan(plan: AnyPlan, cluster: Cluster, model: ModelArch, source: str = "plan") -> None:
    """`validate_plan` for either schema: each group checked as a pipeline, then the groups together
    (shares add up to global_batch, GPUs of each type within the cluster, all groups placeable at once);
    one InputError naming every problem."""
    if isinstance(plan, Plan):
        validate_plan(plan, cluster, model, source)
        return
    problems: list[str] = []
    for i, gp in enumerate(group_plans(plan)):
        try:
            validate_plan(gp, cluster, model, f"groups[{i}]")
        except InputError as exc:
            problems.append(str(exc).replace(": invalid plan: ", ": "))
    share = sum(g.samples for g in plan.groups)
    if share != plan.global_batch:
        problems.append(f"the groups' shares (dp × micro_batch × micro_batches) sum to {share}, "
                        f"field 'global_batch' is {plan.global_batch}")
    known = {g.name for g in cluster.gpu_types}
    for gpu, used in plan.gpus_per_type().items():
        if gpu in known and used > cluster.gpu_count(gpu):
            problems.append(f"the groups use {used} × {gpu} together, cluster {cluster.name} has {cluster.gpu_count(gpu)}")
    if plan.idle_gpus is not None:
        actual = {g: n for g, n in idle_gpus(plan, cluster).items() if n > 0}
        if {g: n for g, n in plan.idle_gpus if n} != actual:
            problems.append(f"field 'idle_gpus' is {dict(plan.idle_gpus)}, but the groups leave {actual or 'no GPU'} idle")
    if not problems and place_groups(plan, cluster) is None:
        problems.append("the groups' TP groups cannot be placed on the cluster's nodes together")
    if problems:
        raise InputError(f"{source}: invalid schema-2 plan: " + "; ".join(problems))


def place_groups(plan: AnyPlan, cluster: Cluster) -> list[list[list[int]]] | None:
    """Node index of every (group, replica, stage) TP group, packed first-fit group after group on
    one shared set of free GPUs, or None if the groups do not fit together."""
    free = [n.count for n in cluster.nodes]
    out = []
    for gp in group_plans(plan):
        where = place_plan(gp, cluster, free=free)
        if where is None:
            return None
        out.append(where)
    return out
