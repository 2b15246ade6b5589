"""The virtual cluster models the distributed optimizer and sequence parallelism (issue #14).

Hand calculations, each with its source:
- distributed optimizer: static bytes/param = 6 + 12/dp for bf16 params with fp32 main grads, 18 without
  (Megatron-LM docs, "Distributed Optimizer" table; ZeRO-1, Rajbhandari et al. 2020 §5); the DP step is a
  reduce-scatter of fp32 grads + an all-gather of bf16 params (same docs, key steps), ring costs
  (r−1)/r·bytes + (r−1) steps each (Patarasuk & Yuan 2009); the Adam step touches 1/dp of the states.
- sequence parallelism: activations sbh(34/t + 5as/(ht)) per layer instead of sbh(10 + 24/t + 5as/(ht))
  (Korthikanti et al. 2022 §4.2.2, Table 2); each TP all-reduce becomes reduce-scatter + all-gather (same ring
  bytes and steps), norms/dropouts work on s/t tokens, the backward re-gathers two saved inputs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.plan import Plan, Stage, plan_from_json
from memx.simulator import load_traits, measure_stages, sample_plans, signature_from_dict, simulate_plan, stage_cost
from memx.simulator.physics import Device, adam_step_ms, layer_cost
from memx.simulator.sample import draw_plans
from memx.simulator.schedule import stage_signatures
from memx.simulator.stage import MIB

GIB = 1024.0
LLAMA = dict(hidden=4096, ffn_hidden=11008, heads=32, query_groups=32, vocab=32000, mlp="swiglu")
GPT22B = dict(hidden=6144, ffn_hidden=4 * 6144, heads=64, query_groups=64, vocab=51200, mlp="gelu")


def sig(**over):
    base = dict(gpu="a100-80g", tp=2, layers=2, micro_batch=1, seq_len=4096, recompute="none",
                recompute_layers=None, first=False, last=False, inflight=2, **LLAMA)
    base.update(over)
    return signature_from_dict(base)


def cost(traits=None, **over):
    return stage_cost(sig(**over), load_gpu("a100-80g"), traits or load_traits("a100-80g"))


# ---------------------------------------------------------------- signature fields


def test_signature_options_default_to_what_older_signatures_meant():
    s = sig()
    assert (s.distributed_optimizer, s.dp, s.sequence_parallel) == (False, 1, False)
    assert cost(distributed_optimizer=False, dp=1, sequence_parallel=False) == cost()


@pytest.mark.parametrize("field,value", [("dp", 0), ("distributed_optimizer", "yes"), ("sequence_parallel", 1)])
def test_bad_option_names_the_field(field, value):
    with pytest.raises(InputError, match=f"'{field}'"):
        sig(**{field: value})


def test_stage_runs_record_the_options():
    base = sig().to_dict()
    df = measure_stages([base, {**base, "distributed_optimizer": True, "dp": 4},
                         {**base, "sequence_parallel": True, "tp": 1}], seed=0)
    assert list(df.dp) == [1, 4, 1] and list(df.distributed_optimizer) == [False, True, False]
    assert list(df.sequence_parallel) == [False, False, False]  # a no-op at tp 1: recorded canonical
    assert df.static_mem_mib[1] < df.static_mem_mib[0]


# ---------------------------------------------------------------- distributed optimizer


def test_distributed_optimizer_static_memory_is_6_plus_12_over_dp_bytes_per_param():
    plain, do4 = cost(), cost(distributed_optimizer=True, dp=4)
    assert plain.params == do4.params
    assert plain.static_mem_mib == pytest.approx(plain.params * 18 / MIB)
    assert do4.static_mem_mib == pytest.approx(plain.params * (2 + 4 + (4 + 4 + 4) / 4) / MIB)  # 9 B/param
    assert cost(distributed_optimizer=True, dp=1).static_mem_mib == pytest.approx(plain.static_mem_mib)
    assert cost(dp=4).static_mem_mib == pytest.approx(plain.static_mem_mib)  # dp alone shards nothing


def test_distributed_optimizer_with_the_optimizer_offloaded_has_nothing_to_shard():
    s = sig(distributed_optimizer=True, dp=8)
    offloaded = stage_cost(s, load_gpu("a100-80g"), load_traits("a100-80g"), 4.0)
    assert offloaded.static_mem_mib == pytest.approx(offloaded.params * 4 / MIB)


def test_distributed_optimizer_steps_only_its_shard():
    dev = Device.of(load_gpu("a100-80g"), load_traits("a100-80g"))
    plain, do4 = cost(), cost(distributed_optimizer=True, dp=4)
    assert plain.optimizer_ms == pytest.approx(adam_step_ms(dev, plain.params))
    assert do4.optimizer_ms == pytest.approx(adam_step_ms(dev, plain.params / 4))
    assert do4.time_ms == plain.time_ms  # forward/backward unchanged


def _one_node_cluster(tmp_path, gpu="a100-80g", count=8):
    path = tmp_path / "one-node.yaml"
    path.write_text(f"name: one-node\ninter_node_bandwidth_gbps: 25\nnodes:\n  - {{gpu: {gpu}, count: {count}}}\n")
    return load_cluster(str(path))


def test_dp_step_is_reduce_scatter_of_fp32_grads_plus_all_gather_of_bf16_params(tmp_path):
    cluster, model = _one_node_cluster(tmp_path), load_model("llama-6l")
    stages = (Stage(gpu="a100-80g", tp=2, layers=3), Stage(gpu="a100-80g", tp=2, layers=3))
    plain = Plan(model=model.name, cluster=cluster.name, global_batch=16, micro_batch=1, seq_len=1024, dp=2, stages=stages)
    do = dataclasses.replace(plain, distributed_optimizer=True)
    gpu, tr = load_gpu("a100-80g"), load_traits("a100-80g")
    bw = gpu.intra_node_bandwidth_gbps * 1e6 * tr.link_efficiency  # bytes/ms: both replicas on the one node
    lat, r = tr.collective_step_latency_ms, 2
    run_plain, run_do = simulate_plan(plain, cluster, model), simulate_plan(do, cluster, model)
    for s, sg in enumerate(stage_signatures(do, model)):
        p = stage_cost(sg, gpu, tr).params
        allreduce = 2 * (r - 1) / r * 4 * p / bw + 2 * (r - 1) * lat
        rs_ag = (r - 1) / r * 4 * p / bw + (r - 1) * lat + (r - 1) / r * 2 * p / bw + (r - 1) * lat
        assert run_plain.dp_allreduce_ms[s] == pytest.approx(allreduce)
        assert run_do.dp_allreduce_ms[s] == pytest.approx(rs_ag)
        assert run_do.optimizer_ms[s] == pytest.approx(run_plain.optimizer_ms[s] / 2, rel=0.02)  # + fixed launches
    assert max(run_do.peak_mem_mib) < max(run_plain.peak_mem_mib)
    assert run_do.iteration_time_ms < run_plain.iteration_time_ms


# ---------------------------------------------------------------- sequence parallelism


def _gpt22b(**over):
    """Korthikanti 2022's 22B layer (h 6144, a 64, s 2048, b 4, t 8), eager attention with dropout."""
    traits = dataclasses.replace(load_traits("a100-80g"), flash_attention=False)
    s = sig(tp=8, layers=1, micro_batch=4, seq_len=2048, inflight=1, **{**GPT22B, **over})
    return stage_cost(s, load_gpu("a100-80g"), traits), s, traits


