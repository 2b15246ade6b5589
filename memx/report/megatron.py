"""A launchable Megatron-LM `pretrain_gpt.py` command for a plan (`memx plan --format megatron`, megatron.sh).

Argument names, types and combinations follow Megatron-LM at commit `MEGATRON_COMMIT`:
megatron/training/arguments.py and the config dataclasses its argument groups are generated from
(TransformerConfig, ModelParallelConfig, megatron/training/config/training_config.py).
tests/fixtures/megatron_arguments.json lists them; tests/unit/test_megatron_command.py parses every
emitted command against that list. What stock Megatron-LM cannot express (a different tp per stage,
per-stage recomputation, mixed vendors in one NCCL job) becomes a NOTE in the script.

Uneven layer splits: `--decoder-first/last-pipeline-num-layers` when only the end stages differ,
else `--pipeline-model-parallel-layout` (Megatron Core ≥ 0.13, "custom pipeline layout": stages split
by `|`, `E` embedding, `t` decoder layer, `L` loss, `t*N` repeats), e.g. "Et*12|t*10|t*10,L".

A schema-2 plan (replica groups with their own pipelines and micro batches, memx.domain.groups) cannot
run as one stock Megatron-LM job: every data-parallel rank there runs the same pipeline with the same
micro batch. Its megatron.sh says so (`HETEROGENEOUS_DP_NOTE`), lists each group's pretrain_gpt.py
arguments as commented guidance, and exits 1.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from memx.domain.catalog import load_gpu
from memx.domain.errors import InputError
from memx.domain.groups import AnyPlan, GroupedPlan, any_plan_to_dict, group_plans, simplest
from memx.domain.plan import Plan, Recompute, Stage, idle_gpus, plan_model
from memx.domain.precision import MEGATRON_FLAGS
from memx.domain.attention import FLASH_ATTENTION_FAMILIES, has_flash_attention  # noqa: F401  (re-exported)
from memx.domain.stage_dp import has_stage_dp, stage_dps
from memx.domain.specs import Cluster, GpuType, ModelArch

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # NVIDIA/Megatron-LM, read 2026-08 (core 0.20)
# Shell variables the user must set; the script stops with this message when one is missing.
DATA_PLACEHOLDERS = (
    ("DATA_PATH", "Megatron dataset prefix (the .bin/.idx pair from tools/preprocess_data.py)"),
    ("CHECKPOINT_DIR", "folder where checkpoints are saved and resumed from"),
)
TOKENIZER_PLACEHOLDERS = {
    "swiglu": (("TOKENIZER_MODEL", "Hugging Face tokenizer name or folder of the model"),),
    "gelu": (("VOCAB_FILE", "GPT-2 BPE vocab.json"), ("MERGE_FILE", "GPT-2 BPE merges.txt")),
}
# Example training hyper-parameters (LLaMA 2 paper §2.2: AdamW β 0.9/0.95, cosine, weight decay 0.1,
# clip 1.0): needed to launch, not chosen by MemX.
EXAMPLE_TRAINING_ARGS = (
    "--train-iters", "1000", "--lr", "3.0e-4", "--min-lr", "3.0e-5", "--lr-decay-style", "cosine",
    "--lr-warmup-iters", "100", "--weight-decay", "0.1", "--clip-grad", "1.0", "--adam-beta1", "0.9",
    "--adam-beta2", "0.95", "--init-method-std", "0.02", "--log-interval", "10", "--save-interval", "1000",
    "--eval-interval", "1000", "--eval-iters", "10",
)


# Systems whose runtimes train data-parallel replicas that differ in pipeline and batch share (issue #15),
# each cited for what it supports.
HETEROGENEOUS_DP_NOTE = (
    "this plan's replica groups run different pipelines with different micro batches and batch shares; stock "
    "Megatron-LM gives every data-parallel rank the same pipeline and micro batch, so it cannot run this plan as "
    "one job. It needs a framework with heterogeneous data-parallel replicas, e.g. Sailor's training framework "
    "(Strati et al., SOSP 2025, github.com/eth-easl/sailor; based on Megatron-DeepSpeed, it runs heterogeneous "
    "parallelization plans with different micro-batch sizes per GPU) or Whale (Jia et al., USENIX ATC 2022, "
    "open-sourced as EPL; its hardware-aware load balancing gives data-parallel replicas on different GPU types "
    "different batch sizes). HetPipe (Park et al., USENIX ATC 2020) trains heterogeneous pipelines as virtual "
    "workers synchronised through a parameter server (wave synchronous parallel), not the per-layer all-reduce "
    "MemX models.")


@dataclass(frozen=True, kw_only=True)
class MegatronCommand:
    """What a launch needs: pretrain_gpt.py arguments, notes, environment and placeholders."""

    args: tuple[str, ...]
    """pretrain_gpt.py arguments; a placeholder value is written `${NAME}`."""
    notes: tuple[str, ...]
    """What stock Megatron-LM cannot express, or what the user must arrange."""
    env: tuple[tuple[str, str], ...]
    """Environment variables exported before the launch."""
    placeholders: tuple[tuple[str, str], ...]
    """(shell variable, what to set it to)."""
    problems: tuple[str, ...] = ()
    """Why stock Megatron-LM cannot start the plan (empty: it can); then megatron.sh only explains and exits 1."""


def pipeline_layout(plan: Plan) -> str:
    """The `--pipeline-model-parallel-layout` string of the plan's layer split; interleaved (virtual_stages v
    > 1) it lists the pp·v virtual stages in order, virtual stage c·pp + s holding rank s's layers / v."""
    v, parts = plan.virtual_stages, []
    for k in range(plan.pp * v):
        st = plan.stages[k % plan.pp]
        n = st.layers // v
        body = f"t*{n}" if n else ""
        if k == 0:
            body = "E" + body
        if k == plan.pp * v - 1:
            body = body + (",L" if body else "L")
        parts.append(body)
    return "|".join(parts)


