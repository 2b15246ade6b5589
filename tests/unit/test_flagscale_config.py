"""flagscale.yaml is a config FlagScale's heterogeneous training starts: every key flattens to an argument its
parser knows, with a valid value, and every hetero rule FlagScale asserts holds (tests/fixtures/
flagscale_config.json, written by hand from FlagOpen/FlagScale's source); what FlagScale cannot express is
refused with the reason."""

from __future__ import annotations

import pytest
import yaml

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import NotLaunchable
from memx.domain.groups import GroupedPlan, ReplicaGroup
from memx.domain.plan import Plan, Stage
from memx.report.flagscale import FLAGSCALE_COMMIT, flagscale_config, flagscale_problems, meshes, render_flagscale
from tests.support.launch_checks import (FLAGSCALE, flagscale_args, flagscale_parser, flagscale_problems as fixture_problems,
                                         hetero_problems, hostfile_problems, world_of)


def plan(stages, *, dp=1, mb=1, gb=16, seq=4096, model="llama2-7b", cluster="three-vendor-20", **options) -> Plan:
    return Plan(model=model, cluster=cluster, global_batch=gb, micro_batch=mb, seq_len=seq, dp=dp,
                stages=tuple(Stage(gpu=g, tp=t, layers=n, recompute=rc, recompute_layers=rl)
                             for g, t, n, rc, rl in stages), **options)


A100, B, C = "a100-80g", "vendor-b-32g", "vendor-c-32g"
THREE = plan([(A100, 2, 12, "none", None), (B, 4, 10, "full", None), (C, 4, 10, "full", 6)], dp=2, gb=128, mb=2,
             distributed_optimizer=True, sequence_parallel=True)


def rendered(p, model="llama2-7b", cluster="three-vendor-20"):
    text = render_flagscale(p, load_model(model), load_cluster(cluster))
    return text, yaml.safe_load(text)


def test_fixture_is_flagscales_commit():
    assert FLAGSCALE["commit"] == FLAGSCALE_COMMIT


def test_three_vendor_plan_is_one_mesh_per_type_with_per_stage_recompute():
    text, cfg = rendered(THREE)
    assert fixture_problems(cfg, world=THREE.gpus_used) == [] and hostfile_problems(text, cfg) == []
    hetero = cfg["train"]["system"]["hetero"]
    assert hetero["hetero_process_meshes"] == [2, 1, 1, 2, 1, 4, 1, 1, 2, 1, 4, 1, 1, 2, 1]
    assert hetero["hetero_device_types"] == [A100, B, C] and hetero["hetero_pipeline_layer_split"] == [12, 10, 10]
    assert world_of(cfg) == THREE.gpus_used == 20
    rc = cfg["train"]["system"]["recompute"]
    assert rc["recompute_granularity_per_stage_micro_batch"] == [[1, 32, 0], [1, 32, 1], [1, 32, 1]]
    assert rc["recompute_method_per_stage_micro_batch"] == [[1, 32, 0], [1, 32, 0], [1, 32, 1]]
    assert rc["recompute_num_layers_per_stage_micro_batch"][2] == [1, 32, 6]
    ns = flagscale_parser().parse_args(flagscale_args(cfg))
    assert ns.distributed_backend == "flagcx" and ns.bf16 and ns.sequence_parallel and ns.use_distributed_optimizer
    assert ns.data_path == ["${oc.env:DATA_PATH}"] and ns.tokenizer_model == "${oc.env:TOKENIZER_MODEL}"
    assert cfg["experiment"]["runner"]["hostfile"] == "${oc.env:HOSTFILE}"
    assert "python run.py --config-path" in text and "action=run" in text