def test_sequence_parallel_activations_follow_korthikanti_table2():
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    tp_only, _, _ = _gpt22b()
    tp_sp, _, _ = _gpt22b(sequence_parallel=True)
    assert tp_only.act_mem_mib == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) / MIB, rel=1e-9)
    assert tp_sp.act_mem_mib == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)) / MIB, rel=1e-9)
    sel_sp, _, _ = _gpt22b(sequence_parallel=True, recompute="selective")
    assert sel_sp.act_mem_mib == pytest.approx(s * b * h * 34 / t / MIB, rel=1e-9)  # Table 2: SP + selective


def test_sequence_parallel_keeps_the_ring_bytes_and_adds_collectives():
    _, s_sp, traits = _gpt22b(sequence_parallel=True)
    gpu = load_gpu("a100-80g")
    dev = Device.of(gpu, traits)
    plain, sp = layer_cost(dev, dataclasses.replace(s_sp.dims(), sequence_parallel=False)), layer_cost(dev, s_sp.dims())
    t, nbytes = 8, 2 * 4 * 2048 * 6144  # b·s·h bf16
    half = (t - 1) / t * nbytes / dev.link_bytes_per_ms + (t - 1) * traits.collective_step_latency_ms
    assert plain.comm_ms == pytest.approx(2 * 2 * half)  # two all-reduces = two (reduce-scatter + all-gather)
    assert sp.comm_ms == pytest.approx(plain.comm_ms + 2 * traits.kernel_launch_overhead_ms)  # one more kernel each
    assert sp.regather_ms == pytest.approx(2 * half) and plain.regather_ms == 0.0
    assert sp.fwd_kernels == plain.fwd_kernels + 2