def _split_args(plan: Plan) -> tuple[list[str], list[str]]:
    layers = [st.layers for st in plan.stages]
    if len(set(layers)) == 1:  # interleaved: --num-layers-per-virtual-pipeline-stage (even split only)
        return ([] if plan.virtual_stages == 1 else
                ["--num-layers-per-virtual-pipeline-stage", str(layers[0] // plan.virtual_stages)]), []
    if len(set(layers[1:-1])) <= 1 and plan.virtual_stages == 1:  # only the end stages differ: older releases too
        return ["--decoder-first-pipeline-num-layers", str(layers[0]),
                "--decoder-last-pipeline-num-layers", str(layers[-1])], []
    note = (f"the layer split {layers} is uneven{' and interleaved' if plan.virtual_stages > 1 else ''}: "
            "--pipeline-model-parallel-layout needs Megatron Core ≥ 0.13; older releases can only give the first "
            "and last stages their own size.")
    return ["--pipeline-model-parallel-layout", pipeline_layout(plan)], [note]


def _rc(st: Stage) -> str:
    if st.recompute == Recompute.FULL and st.recompute_layers is not None:
        return f"full block {st.recompute_layers}/{st.layers}"
    return st.recompute.value


def _recompute_args(plan: Plan) -> list[str]:
    """One recompute setting for every stage (Megatron-LM applies it to every pipeline rank); where the stages
    differ (not launchable: `megatron_problems`) the most memory-saving stage's, for the guidance."""
    st = max(plan.stages, key=lambda x: (x.recompute == Recompute.FULL, x.recompute == Recompute.SELECTIVE,
                                          x.recomputed_layers))
    if st.recompute == Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]
    if st.recompute == Recompute.FULL and st.recomputed_layers:
        if st.recompute_layers is None:  # every layer: uniform chunks of one layer
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                str(st.recompute_layers // plan.virtual_stages)]  # per model chunk when interleaved
    return []


def _model_args(plan: Plan, model: ModelArch) -> list[str]:
    model = plan_model(plan, model)  # the heads / query groups the plan trains with (SearchSpace.heads_options)
    llama = model.mlp == "swiglu"
    args = [
        "--num-layers", str(model.layers),
        "--hidden-size", str(model.hidden),
        "--ffn-hidden-size", str(model.ffn_hidden),
        "--num-attention-heads", str(model.heads),
    ]
    if model.query_groups != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.query_groups)]
    args += ["--seq-length", str(plan.seq_len), "--max-position-embeddings", str(plan.seq_len),
             "--position-embedding-type", "rope" if llama else "learned_absolute"]
    if llama:  # LLaMA: SwiGLU, RMSNorm, no biases, no dropout (Touvron et al. 2023 §2); RoPE base θ (ModelArch)
        args += ["--rotary-base", str(model.rotary_base), "--swiglu", "--normalization", "RMSNorm",
                 "--disable-bias-linear", "--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    else:
        args += ["--normalization", "LayerNorm"]
    if not model.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    return args + moe_args(plan, model) + precision_args(plan)


def moe_args(plan: Plan, model: ModelArch) -> list[str]:
    """A mixture-of-experts model's arguments (Megatron-LM arguments.py `_add_moe_args`, TransformerConfig and
    ModelParallelConfig fields at MEGATRON_COMMIT): experts, top-k, expert and shared-expert sizes, ep, and the
    alltoall dispatcher with grouped GEMMs that memx.planner.moe models (Megatron's default dispatcher is
    allgather). The first `moe_first_dense_layers` dense (`--moe-layer-freq "([0]*k+[1]*(L-k))"`), else every layer
    MoE (`--moe-layer-freq` 1, the default); the expert tp is tp (the default). The
    load-balancing loss coefficient is an example hyper-parameter (Switch Transformers' 1e-2, Fedus et al. 2022
    §2.2), not chosen by MemX."""
    if not model.is_moe:
        return []
    args = ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_router_topk),
            "--moe-ffn-hidden-size", str(model.expert_ffn_hidden)]
    if model.moe_shared_expert_ffn_hidden is not None:
        args += ["--moe-shared-expert-intermediate-size", str(model.moe_shared_expert_ffn_hidden)]
    if k := model.moe_first_dense_layers:  # moe_freq_type: a Python list expression, 0 = dense layer
        args += ["--moe-layer-freq", f"([0]*{k}+[1]*{model.layers - k})"]
    return args + ["--expert-model-parallel-size", str(plan.expert_parallel), "--moe-token-dispatcher-type",
                   "alltoall", "--moe-grouped-gemm", "--moe-router-load-balancing-type", "aux_loss",
                   "--moe-aux-loss-coeff", "1e-2"]


