"""A FlagScale heterogeneous training config for a plan (`memx plan --format flagscale`, flagscale.yaml).

FlagScale (FlagOpen/FlagScale, Megatron-LM based) runs what stock Megatron-LM cannot: one *process mesh* per
GPU type with its own tp, dp and pipeline stages, an uneven layer split, full recomputation per stage and micro
batch, and mixed vendors (FlagCX). Field names, types and the constraints FlagScale asserts are those of
FlagScale at `FLAGSCALE_COMMIT` (flagscale/train/arguments.py `pre_validate_args` / `post_validate_args`,
flagscale/backends/Megatron-LM/megatron/training/arguments.py.patch `_add_hetero_args`,
flagscale/runner/runner_train.py, examples/llama3/conf/train/8b_hetero.yaml) and of the Megatron-LM it pins
(`FLAGSCALE_MEGATRON_COMMIT`); tests/fixtures/flagscale_config.json lists them and
tests/unit/test_flagscale_config.py checks every emitted config against it.

The file is one Hydra config: `experiment` (task, runner, envs), `action`, and `train` with `system`, `model`,
`data` (FlagScale's runner flattens these three into `--key-name` arguments of its train_gpt.py). Launch:
`python run.py --config-path DIR --config-name flagscale action=run` from a FlagScale checkout. Data, tokenizer,
checkpoint folder and hostfile are `${oc.env:NAME}`: OmegaConf stops with "Environment variable 'NAME' not
found" when one is unset.

Mapping: the stages of one GPU type (contiguous, one tp: memx.planner.space; one dp, or the stages' own
`data_parallel`, issue #27: FlagScale's per-mesh dp, micro_batch_size the first mesh's) are one mesh [tp, cp=1, ep, dp,
stages] (ep: the stage's `expert_parallel`, else the plan's — FlagScale's ProcessMesh takes it per mesh, the
expert tp defaulting to the mesh's tp: flagscale/train/hetero/parallel_context.py build_all_process_meshes); `hetero_pipeline_layer_split` is the plan's layer split; per-stage recomputation is FlagScale's
`recompute_*_per_stage_micro_batch` (granularity 1 = full on / 0 = off, method 0 uniform / 1 block, num layers).
What FlagScale cannot express (`flagscale_problems`): replica groups with different pipelines, selective
recomputation on some stages only (per-stage control exists for full recomputation only), and tied embeddings
with different tp on the first and last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memx.domain.errors import NotLaunchable
from memx.domain.groups import AnyPlan, GroupedPlan, simplest
from memx.domain.plan import Plan, Recompute, place_plan
from memx.domain.specs import Cluster, ModelArch
from memx.domain.stage_dp import has_stage_dp, place_stage_groups, stage_dps, stage_eps
from memx.report.megatron import EXAMPLE_TRAINING_ARGS, _attention_args, _data_args, _gpu_types, _model_args

FLAGSCALE_COMMIT = "da4935ec60193e735bc70b81e259ed04eefd0132"  # FlagOpen/FlagScale, 2025-11-13
FLAGSCALE_MEGATRON_COMMIT = "8479eb35fbca9631acb846c3ad5d868e02214227"  # its third_party/Megatron-LM
HOSTFILE_PLACEHOLDER = ("HOSTFILE", "FlagScale hostfile, one line per node: `HOST slots=N type=GPU` (lines below)")
# FlagScale's runner: system, model and data are flattened into one argument list (runner_train._get_args_megatron),
# so the section a key sits in is for reading only; these go to `system` as in FlagScale's examples.
SYSTEM_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
               "use_distributed_optimizer", "use_flash_attn", "expert_model_parallel_size")
PRECISION_KEYS = ("bf16", "fp16", "fp8_format", "initial_loss_scale", "min_loss_scale", "loss_scale_window",
                  "hysteresis")
OPTIMIZER_KEYS = ("weight_decay", "adam_beta1", "adam_beta2")
LR_KEYS = ("lr", "min_lr", "lr_decay_style", "lr_warmup_iters")
DATA_KEYS = ("data_path", "split")
TOKENIZER_KEYS = ("tokenizer_type", "tokenizer_model", "vocab_file", "merge_file")
CHECKPOINT_KEYS = ("save", "load", "save_interval")


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """One FlagScale process mesh: consecutive stages on one GPU type with one tp."""

    gpu: str
    tp: int
    dp: int
    stages: int
    ep: int = 1  # expert-parallel size (issue #27): FlagScale's ProcessMesh takes it per mesh, expert tp = the mesh's tp

    def values(self) -> list[int]:
        """[tp, cp, ep, dp, pp] (flagscale/train/arguments.py pre_validate_args reads them in this order)."""
        return [self.tp, 1, self.ep, self.dp, self.stages]


def meshes(plan: Plan) -> list[Mesh]:
    """Consecutive stages of one GPU type, tp, dp and ep (a per-stage `data_parallel` / `expert_parallel` is its
    mesh's dp / ep: issue #27, memx.domain.stage_dp) are one mesh."""
    out: list[Mesh] = []
    for st, dp, ep in zip(plan.stages, stage_dps(plan), stage_eps(plan)):
        if out and (out[-1].gpu, out[-1].tp, out[-1].dp, out[-1].ep) == (st.gpu, st.tp, dp, ep):
            out[-1] = Mesh(gpu=st.gpu, tp=st.tp, dp=dp, stages=out[-1].stages + 1, ep=ep)
        else:
            out.append(Mesh(gpu=st.gpu, tp=st.tp, dp=dp, stages=1, ep=ep))
    return out


def flagscale_problems(plan: AnyPlan, model: ModelArch) -> list[str]:
    """Why FlagScale cannot run `plan` (empty when it can)."""
    plan = simplest(plan)
    if isinstance(plan, GroupedPlan):
        return ["the plan's replica groups run different pipelines (layer partitions, tp) with different micro "
                "batches; FlagScale's process meshes split one pipeline, every data-parallel rank of it running the "
                "same layer partition"]
    problems = []
    kinds = {st.recompute for st in plan.stages}
    if Recompute.SELECTIVE in kinds and len(kinds) > 1:
        problems.append("selective recomputation on some stages only: FlagScale's per-stage recomputation "
                        "(recompute_granularity_per_stage_micro_batch) needs recompute_granularity full "
                        "(train/arguments.py post_validate_args)")
    if model.tied_embeddings and plan.stages[0].tp != plan.stages[-1].tp:
        problems.append(f"tied embeddings with tp {plan.stages[0].tp} on the first stage and {plan.stages[-1].tp} on "
                        "the last: FlagScale asserts the same tp on both (train/arguments.py pre_validate_args)")
    if plan.context_parallel > 1:  # FlagScale hetero/parallel_context.py ParallelContext.__init__ asserts cp == 1
        problems.append(f"context parallelism (context_parallel {plan.context_parallel}): FlagScale's heterogeneous "
                        "training asserts 'Context parallelism is not supported.' (flagscale/train/hetero/"
                        "parallel_context.py ParallelContext); plan with context_parallel_options [1] or use --format megatron")
    if plan.virtual_stages > 1:  # issue #27: the config does not carry the interleaved schedule yet
        problems.append(f"interleaved 1F1B (virtual_stages {plan.virtual_stages}): this config does not write FlagScale's "
                        "virtual-pipeline settings yet; plan with virtual_stages_options [1] or use --format megatron")
    return problems


def _value(v: str) -> Any:
    if v.startswith("${"):
        return "${oc.env:" + v[2:]
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def args_to_keys(args: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Megatron arguments as FlagScale config keys (`--rotary-base 500000` → rotary_base: 500000, a flag → True):
    the inverse of FlagScale's flatten_dict_to_args (flagscale/runner/utils.py)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        key = args[i][2:].replace("-", "_")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key], i = _value(args[i + 1]), i + 2
        else:
            out[key], i = True, i + 1
    return out


def _take(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: d.pop(k) for k in keys if k in d}


def _recompute(plan: Plan, micro_batches: int) -> dict[str, Any]:
    """The `recompute` block: one setting when every stage has it, else FlagScale's per-stage lists, one
    sub-list [stages=1, micro batches, value] per stage."""
    kinds = {(st.recompute, st.recompute_layers) for st in plan.stages}
    first = plan.stages[0]
    if len(kinds) == 1 and first.recompute == Recompute.SELECTIVE:
        return {"recompute_granularity": "selective"}
    if len(kinds) == 1 and first.recompute == Recompute.NONE:
        return {}
    if len(kinds) == 1:
        block = first.recompute_layers is not None
        return {"recompute_granularity": "full", "recompute_method": "block" if block else "uniform",
                "recompute_num_layers": first.recompute_layers if block else 1}
    on = [int(st.recompute == Recompute.FULL) for st in plan.stages]
    method = [int(st.recompute_layers is not None) for st in plan.stages]
    layers = [st.recompute_layers or 1 for st in plan.stages]
    return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
            "recompute_granularity_per_stage_micro_batch": [[1, micro_batches, v] for v in on],
            "recompute_method_per_stage_micro_batch": [[1, micro_batches, v] for v in method],
            "recompute_num_layers_per_stage_micro_batch": [[1, micro_batches, v] for v in layers]}


def hostfile_lines(plan: Plan, cluster: Cluster | None) -> list[str]:
    """`HOST slots=N type=GPU` per node the plan uses (first-fit placement), in mesh order."""
    groups = _stage_nodes(plan, cluster) if cluster is not None else None
    if groups is None:
        return [f"node-{m.gpu}-{i} slots={m.tp} type={m.gpu}" for m in meshes(plan) for i in range(m.dp * m.stages)]
    used: dict[int, int] = {}
    for st, nodes in zip(plan.stages, groups):
        for n in nodes:
            used[n] = used.get(n, 0) + st.tp
    order = sorted(used, key=lambda n: ([m.gpu for m in meshes(plan)].index(cluster.nodes[n].gpu.name), n))
    return [f"node{n} slots={used[n]} type={cluster.nodes[n].gpu.name}" for n in order]


def _stage_nodes(plan: Plan, cluster: Cluster) -> list[list[int]] | None:
    """Per stage, the node of each of its TP groups (memx.domain.plan.place_plan's replicas, or a per-stage dp's
    groups: memx.domain.stage_dp.place_stage_groups)."""
    if has_stage_dp(plan):
        return place_stage_groups(plan, cluster)
    where = place_plan(plan, cluster)
    return None if where is None else [[where[r][s] for r in range(plan.dp)] for s in range(plan.pp)]


def _shared_embedding(plan: Plan, model: ModelArch) -> dict[str, Any]:
    """FlagScale asserts `use_partial_reduce_for_shared_embedding` when tied embeddings meet different first and
    last mesh dp with the distributed optimizer (train/arguments.py pre_validate_args); {} otherwise."""
    dps = stage_dps(plan)
    need = model.tied_embeddings and plan.distributed_optimizer and dps[0] != dps[-1]
    return {"use_partial_reduce_for_shared_embedding": True} if need else {}


def flagscale_config(plan: AnyPlan, model: ModelArch, cluster: Cluster | None = None) -> dict[str, Any]:
    """The FlagScale config of `plan` (raises NotLaunchable with `flagscale_problems` when it has any)."""
    problems = flagscale_problems(plan, model)
    if problems:
        raise NotLaunchable("FlagScale cannot run this plan: " + "; ".join(problems))
    plan = simplest(plan)
    gpus = _gpu_types(plan, cluster)
    ms = meshes(plan)
    tp = max(st.tp for st in plan.stages)
    keys = args_to_keys([*_model_args(plan, model), *_attention_args(gpus)[0], *_data_args(model)[0],
                         *EXAMPLE_TRAINING_ARGS])
    precision = _take(keys, PRECISION_KEYS)
    system: dict[str, Any] = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": plan.pp,
                              "sequence_parallel": bool(plan.sequence_parallel and tp > 1),
                              "use_distributed_optimizer": bool(plan.distributed_optimizer), **_take(keys, SYSTEM_KEYS),
                              **_shared_embedding(plan, model)}
    vendors = {g.vendor for g in gpus.values() if g is not None}
    if len(vendors) > 1:  # FlagCX: FlagOpen's cross-vendor collectives (Megatron-LM patch: --distributed-backend)
        system["distributed_backend"] = "flagcx"
    system["hetero"] = {"enable_hetero": True, "hetero_process_meshes": [v for m in ms for v in m.values()],
                        "hetero_device_types": [m.gpu for m in ms], "hetero_current_device_type": ms[0].gpu,
                        "hetero_pipeline_layer_split": [st.layers for st in plan.stages],
                        "standalone_embedding_stage": False}
    micro_batches = plan.global_batch // (plan.micro_batch * plan.dp)
    if rc := _recompute(plan, micro_batches):
        system["recompute"] = rc
    system["precision"] = precision
    system["logging"] = _take(keys, ("log_interval",))
    system["checkpoint"] = _take(keys, CHECKPOINT_KEYS)
    data = {**_take(keys, DATA_KEYS), "tokenizer": _take(keys, TOKENIZER_KEYS)}
    optimizer = {**_take(keys, OPTIMIZER_KEYS), "lr_scheduler": _take(keys, LR_KEYS)}
    model_block = {**keys, "micro_batch_size": plan.micro_batch, "global_batch_size": plan.global_batch,
                   "optimizer": optimizer}
    envs = {"CUDA_DEVICE_MAX_CONNECTIONS": 1} if tp > 1 else {}
    nodes = hostfile_lines(plan, cluster)
    return {
        "defaults": ["_self_"],
        "experiment": {"exp_name": f"memx_{plan.model}_{plan.cluster}", "exp_dir": f"./outputs_memx_{plan.model}",
                       "task": {"type": "train", "backend": "megatron",
                                "entrypoint": "./flagscale/train/hetero/train_gpt.py"},
                       "runner": {"backend": "torchrun", "nnodes": len(nodes),
                                  "nproc_per_node": max(int(n.split("slots=")[1].split()[0]) for n in nodes),
                                  "hostfile": "${oc.env:HOSTFILE}"},
                       "envs": envs},
        "action": "run",
        "hydra": {"run": {"dir": "${experiment.exp_dir}/hydra"}},
        "train": {"system": system, "model": model_block, "data": data},
    }