def test_sequence_parallel_shards_norm_and_dropout_work():
    _, s_sp, traits = _gpt22b(sequence_parallel=True)
    dev = Device.of(load_gpu("a100-80g"), traits)
    plain, sp = layer_cost(dev, dataclasses.replace(s_sp.dims(), sequence_parallel=False)), layer_cost(dev, s_sp.dims())
    th, t = 4 * 2048 * 6144, 8
    # two norms (4 B/elt) + two bias-dropout-adds (6 B + 1 B mask per elt) run on s/t tokens
    saved = (2 * 4.0 + 2 * 7.0) * th * (1 - 1 / t) / dev.memory_bytes_per_ms
    assert plain.fwd_ms - (sp.fwd_ms - (sp.comm_ms - plain.comm_ms)) == pytest.approx(saved, rel=1e-9)


def test_sequence_parallel_is_a_no_op_at_tp_1():
    assert cost(tp=1, sequence_parallel=True) == cost(tp=1)


def test_sequence_parallel_ends_scatter_and_gather():
    emb, out = cost(layers=0, first=True, sequence_parallel=True), cost(layers=0, last=True, sequence_parallel=True)
    assert emb.act_mem_mib <= cost(layers=0, first=True).act_mem_mib
    assert out.act_mem_mib < cost(layers=0, last=True).act_mem_mib  # the norm and GEMM inputs kept as s/t shards


# ---------------------------------------------------------------- memory-bound cases become feasible


def _vendor_b(tmp_path, nodes: int):
    path = tmp_path / f"b32-{nodes}.yaml"
    path.write_text(f"name: b32-{8 * nodes}\ninter_node_bandwidth_gbps: 25\nnodes:\n"
                    + "".join("  - {gpu: vendor-b-32g, count: 8}\n" for _ in range(nodes)))
    return load_cluster(str(path))