def precision_args(plan: AnyPlan) -> list[str]:
    """The precision arguments (Megatron-LM arguments.py _add_mixed_precision_args, TransformerConfig.fp8;
    FlagScale passes its `precision:` block to the same parser): memx.domain.precision.MEGATRON_FLAGS, the one
    mapping (bf16 `--bf16`; fp16 `--fp16` with Megatron's dynamic loss scaling written out; fp8
    `--fp8-format hybrid` on bf16 weights)."""
    precision = plan.precision  # both plan schemas carry it (bf16 when the file has none)
    if precision not in MEGATRON_FLAGS:
        raise InputError(f"plan field 'precision': {precision!r}; allowed: {', '.join(MEGATRON_FLAGS)}")
    return list(MEGATRON_FLAGS[precision])


def _parallel_args(plan: Plan) -> tuple[list[str], list[str]]:
    tp = max(st.tp for st in plan.stages)
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(plan.pp),
            "--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.global_batch)]
    notes = []
    if plan.sequence_parallel and tp > 1:
        args += ["--sequence-parallel"]
    elif plan.sequence_parallel:
        notes.append("the plan asks for sequence parallelism, a no-op at tp = 1 (Megatron-LM disables it): not emitted.")
    if plan.distributed_optimizer:
        args += ["--use-distributed-optimizer"]
    if plan.context_parallel > 1:  # issue #27; --cp-comm-type's default p2p is the ring MemX models (arguments.py)
        args += ["--context-parallel-size", str(plan.context_parallel)]
    return args, notes


