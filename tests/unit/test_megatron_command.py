"""megatron.sh is a launchable pretrain_gpt.py command: every argument is one Megatron-LM knows, with a
valid value (an argparse parser built from tests/fixtures/megatron_arguments.json, written from
Megatron-LM's arguments.py), the combinations Megatron requires hold, and the script runs torchrun
with those arguments once its placeholders are set."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.plan import Plan, Stage
from memx.report.megatron import megatron_command, pipeline_layout, render_megatron
from tests.support.launch_checks import batch_problems, parse, rule_problems, script_args

PLACEHOLDER_VALUES = {"DATA_PATH": "/data/corpus_text_document", "TOKENIZER_MODEL": "meta-llama/Llama-2-7b-hf",
                      "CHECKPOINT_DIR": "/ckpt", "VOCAB_FILE": "/tok/vocab.json", "MERGE_FILE": "/tok/merges.txt"}


def plan(stages, *, dp=1, mb=1, gb=16, seq=4096, model="llama2-7b", cluster="three-vendor-20", **options) -> Plan:
    return Plan(model=model, cluster=cluster, global_batch=gb, micro_batch=mb, seq_len=seq, dp=dp,
                stages=tuple(Stage(gpu=g, tp=t, layers=n, recompute=rc, recompute_layers=rl)
                             for g, t, n, rc, rl in stages), **options)


A100 = "a100-80g"
CASES = {
    "even-llama-gqa-do-sp": ("llama2-70b", plan([(A100, 8, 40, "none", None)] * 2, dp=2, model="llama2-70b",
                                                 distributed_optimizer=True, sequence_parallel=True)),
    "first-last-selective": ("llama2-7b", plan([(A100, 2, 12, "selective", None), (A100, 2, 10, "selective", None),
                                                (A100, 2, 10, "selective", None)])),
    "middle-uneven-layout-block": ("llama2-7b", plan([(A100, 1, 8, "full", 3), (A100, 1, 12, "full", 3),
                                                      (A100, 1, 7, "full", 3), (A100, 1, 5, "full", 3)],
                                                     sequence_parallel=True)),
    "gpt-tied-full": ("gpt2-1024", plan([(A100, 4, 24, "full", None)], seq=1024, model="gpt2-1024")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_command_parses_against_megatron_arguments(case):
    model_name, p = CASES[case]
    script = render_megatron(p, load_model(model_name))
    args = script_args(script)
    assert rule_problems(args) == []
    ns = parse(args)
    model = load_model(model_name)
    assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads) == (
        model.layers, model.hidden, model.ffn_hidden, model.heads)
    assert ns.tensor_model_parallel_size == max(s.tp for s in p.stages) and ns.pipeline_model_parallel_size == p.pp
    assert (ns.micro_batch_size, ns.global_batch_size, ns.seq_length) == (p.micro_batch, p.global_batch, p.seq_len)
    assert batch_problems(ns, world=p.gpus_used) == []
    assert ns.bf16 and ns.use_distributed_optimizer == p.distributed_optimizer
    assert ns.sequence_parallel == (p.sequence_parallel and ns.tensor_model_parallel_size > 1)
    assert ns.data_path == ["${DATA_PATH}"] and ns.save == ns.load == "${CHECKPOINT_DIR}"


def test_llama_arguments_rope_swiglu_rmsnorm_gqa_untied():
    ns = parse(script_args(render_megatron(CASES["even-llama-gqa-do-sp"][1], load_model("llama2-70b"))))
    assert ns.position_embedding_type == "rope" and ns.swiglu and ns.normalization == "RMSNorm"
    assert ns.add_bias_linear is False and ns.untie_embeddings_and_output_weights
    assert ns.group_query_attention and ns.num_query_groups == 8
    assert ns.attention_dropout == ns.hidden_dropout == 0.0
    assert ns.tokenizer_type == "HuggingFaceTokenizer" and ns.tokenizer_model == "${TOKENIZER_MODEL}"
    assert ns.use_flash_attn  # A100: NVIDIA Ampere


def test_gpt_arguments_learned_positions_layernorm_tied_gpt2_tokenizer():
    ns = parse(script_args(render_megatron(CASES["gpt-tied-full"][1], load_model("gpt2-1024"))))
    assert ns.position_embedding_type == "learned_absolute" and not ns.swiglu and ns.normalization == "LayerNorm"
    assert not ns.untie_embeddings_and_output_weights and not ns.group_query_attention and ns.num_query_groups is None
    assert ns.tokenizer_type == "GPT2BPETokenizer" and ns.vocab_file == "${VOCAB_FILE}"
    assert (ns.recompute_granularity, ns.recompute_method, ns.recompute_num_layers) == ("full", "uniform", 1)


def test_uneven_splits_use_first_last_or_the_layout():
    ns = parse(script_args(render_megatron(CASES["first-last-selective"][1], load_model("llama2-7b"))))
    assert (ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers) == (12, 10)
    assert ns.pipeline_model_parallel_layout is None and ns.recompute_granularity == "selective"
    p = CASES["middle-uneven-layout-block"][1]
    cmd = megatron_command(p, load_model("llama2-7b"))
    ns = parse(list(cmd.args))
    assert ns.pipeline_model_parallel_layout == pipeline_layout(p) == "Et*8|t*12|t*7|t*5,L"
    assert ns.decoder_first_pipeline_num_layers is None and any("Megatron Core ≥ 0.13" in n for n in cmd.notes)
    assert (ns.recompute_method, ns.recompute_num_layers) == ("block", 3)
    assert not ns.sequence_parallel and any("no-op at tp = 1" in n for n in cmd.notes)


def test_what_stock_megatron_cannot_start_is_refused_not_emitted():
    p = plan([(A100, 2, 12, "none", None), ("vendor-b-32g", 4, 10, "full", None), ("vendor-c-32g", 4, 10, "full", 6)],
             dp=2, gb=128, mb=2)
    cmd = megatron_command(p, load_model("llama2-7b"), load_cluster("three-vendor-20"))
    text = " ".join(cmd.problems)
    for needle in ("different tensor-parallel sizes", "4 × 3 × 2 = 24 ≠ 20 GPUs", "per-stage recomputation", "GPU vendors"):
        assert needle in text
    assert "stage 1 → vendor-b-32g" in " ".join(cmd.notes) and "--use-flash-attn" not in cmd.args
    script = render_megatron(p, load_model("llama2-7b"), load_cluster("three-vendor-20"), nearest="a100-80g×2 [16,16]")
    assert not any(line.startswith(("torchrun", "pretrain_gpt.py")) for line in script.splitlines())
    assert "# CANNOT START: stages use different" in script and "# Nearest plan stock Megatron-LM runs: a100" in script
    assert script.rstrip().endswith("exit 1")
    bare = render_megatron(p, load_model("llama2-7b"), load_cluster("three-vendor-20"))
    assert "--search megatron" in bare and "--format flagscale" in bare


def test_llama3_gets_its_rotary_base_and_precision_flags_follow_the_plan():
    p = plan([("h100-80g", 8, 16, "none", None)] * 2, model="llama3-8b", cluster="h100-mi300x-32", seq=8192)
    ns = parse(list(megatron_command(p, load_model("llama3-8b")).args))
    assert ns.rotary_base == 500000 and ns.bf16 and not ns.fp16
    assert parse(list(megatron_command(CASES["first-last-selective"][1], load_model("llama2-7b")).args)).rotary_base == 10000
    for precision, check in (("fp16", lambda n: n.fp16 and not n.bf16 and n.initial_loss_scale == 2.0**32
                                      and n.loss_scale is None and n.hysteresis == 2),
                             ("fp8", lambda n: n.bf16 and n.fp8 == "hybrid")):
        fake = type("P", (), {"precision": precision})()  # a plan carrying `precision` (helper B1's field)
        from memx.report.megatron import precision_args
        args = BASE + precision_args(fake)
        assert rule_problems(args) == [] and check(parse(args)), precision


def test_flash_attention_only_on_ampere_or_newer_nvidia():
    old = plan([("v100-32g", 2, 32, "none", None)], cluster="v100-t4-6")
    amd = plan([("mi300x-192g", 8, 32, "none", None)], cluster="h100-mi300x-32")
    assert "--use-flash-attn" not in megatron_command(old, load_model("llama2-7b")).args
    amd_cmd = megatron_command(amd, load_model("llama2-7b"))
    assert "--use-flash-attn" not in amd_cmd.args and any("ROCm" in n for n in amd_cmd.notes)
    h100 = plan([("h100-80g", 8, 32, "none", None)], cluster="h100-mi300x-32")
    assert "--use-flash-attn" in megatron_command(h100, load_model("llama2-7b")).args


BASE = ["--num-layers", "32", "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "1",
        "--seq-length", "8", "--max-position-embeddings", "8"]


@pytest.mark.parametrize("bad", [["--use-flash-attention"],   # not a Megatron argument
                                 ["--num-layer", "32"]])      # abbreviations are off in Megatron's parser
def test_unknown_flags_are_rejected(bad):
    with pytest.raises(ValueError, match="unknown"):
        rule_problems(BASE + bad)


@pytest.mark.parametrize("bad, needle", [
    (["--num-query-groups", "8"], "--group-query-attention"),  # GQA groups without GQA are ignored by Megatron
    (["--recompute-granularity", "full"], "--recompute-method"),
    (["--recompute-granularity", "selective", "--recompute-method", "block"], "--recompute-granularity=full"),
    (["--pipeline-model-parallel-layout", "Et*16|t*16,L", "--decoder-first-pipeline-num-layers", "16"], "excludes"),
    (["--sequence-parallel"], "--tensor-model-parallel-size>1"),
    (["--pipeline-model-parallel-layout", "Et*16|t*15,L"], "layout"),
    (["--decoder-first-pipeline-num-layers", "5", "--pipeline-model-parallel-size", "3"], "middle layers"),
])
def test_required_combinations_are_checked(bad, needle):
    problems = rule_problems(BASE + bad)
    assert any(needle in p for p in problems), problems


def test_bad_values_are_rejected():
    with pytest.raises(argparse.ArgumentError):
        parse(["--normalization", "BatchNorm"])
    with pytest.raises(argparse.ArgumentError):
        parse(["--tensor-model-parallel-size", "two"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_stops_on_missing_placeholders_and_runs_torchrun_when_set(tmp_path):
    p, model = CASES["even-llama-gqa-do-sp"][1], load_model("llama2-70b")
    script = tmp_path / "megatron.sh"
    script.write_text(render_megatron(p, model))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    bare = {"PATH": os.environ["PATH"]}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=bare, cwd=tmp_path)
    assert out.returncode != 0 and "DATA_PATH" in out.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\necho "$CUDA_DEVICE_MAX_CONNECTIONS" > "$ENV_OUT"\n')
    (fake / "torchrun").chmod(0o755)
    env = {**bare, **PLACEHOLDER_VALUES, "PATH": f"{fake}:{os.environ['PATH']}",
           "ARGS_OUT": str(tmp_path / "args"), "ENV_OUT": str(tmp_path / "env")}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    argv = (tmp_path / "args").read_text().splitlines()
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    ns = parse(argv[argv.index("pretrain_gpt.py") + 1:])
    assert ns.data_path == [PLACEHOLDER_VALUES["DATA_PATH"]] and ns.load == "/ckpt"
    assert (tmp_path / "env").read_text().strip() == "1"  # Megatron asserts it with tp > 1


def _grouped():
    from memx.domain.groups import GroupedPlan, ReplicaGroup

    fast = ReplicaGroup(dp=1, micro_batch=2, micro_batches=24, stages=(Stage(gpu=A100, tp=4, layers=32),))
    slow = ReplicaGroup(dp=2, micro_batch=1, micro_batches=40,
                        stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16, recompute="selective"),
                                Stage(gpu="vendor-c-32g", tp=4, layers=16, recompute="full")))
    return GroupedPlan(model="llama2-7b", cluster="three-vendor-20", global_batch=128, seq_len=4096, groups=(fast, slow))


def test_schema_two_plan_gets_the_note_and_each_groups_arguments_as_comments(tmp_path):
    from memx.domain.groups import as_grouped, group_plans
    from memx.report.megatron import HETEROGENEOUS_DP_NOTE

    p, model = _grouped(), load_model("llama2-7b")
    script = render_megatron(p, model, load_cluster("three-vendor-20"))
    assert f"# NOTE: {HETEROGENEOUS_DP_NOTE}" in script and "Sailor" in script and "Whale" in script
    assert not any(line.startswith(("torchrun", "pretrain_gpt.py")) for line in script.splitlines())
    blocks = script.split("\n#\n# group ")[1:]
    assert len(blocks) == 2
    for block, gp in zip(blocks, group_plans(p)):
        args = shlex.split(" ".join(line[4:] for line in block.splitlines() if line.startswith("#   --")))
        assert rule_problems(args) == []
        ns = parse(args)
        assert (ns.micro_batch_size, ns.global_batch_size, ns.pipeline_model_parallel_size) == (gp.micro_batch, gp.global_batch, gp.pp)
    assert "#   NOTE: stages run on different GPU types" in blocks[1]
    if shutil.which("bash"):
        path = tmp_path / "megatron.sh"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
        run = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert run.returncode == 1 and "stock Megatron-LM cannot run it" in run.stderr
    # a one-group schema-2 plan is the schema-1 plan it equals: the same launchable script
    one = CASES["first-last-selective"][1]
    assert render_megatron(as_grouped(one), model) == render_megatron(one, model)


def test_interleaved_plans_carry_the_virtual_pipeline_arguments():
    """Issue #27: an even split gives --num-layers-per-virtual-pipeline-stage; an uneven one the layout of the
    pp·v virtual stages (Megatron-LM arguments.py: the two are exclusive); a block recompute is per chunk."""
    even = plan([(A100, 1, 16, "full", 8)] * 2, gb=8, virtual_stages=2)
    ns = parse(list(megatron_command(even, load_model("llama2-7b")).args))
    assert ns.num_layers_per_virtual_pipeline_stage == 8 and ns.pipeline_model_parallel_layout is None
    assert (ns.recompute_method, ns.recompute_num_layers) == ("block", 4)
    uneven = plan([(A100, 1, 12, "none", None), (A100, 1, 20, "none", None)], gb=8, virtual_stages=2)
    ns = parse(list(megatron_command(uneven, load_model("llama2-7b")).args))
    assert ns.pipeline_model_parallel_layout == "Et*6|t*10|t*6|t*10,L"
    assert ns.num_layers_per_virtual_pipeline_stage is None and ns.decoder_first_pipeline_num_layers is None
def test_nearest_launchable_is_the_first_listed_plan_megatron_starts():
    from memx.domain.plan import plan_to_dict
    from memx.report.megatron import nearest_launchable

    mixed = plan([(A100, 2, 16, "none", None), ("vendor-b-32g", 4, 16, "none", None)])
    even = plan([(A100, 2, 16, "none", None)] * 2)

    def entry(p, ms):
        return {"plan": plan_to_dict(p), "predicted": {"iteration_time_ms": ms, "min_margin": 0.2}}

    obj = {**entry(mixed, 100.0), "top": [entry(mixed, 100.0), entry(even, 150.0)], "fastest": None, "pareto": []}
    line = nearest_launchable(obj, load_model("llama2-7b"), load_cluster("three-vendor-20"))
    assert line.startswith("a100-80g×2 [16,16]") and "150 ms" in line and "20.0%" in line
    obj["top"] = obj["top"][:1]
    assert nearest_launchable(obj, load_model("llama2-7b"), load_cluster("three-vendor-20")) is None


@pytest.mark.parametrize("model_name,ep,shared", [("mixtral-8x7b", 4, None), ("qwen1.5-moe-a2.7b", 2, 5632)])
def test_moe_arguments_parse_and_carry_the_experts(model_name, ep, shared):
    """Issue #27: a MoE plan's command names its experts, top-k, sizes and ep (fixture: Megatron-LM arguments)."""
    model = load_model(model_name)
    p = plan([("h100-80g", 2, model.layers // 2, "none", None)] * 2,
             dp=4, gb=64, model=model_name, cluster="h100-mi300x-32", sequence_parallel=True,
             distributed_optimizer=True, expert_parallel=ep)
    args = script_args(render_megatron(p, model))
    assert rule_problems(args) == []
    ns = parse(args)
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == (
        model.num_experts, model.moe_router_topk, model.expert_ffn_hidden)
    assert ns.moe_shared_expert_intermediate_size == shared and ns.expert_model_parallel_size == ep
    assert ns.num_experts % ns.expert_model_parallel_size == 0 and ns.moe_token_dispatcher_type == "alltoall"
    assert "--num-experts" not in script_args(render_megatron(CASES["gpt-tied-full"][1], load_model("gpt2-1024")))


def test_moe_first_dense_layers_become_a_layer_pattern():
    import dataclasses

    model = dataclasses.replace(load_model("qwen1.5-moe-a2.7b"), moe_first_dense_layers=1)
    p = plan([("h100-80g", 2, 12, "none", None)] * 2, dp=4, gb=64, model=model.name, cluster="h100-mi300x-32",
             sequence_parallel=True, expert_parallel=4)
    ns = parse(script_args(render_megatron(p, model)))
    assert ns.moe_layer_freq == "([0]*1+[1]*23)"  # Megatron's moe_freq_type: 1 dense layer, then 23 MoE layers


def test_moe_with_context_parallel_arguments():
    """Issue #27: cp and ep together — ep 4 divides dp × cp = 2 × 2, not dp; the command carries both sizes and the
    world size splits into expert tp × ep × pp (Megatron's expert grid spans dp × cp, core/parallel_state.py)."""
    model = load_model("mixtral-8x7b")
    p = plan([("h100-80g", 2, model.layers // 2, "none", None)] * 2, dp=2, gb=32, model="mixtral-8x7b",
             cluster="h100-mi300x-32", sequence_parallel=True, distributed_optimizer=True, expert_parallel=4,
             context_parallel=2)
    args = script_args(render_megatron(p, model))
    assert rule_problems(args) == []
    ns = parse(args)
    assert (ns.context_parallel_size, ns.expert_model_parallel_size) == (2, 4)
    world = ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * ns.context_parallel_size * p.dp
    assert world == p.gpus_used and world % (ns.tensor_model_parallel_size * 4 * ns.pipeline_model_parallel_size) == 0