def test_model_fields_and_uniform_settings():
    p = plan([("h100-80g", 8, 40, "selective", None), ("mi300x-192g", 8, 40, "selective", None)], model="llama3-70b",
             cluster="h100-mi300x-32", seq=8192, gb=64)
    _, cfg = rendered(p, "llama3-70b", "h100-mi300x-32")
    assert fixture_problems(cfg, world=p.gpus_used) == []
    m = cfg["train"]["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_query_groups"], m["rotary_base"]) == (80, 8192, 8, 500000)
    assert m["group_query_attention"] and m["swiglu"] and m["normalization"] == "RMSNorm"
    assert cfg["train"]["system"]["recompute"] == {"recompute_granularity": "selective"}
    g = plan([(A100, 4, 24, "full", None)], seq=1024, model="gpt2-1024", cluster="a100-v100-16")
    _, cfg = rendered(g, "gpt2-1024", "a100-v100-16")
    assert fixture_problems(cfg, world=g.gpus_used) == []
    assert "untie_embeddings_and_output_weights" not in cfg["train"]["model"]
    assert cfg["train"]["data"]["tokenizer"]["tokenizer_type"] == "GPT2BPETokenizer"


def test_precision_follows_the_plan():
    fake = type("P", (Plan,), {})  # a Plan subclass carrying `precision` (helper B1's field) as an attribute
    for precision, want in (("fp16", {"fp16": True, "initial_loss_scale": 4294967296}),
                            ("fp8", {"bf16": True, "fp8_format": "hybrid"})):
        p = fake(**{f: getattr(THREE, f) for f in ("model", "cluster", "global_batch", "micro_batch", "seq_len", "dp",
                                                   "stages", "distributed_optimizer", "sequence_parallel")})
        object.__setattr__(p, "precision", precision)
        cfg = flagscale_config(p, load_model("llama2-7b"), load_cluster("three-vendor-20"))
        assert want.items() <= cfg["train"]["system"]["precision"].items()
        assert fixture_problems(cfg, world=p.gpus_used) == [], precision


@pytest.mark.parametrize("p, model, needle", [
    (plan([(A100, 2, 16, "selective", None), (B, 4, 16, "full", None)]), "llama2-7b", "selective recomputation"),
    (plan([(A100, 2, 12, "none", None), (B, 4, 12, "none", None)], model="gpt2-1024", seq=1024), "gpt2-1024",
     "tied embeddings"),
    (GroupedPlan(model="llama2-7b", cluster="three-vendor-20", global_batch=128, seq_len=4096, groups=(
        ReplicaGroup(dp=1, micro_batch=2, micro_batches=24, stages=(Stage(gpu=A100, tp=4, layers=32),)),
        ReplicaGroup(dp=2, micro_batch=1, micro_batches=40, stages=(Stage(gpu=B, tp=4, layers=16),
                                                                    Stage(gpu=C, tp=4, layers=16))))),
     "llama2-7b", "replica groups"),
    (plan([(A100, 2, 16, "none", None), (B, 4, 16, "none", None)], gb=8, virtual_stages=2), "llama2-7b",
     "interleaved 1F1B"),
])
def test_what_flagscale_cannot_express_is_refused(p, model, needle):
    assert any(needle in x for x in flagscale_problems(p, load_model(model)))
    with pytest.raises(NotLaunchable, match=needle):
        flagscale_config(p, load_model(model))


def test_meshes_merge_consecutive_stages_of_one_type():
    p = plan([(A100, 2, 8, "none", None)] * 2 + [(B, 4, 8, "none", None)] * 2)
    assert [(m.gpu, m.stages) for m in meshes(p)] == [(A100, 2), (B, 2)]


