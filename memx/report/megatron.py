"""Megatron-LM arguments for a plan, with notes where stock Megatron-LM cannot express it.

Uneven layer splits use `--pipeline-model-parallel-layout` (Megatron Core ≥ 0.13, "Custom Pipeline
Model Parallel Layout": stages split by `|`, `E` embedding, `t` decoder layer, `L` loss, `t*N`
repeats), e.g. "Et*12|t*10|t*10,L".
"""

from __future__ import annotations

import shlex

from memx.domain.plan import Plan, Recompute, Stage
from memx.domain.specs import ModelArch


def pipeline_layout(plan: Plan) -> str:
    parts = []
    for s, st in enumerate(plan.stages):
        body = f"t*{st.layers}" if st.layers else ""
        if s == 0:
            body = "E" + body
        if s == plan.pp - 1:
            body = body + (",L" if body else "L")
        parts.append(body)
    return "|".join(parts)


def _recompute_args(plan: Plan) -> tuple[list[str], list[str]]:
    kinds = {(st.recompute, st.recompute_layers) for st in plan.stages}
    notes: list[str] = []
    if len(kinds) > 1:
        notes.append(
            "per-stage recomputation differs across stages ("
            + ", ".join(f"stage {i}: {_rc(st)}" for i, st in enumerate(plan.stages))
            + "); stock Megatron-LM applies one setting to every stage. The arguments below use the most "
            "memory-saving stage's setting; apply the per-stage setting with a patched "
            "`--recompute-num-layers` per pipeline rank."
        )
        st = max(plan.stages, key=lambda x: (x.recompute == Recompute.FULL, x.recompute == Recompute.SELECTIVE, x.recomputed_layers))
    else:
        st = plan.stages[0]
    if st.recompute == Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"], notes
    if st.recompute == Recompute.FULL:
        if st.recompute_layers is None:
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"], notes
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                str(st.recompute_layers)], notes
    return [], notes


def _rc(st: Stage) -> str:
    if st.recompute == Recompute.FULL and st.recompute_layers is not None:
        return f"full block {st.recompute_layers}/{st.layers}"
    return str(st.recompute)


def megatron_args(plan: Plan, model: ModelArch) -> tuple[list[str], list[str]]:
    """(arguments for pretrain_gpt.py, notes on what stock Megatron-LM cannot express)."""
    notes: list[str] = []
    tps = {st.tp for st in plan.stages}
    if len(tps) > 1:
        notes.append(
            f"stages use different tensor-parallel sizes {[st.tp for st in plan.stages]}; stock Megatron-LM needs "
            "one --tensor-model-parallel-size for all stages. Launch with a heterogeneous-TP runtime, or take "
            "the largest size below and accept the difference."
        )
    gpus = {st.gpu for st in plan.stages}
    if len(gpus) > 1:
        notes.append(
            "stages run on different GPU types; order ranks so that pipeline rank s lands on "
            + ", ".join(f"{s}→{st.gpu}" for s, st in enumerate(plan.stages))
            + " (Megatron's default rank order is tp-cp-ep-dp-pp)."
        )
    args = [
        "--tensor-model-parallel-size", str(max(tps)),
        "--pipeline-model-parallel-size", str(plan.pp),
        "--micro-batch-size", str(plan.micro_batch),
        "--global-batch-size", str(plan.global_batch),
        "--seq-length", str(plan.seq_len),
        "--max-position-embeddings", str(plan.seq_len),
        "--num-layers", str(model.layers),
        "--hidden-size", str(model.hidden),
        "--ffn-hidden-size", str(model.ffn_hidden),
        "--num-attention-heads", str(model.heads),
        "--bf16",
    ]
    if model.query_groups != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.query_groups)]
    if model.mlp == "swiglu":
        args += ["--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
    if max(tps) > 1:
        args += ["--sequence-parallel"]
    if plan.pp > 1 and len({st.layers for st in plan.stages}) > 1:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(plan)]
    rc, rc_notes = _recompute_args(plan)
    return args + rc, notes + rc_notes


def render_megatron(plan: Plan, model: ModelArch) -> str:
    args, notes = megatron_args(plan, model)
    lines = [f"# Megatron-LM arguments for {plan.model} on {plan.cluster} (dp={plan.dp}: world size = "
             f"{plan.gpus_used} GPUs)"]
    lines += [f"# NOTE: {n}" for n in notes]
    pairs, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    lines.append(" \\\n  ".join(["torchrun ... pretrain_gpt.py", *pairs]))
    return "\n".join(lines) + "\n"