def _gpu_types(plan: Plan, cluster: Cluster | None) -> dict[str, GpuType | None]:
    """GPU type of each stage GPU name: from the cluster, else the packaged catalog, else unknown (None)."""
    out: dict[str, GpuType | None] = {}
    for name in dict.fromkeys(st.gpu for st in plan.stages):
        if cluster is not None and name in {g.name for g in cluster.gpu_types}:
            out[name] = cluster.gpu(name)
            continue
        try:
            out[name] = load_gpu(name)
        except InputError:
            out[name] = None
    return out


_has_flash_attention = has_flash_attention  # memx.domain.attention (also the context-parallel launcher rule)


def _attention_args(gpus: dict[str, GpuType | None]) -> tuple[list[str], list[str]]:
    known = {n: g for n, g in gpus.items() if g is not None}
    if len(known) == len(gpus) and all(_has_flash_attention(g) for g in known.values()):
        return ["--use-flash-attn"], []
    without = sorted(n for n, g in gpus.items() if g is None or not _has_flash_attention(g))
    vendors = {g.vendor for g in known.values()}
    hint = ("; on AMD, ROCm's Megatron-LM fork provides FlashAttention (CK) behind the same --use-flash-attn"
            if "amd" in vendors else "")
    verb = "has" if len(without) == 1 else "have"
    return [], [f"no --use-flash-attn: {', '.join(without)} {verb} no FlashAttention-2 build for stock Megatron-LM "
                f"(NVIDIA Ampere or newer only){hint}; the attention backend is left to --attention-backend auto."]


def megatron_problems(plan: Plan, gpus: dict[str, GpuType | None]) -> list[str]:
    """Why stock Megatron-LM cannot start `plan` (empty when it can): the space `launcher: megatron` searches
    (memx.planner.space, memx.planner.launcher)."""
    problems = []
    tps = [st.tp for st in plan.stages]
    cp_txt = (" × cp", f" × {plan.context_parallel}") if plan.context_parallel > 1 else ("", "")
    if len(set(tps)) > 1:
        problems.append(f"stages use different tensor-parallel sizes {tps}: stock Megatron-LM takes one "
                        f"--tensor-model-parallel-size for every stage and needs tp × pp{cp_txt[0]} × dp = the world size "
                        f"(arguments.py validate_args); {max(tps)} × {plan.pp}{cp_txt[1]} × {plan.dp} = "
                        f"{max(tps) * plan.pp * plan.context_parallel * plan.dp} ≠ {plan.gpus_used} GPUs")
    if len({(st.recompute, st.recompute_layers) for st in plan.stages}) > 1:
        problems.append("per-stage recomputation differs across stages ("
                        + ", ".join(f"stage {i}: {_rc(st)}" for i, st in enumerate(plan.stages))
                        + "): stock Megatron-LM applies one --recompute-granularity / --recompute-method / "
                        "--recompute-num-layers to every stage")
    problems += context_parallel_problems(plan, gpus)
    if has_stage_dp(plan):  # issue #27: FlagScale's per-mesh dp (memx.domain.stage_dp)
        problems.append(f"stages use different data-parallel sizes {list(stage_dps(plan))}: Megatron-LM needs one "
                        "--data-parallel size for all stages (its world is tp × pp × dp with one dp, parallel_state.py); "
                        "FlagScale runs a dp per process mesh (--format flagscale)")
    vendors = sorted({g.vendor for g in gpus.values() if g is not None})
    if len(vendors) > 1:
        problems.append(f"stages span GPU vendors ({', '.join(vendors)}): one NCCL job cannot join them (NCCL, RCCL "
                        "and the other vendors' libraries do not interoperate)")
    return problems