def _llama70(cluster, tp, pp, dp, recompute, **options):
    return Plan(model="llama2-70b", cluster=cluster.name, global_batch=64, micro_batch=1, seq_len=4096, dp=dp,
                stages=tuple(Stage(gpu="vendor-b-32g", tp=tp, layers=80 // pp, recompute=recompute) for _ in range(pp)),
                **options)


def test_llama2_70b_cannot_fit_32_gpus_of_32_gb_with_or_without_the_distributed_optimizer(tmp_path):
    cluster, model = _vendor_b(tmp_path, 4), load_model("llama2-70b")
    # all model states: 18 B/param × 69.0 G params = 1156 GiB > 32 × 32 GiB; the distributed optimizer keeps
    # P/32·(6·dp + 12) B per GPU at tp·pp·dp = 32, never below its dp = 1 value 18·P/32 = 36.1 GiB
    params = sum(stage_cost(sg, cluster.gpu("vendor-b-32g"), load_traits("vendor-b-32g")).params * 8
                 for sg in stage_signatures(_llama70(cluster, 8, 4, 1, "full"), model))
    assert 18 * params / 2**30 > 32 * 32
    for do in (False, True):
        assert simulate_plan(_llama70(cluster, 8, 4, 1, "full", distributed_optimizer=do), cluster, model).oom


def test_llama2_70b_on_128_gpus_of_32_gb_fits_only_with_the_distributed_optimizer(tmp_path):
    cluster, model = _vendor_b(tmp_path, 16), load_model("llama2-70b")
    without = simulate_plan(_llama70(cluster, 8, 4, 4, "full"), cluster, model)
    with_do = simulate_plan(_llama70(cluster, 8, 4, 4, "full", distributed_optimizer=True), cluster, model)
    print(f"llama2-70b tp8 pp4 dp4 full on 128 × vendor-b-32g: {max(without.demand_mem_mib) / GIB:.1f} GiB without, "
          f"{max(with_do.demand_mem_mib) / GIB:.1f} GiB with the distributed optimizer, "
          f"{with_do.iteration_time_ms / 1000:.2f} s")
    assert without.oom and max(without.demand_mem_mib) > 45 * GIB
    assert not with_do.oom and max(with_do.peak_mem_mib) < 28 * GIB


def test_distributed_optimizer_and_sequence_parallel_make_selective_recompute_fit_and_win(tmp_path):
    cluster, model = _vendor_b(tmp_path, 16), load_model("llama2-70b")
    best_plain = simulate_plan(_llama70(cluster, 8, 8, 2, "full"), cluster, model)
    for do, sp in ((False, False), (True, False), (False, True)):
        assert simulate_plan(_llama70(cluster, 8, 8, 2, "selective", distributed_optimizer=do, sequence_parallel=sp),
                             cluster, model).oom
    both = simulate_plan(_llama70(cluster, 8, 8, 2, "selective", distributed_optimizer=True, sequence_parallel=True),
                         cluster, model)
    assert not best_plain.oom and not both.oom
    assert both.iteration_time_ms < 0.8 * best_plain.iteration_time_ms


# ---------------------------------------------------------------- sampling and the CLI


def test_sampling_draws_the_options_only_when_asked(conf_root):
    cluster, model, search = load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")
    default = draw_plans(cluster, model, search, n=20, seed=5)
    assert default == draw_plans(cluster, model, search, n=20, seed=5, distributed_optimizer=(False,),
                                 sequence_parallel=(False,))
    assert not any(p.distributed_optimizer or p.sequence_parallel for p in default)
    both = draw_plans(cluster, model, search, n=40, seed=5, distributed_optimizer=(False, True),
                      sequence_parallel=(False, True))
    assert {p.distributed_optimizer for p in both} == {False, True} and {p.sequence_parallel for p in both} == {False, True}
    df = sample_plans(cluster, model, search, n=6, seed=1, distributed_optimizer=(True,))
    assert all(plan_from_json(text).distributed_optimizer for text in df.plan)


def test_memx_simulate_reads_the_new_fields(tmp_path, conf_root):
    runner = CliRunner()
    stage = {**sig(distributed_optimizer=True, dp=4, sequence_parallel=True).to_dict()}
    res = runner.invoke(app, ["simulate", "stage"], input=json.dumps(stage))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["distributed_optimizer"] is True and out["dp"] == 4 and out["sequence_parallel"] is True
    assert out["static_mem_mib"] == pytest.approx(cost(distributed_optimizer=True, dp=4).static_mem_mib)
    plan = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 128, "micro_batch": 1, "seq_len": 4096,
            "dp": 2, "distributed_optimizer": True, "sequence_parallel": True,
            "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 10}, {"gpu": "vendor-b-32g", "tp": 4, "layers": 22}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    res = runner.invoke(app, ["simulate", "plan", str(path), "--cluster", "three-vendor-20", "--model", "llama2-7b"])
    assert res.exit_code == 0, res.output
    plain = simulate_plan(plan_from_json(json.dumps({**plan, "distributed_optimizer": False})),
                          load_cluster("three-vendor-20"), load_model("llama2-7b"))
    assert max(json.loads(res.stdout)["demand_mem_mib"]) < max(plain.demand_mem_mib)