def render_flagscale(plan: AnyPlan, model: ModelArch, cluster: Cluster | None = None) -> str:
    """flagscale.yaml: the header (plan, launch command, placeholders, hostfile) and the config."""
    import yaml  # only when rendering

    config = flagscale_config(plan, model, cluster)
    plan = simplest(plan)
    placeholders = (*_data_args(model)[1], HOSTFILE_PLACEHOLDER)
    lines = [f"# FlagScale heterogeneous training for {plan.model} on {plan.cluster} (MemX plan): "
             f"{len(meshes(plan))} process mesh(es), pp {plan.pp}, "
             f"dp {'/'.join(str(m.dp) for m in meshes(plan)) if has_stage_dp(plan) else plan.dp}, "
             f"{plan.gpus_used} GPUs.",
             "# Meshes [tp, cp, ep, dp, pp]: " + "; ".join(f"{m.gpu} {m.values()}" for m in meshes(plan)),
             f"# Field names and constraints: FlagOpen/FlagScale at {FLAGSCALE_COMMIT[:10]} (flagscale/train/arguments.py).",
             "# Launch from a FlagScale checkout (README \"Train\"):",
             "#   python run.py --config-path DIR_OF_THIS_FILE --config-name flagscale action=run",
             "# Set before launching (OmegaConf stops with \"Environment variable ... not found\" when one is unset):"]
    lines += [f"#   {name:<16} {what}" for name, what in placeholders]
    lines += ["# The hostfile, with your host names (types in mesh order; FlagScale maps ranks by type):"]
    lines += [f"# hostfile: {n}" for n in hostfile_lines(plan, cluster)]
    return "\n".join(lines) + "\n" + yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=120)