def context_parallel_problems(plan: Plan, gpus: dict[str, GpuType | None]) -> list[str]:
    """Context parallelism (cp > 1) runs only in Transformer Engine's attention (Megatron-LM
    core/transformer/dot_product_attention.py: 'Context parallelism is only supported by TEDotProductAttention!'),
    whose unfused backend refuses it: every stage's GPU needs fused attention (memx.domain.attention)."""
    if plan.context_parallel == 1:
        return []
    without = sorted(n for n, g in gpus.items() if g is None or not has_flash_attention(g))
    return [f"context_parallel {plan.context_parallel} on {', '.join(without)}: Megatron-LM runs context parallelism "
            "only in Transformer Engine's fused/flash attention (TEDotProductAttention; its unfused backend refuses "
            "cp), which these GPUs lack"] if without else []


def _rank_order_notes(plan: Plan, gpus: dict[str, GpuType | None]) -> list[str]:
    if len(gpus) <= 1:
        return []
    g = "tp·cp·dp" if plan.context_parallel > 1 else "tp·dp"
    return ["stages run on different GPU types; with Megatron's default rank order tp-cp-ep-dp-pp, pipeline "
            f"stage s holds the global ranks s·{g} … (s+1)·{g} − 1: start ranks so that "
            + ", ".join(f"stage {s} → {st.gpu}" for s, st in enumerate(plan.stages)) + "."]


def _data_args(model: ModelArch) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    tokenizer = TOKENIZER_PLACEHOLDERS[model.mlp]
    if model.mlp == "swiglu":
        tok = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "${TOKENIZER_MODEL}"]
    else:
        tok = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "${VOCAB_FILE}", "--merge-file", "${MERGE_FILE}"]
    args = ["--data-path", "${DATA_PATH}", "--split", "949,50,1", *tok,
            "--save", "${CHECKPOINT_DIR}", "--load", "${CHECKPOINT_DIR}"]
    return args, DATA_PLACEHOLDERS[:1] + tokenizer + DATA_PLACEHOLDERS[1:]


def megatron_command(plan: Plan, model: ModelArch, cluster: Cluster | None = None) -> MegatronCommand:
    """The complete pretrain_gpt.py launch of `plan` for `model`; `cluster` (else the packaged GPU catalog)
    tells the GPU vendors and families (flash attention, mixed-vendor notes)."""
    gpus = _gpu_types(plan, cluster)
    parallel, parallel_notes = _parallel_args(plan)
    split, split_notes = _split_args(plan)
    recompute = _recompute_args(plan)
    attention, attn_notes = _attention_args(gpus)
    data, placeholders = _data_args(model)
    args = _model_args(plan, model) + parallel + split + recompute + attention + data + list(EXAMPLE_TRAINING_ARGS)
    notes = _rank_order_notes(plan, gpus) + split_notes + parallel_notes + attn_notes
    # Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tp > 1 before Blackwell (arguments.py validate_args)
    env = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),) if max(st.tp for st in plan.stages) > 1 else ()
    return MegatronCommand(args=tuple(args), notes=tuple(notes), env=env, placeholders=placeholders,
                           problems=tuple(megatron_problems(plan, gpus)))


def megatron_args(plan: Plan, model: ModelArch, cluster: Cluster | None = None) -> tuple[list[str], list[str]]:
    """(arguments for pretrain_gpt.py, notes on what stock Megatron-LM cannot express)."""
    cmd = megatron_command(plan, model, cluster)
    return list(cmd.args), list(cmd.notes)


def _quote(value: str) -> str:
    return f'"{value}"' if value.startswith("${") else shlex.quote(value)


def _arg_lines(args: tuple[str, ...]) -> list[str]:
    """One `--flag [value]` per line."""
    lines, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {_quote(args[i + 1])}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    return lines