@pytest.mark.parametrize("change, rule", [
    (lambda h, s, m: h.update(hetero_process_meshes=h["hetero_process_meshes"][:-1]), "meshes_format"),
    (lambda h, s, m: h.update(hetero_pipeline_layer_split=[12, 10, 9]), "layer_split"),
    (lambda h, s, m: h.update(hetero_device_types=[A100, B]), "device_types"),
    (lambda h, s, m: h.update(hetero_current_device_type="h100-80g"), "device_types"),
    (lambda h, s, m: s.update(pipeline_model_parallel_size=4), "pp_sum"),
    (lambda h, s, m: h.update(standalone_embedding_stage=True), "no_standalone_embedding"),
    (lambda h, s, m: m.pop("untie_embeddings_and_output_weights"), "tied_ends"),
    (lambda h, s, m: s["recompute"]["recompute_granularity_per_stage_micro_batch"].pop(), "recompute_per_stage"),
    (lambda h, s, m: s["recompute"].update(recompute_granularity="selective"), "recompute_per_stage"),
    (lambda h, s, m: m.update(global_batch_size=130), "batch"),
])
def test_the_fixture_catches_each_rule(change, rule):
    cfg = flagscale_config(THREE, load_model("llama2-7b"), load_cluster("three-vendor-20"))
    system = cfg["train"]["system"]
    change(system["hetero"], system, cfg["train"]["model"])
    args = flagscale_args(cfg)
    ns, unknown = flagscale_parser().parse_known_args(args)
    assert not unknown and rule in hetero_problems(ns, THREE.gpus_used)


def test_unknown_keys_and_a_wrong_world_are_caught():
    cfg = flagscale_config(THREE, load_model("llama2-7b"), load_cluster("three-vendor-20"))
    assert "world_size" in fixture_problems(cfg, world=24)
    cfg["train"]["model"]["rope_theta"] = 500000  # Hugging Face's name, not an argument
    assert any("unknown" in p for p in fixture_problems(cfg, world=20))


def test_unset_placeholders_stop_with_a_clear_message(monkeypatch):
    omegaconf = pytest.importorskip("omegaconf")  # FlagScale's config library; not a MemX dependency
    _, cfg = rendered(THREE)
    for name in ("DATA_PATH", "TOKENIZER_MODEL", "CHECKPOINT_DIR", "HOSTFILE"):
        monkeypatch.delenv(name, raising=False)
    conf = omegaconf.OmegaConf.create(cfg)
    with pytest.raises(Exception, match="Environment variable '(HOSTFILE|DATA_PATH|TOKENIZER_MODEL|CHECKPOINT_DIR)' not found"):
        omegaconf.OmegaConf.to_container(conf, resolve=True)
    for name in ("DATA_PATH", "TOKENIZER_MODEL", "CHECKPOINT_DIR", "HOSTFILE"):
        monkeypatch.setenv(name, f"/x/{name}")
    assert omegaconf.OmegaConf.to_container(conf, resolve=True)["train"]["data"]["data_path"] == "/x/DATA_PATH"


def test_moe_plan_sets_ep_in_every_mesh_and_the_expert_keys():
    """Issue #27: ep goes into every process mesh [tp, cp, ep, dp, pp] (FlagScale's ProcessMesh takes it per
    mesh) and the model block carries the experts (keys of FlagScale's examples/mixtral, deepseek_v3 configs)."""
    p = plan([("h100-80g", 4, 16, "none", None), ("mi300x-192g", 4, 16, "none", None)], model="mixtral-8x7b",
             cluster="h100-mi300x-32", dp=4, gb=64, sequence_parallel=True, distributed_optimizer=True, expert_parallel=2)
    text, cfg = rendered(p, model="mixtral-8x7b", cluster="h100-mi300x-32")
    assert fixture_problems(cfg, world=p.gpus_used) == [] and hostfile_problems(text, cfg) == []
    assert cfg["train"]["system"]["hetero"]["hetero_process_meshes"] == [4, 1, 2, 4, 1, 4, 1, 2, 4, 1]
    assert cfg["train"]["system"]["expert_model_parallel_size"] == 2
    model = cfg["train"]["model"]
    assert (model["num_experts"], model["moe_router_topk"], model["moe_ffn_hidden_size"]) == (8, 2, 14336)