def _header(plan: Plan, cluster: Cluster | None) -> list[str]:
    tp = "/".join(str(t) for t in dict.fromkeys(st.tp for st in plan.stages))
    lines = [f"# Megatron-LM launch for {plan.model} on {plan.cluster} (MemX plan): tp {tp}, pp {plan.pp}, "
             f"{f'cp {plan.context_parallel}, ' if plan.context_parallel > 1 else ''}dp {plan.dp}, {plan.gpus_used} GPUs in all "
             "(world size).",
             "# Stages: " + "; ".join(f"{s}: {st.layers} layer{'s' if st.layers != 1 else ''} on {st.gpu} "
                                      f"(tp {st.tp}, recompute {_rc(st)})"
                                      for s, st in enumerate(plan.stages))]
    if cluster is not None:
        idle = {g: n for g, n in idle_gpus(plan, cluster).items() if n > 0}
        if idle:
            lines.append("# Left idle by this plan: " + ", ".join(f"{n} × {g}" for g, n in idle.items()))
    lines.append(f"# Argument names: NVIDIA/Megatron-LM megatron/training/arguments.py at {MEGATRON_COMMIT[:10]}.")
    return lines


MEGATRON_SEARCH_HINT = ("search for the best plan stock Megatron-LM runs: `memx plan --search megatron` (or "
                        "`launcher: megatron` in your search YAML; docs/megatron.md), or launch this plan with "
                        "FlagScale: `--format flagscale`")


def _stop_lines(what: str, nearest: str | None) -> list[str]:
    """The end of a script that must not start: the nearest launchable plan or the search hint, exit 1."""
    lines = [f"# Nearest plan stock Megatron-LM runs: {nearest}" if nearest else f"# Instead: {MEGATRON_SEARCH_HINT}"]
    return lines + [f'echo {shlex.quote(f"error: {what}; see the notes at the top of this script")} >&2', "exit 1"]


def render_unlaunchable(plan: Plan, model: ModelArch, cluster: Cluster | None, cmd: MegatronCommand,
                        nearest: str | None = None) -> str:
    """megatron.sh for a plan stock Megatron-LM cannot start: why, the arguments as commented guidance, the
    nearest launchable plan (or the search hint), exit 1 — never a command that fails at start-up."""
    lines = ["#!/usr/bin/env bash", *_header(plan, cluster)]
    lines += [f"# CANNOT START: {p}" for p in cmd.problems]
    lines += [f"# NOTE: {n}" for n in cmd.notes]
    lines += ["# Its pretrain_gpt.py arguments, for a runtime that lifts these limits:"]
    lines += [f"#   {line}" for line in _arg_lines(cmd.args)]
    return "\n".join(lines + _stop_lines("stock Megatron-LM cannot start this MemX plan", nearest)) + "\n"


def render_grouped(plan: GroupedPlan, model: ModelArch, cluster: Cluster | None = None) -> str:
    """megatron.sh for a schema-2 plan: the note, each group's arguments as commented guidance, exit 1."""
    data = any_plan_to_dict(plan)
    lines = ["#!/usr/bin/env bash",
             f"# Megatron-LM guidance for {plan.model} on {plan.cluster} (MemX plan, schema 2): {len(plan.groups)} "
             f"replica groups, {plan.gpus_used} GPUs in all, {plan.global_batch} samples per iteration.",
             f"# NOTE: {HETEROGENEOUS_DP_NOTE}",
             "# NOTE: after each group's own data-parallel step, every layer's gradient is all-reduced across the "
             "groups (docs/architecture.md §Plan JSON, schema 2); the framework must do that exchange."]
    for g, gp in enumerate(group_plans(plan)):
        grp = data["groups"][g]
        cmd = megatron_command(gp, model, cluster)
        lines += ["#", f"# group {g}: dp {grp['dp']}, micro batch {grp['micro_batch']} × {grp['micro_batches']} = "
                       f"{gp.global_batch} samples, {gp.gpus_used} GPUs; its pretrain_gpt.py arguments as one job:"]
        lines += [f"#   NOTE: {n}" for n in cmd.notes]
        lines += [f"#   {line}" for line in _arg_lines(cmd.args)]
    lines += ['echo "error: this MemX plan has replica groups with different pipelines; stock Megatron-LM cannot '
              'run it (see the notes at the top of this script)" >&2', "exit 1"]
    return "\n".join(lines) + "\n"


def megatron_launchable(plan: AnyPlan, model: ModelArch, cluster: Cluster | None = None) -> list[str]:
    """Why stock Megatron-LM cannot start `plan` (either schema); empty when it can."""
    plan = simplest(plan)
    if isinstance(plan, GroupedPlan):
        return [HETEROGENEOUS_DP_NOTE.split(";")[0] + ": stock Megatron-LM gives every data-parallel rank the same "
                "pipeline and micro batch"]
    return list(megatron_command(plan, model, cluster).problems)


def nearest_launchable(obj: dict, model: ModelArch, cluster: Cluster | None = None) -> str | None:
    """One line naming the best plan of a search result (`memx plan --format json` object: pick, top by Φ,
    fastest, Pareto front) that stock Megatron-LM starts; None when none of them is one."""
    from memx.domain.groups import any_plan_from_dict
    from memx.report.notation import compact_stages

    for entry in (obj, *obj.get("top", ()), obj.get("fastest"), *obj.get("pareto", ())):
        if entry and not megatron_launchable(any_plan_from_dict(entry["plan"]), model, cluster):
            q = entry["predicted"]
            return (f"{compact_stages(entry['plan'])}, dp {entry['plan']['dp']}, micro batch "
                    f"{entry['plan']['micro_batch']}: {q['iteration_time_ms']:.0f} ms, smallest margin "
                    f"{q['min_margin']:.1%} (one of the plans the search listed; with `launcher: megatron` in the search "
                    "YAML the search picks the best plan Megatron-LM runs)")
    return None


def render_megatron(plan: AnyPlan, model: ModelArch, cluster: Cluster | None = None, nearest: str | None = None) -> str:
    """megatron.sh: a bash script that checks its placeholders and runs torchrun … pretrain_gpt.py; for a
    schema-2 plan with several groups, the guidance of `render_grouped`; for a plan stock Megatron-LM cannot
    start, `render_unlaunchable` (`nearest`: the nearest plan it runs, one line)."""
    plan = simplest(plan)
    if isinstance(plan, GroupedPlan):
        return render_grouped(plan, model, cluster)
    cmd = megatron_command(plan, model, cluster)
    if cmd.problems:
        return render_unlaunchable(plan, model, cluster, cmd, nearest)
    lines = ["#!/usr/bin/env bash", *_header(plan, cluster)]
    lines += [f"# NOTE: {n}" for n in cmd.notes]
    lines += ["#", "# Set before launching (the script stops when one is missing):"]
    lines += [f"#   {name:<16} {what}" for name, what in cmd.placeholders]
    lines += ["#   NNODES, NODE_RANK, GPUS_PER_NODE, MASTER_ADDR, MASTER_PORT: torchrun rendezvous (default: one node)",
              "# Without data: replace the data/tokenizer arguments with --mock-data --tokenizer-type NullTokenizer "
              f"--vocab-size {model.vocab}",
              "# --train-iters … --eval-iters: example hyper-parameters (LLaMA 2 §2.2), not chosen by MemX.",
              "set -euo pipefail"]
    lines += [f': "${{{name}:?set {name}: {what}}}"' for name, what in cmd.placeholders]
    lines += [f"export {k}={v}" for k, v in cmd.env]
    launcher = ('torchrun --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "${GPUS_PER_NODE:-'
                f'{_gpus_per_node(plan, cluster)}}}" --master-addr "${{MASTER_ADDR:-localhost}}" '
                '--master-port "${MASTER_PORT:-6000}"')
    lines.append(" \\\n  ".join([launcher, "pretrain_gpt.py", *_arg_lines(cmd.args)]))
    return "\n".join(lines) + "\n"


def _gpus_per_node(plan: Plan, cluster: Cluster | None) -> int:
    """Default processes per node: the largest node of the plan's GPU types, at most the world size."""
    sizes = [n for st in plan.stages for n in (cluster.node_sizes(st.gpu) if cluster is not None else ())]
    return min(max(sizes, default=8), plan.gpus_used)
