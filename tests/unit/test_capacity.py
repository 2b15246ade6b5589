"""Usable capacity (issue #27): nominal − driver reserve, read by every capacity check; predicted peaks hold no
reserve. The virtual cluster runs out of memory at its own nominal − reserve (conf/simulator)."""

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.plan import Plan, Stage
from memx.domain.runtime import load_runtime, usable_capacity_mib
from memx.domain.specs import Cluster, ModelArch, Node
from memx.planner.cost import MIB, AnalyticStageModel, stage_params_per_rank
from memx.planner.estimate import estimate_plans
from memx.planner.search import search
from memx.simulator import simulate_plan
from memx.simulator.schedule import stage_signatures
from memx.simulator.stage import stage_cost
from memx.simulator.traits import load_traits


def test_usable_capacity_is_nominal_less_the_catalog_driver_reserve():
    t4 = load_gpu("t4-16g")
    reserve = load_runtime("t4-16g", "nvidia").driver_reserved_mib  # 1475 MiB: PyTorch's 14.56 GiB on a T4 (ECC)
    assert usable_capacity_mib(t4) == 16 * 1024 - reserve == 14909
    prof = dataclasses.replace(load_runtime("t4-16g", "nvidia"), driver_reserved_mib=100.0)
    assert usable_capacity_mib(t4, prof) == 16 * 1024 - 100.0
    unknown = dataclasses.replace(t4, name="no-such-gpu", vendor="no-such-vendor")  # default.yaml's reserve
    assert usable_capacity_mib(unknown) == 16 * 1024 - load_runtime("default").driver_reserved_mib


def _one_stage_plan(gpu: str, layers: int) -> Plan:
    return Plan(model="llama-6l", cluster="c", global_batch=8, micro_batch=1, seq_len=2048, dp=1,
                stages=(Stage(gpu=gpu, tp=1, layers=layers),), precision="fp16")  # T4: no bf16


def test_a_plan_that_fits_only_the_nominal_memory_is_infeasible():
    """The estimate's feasibility, capacity and margin are all out of nominal − driver reserve: a GPU sized so that
    the plan's predicted peak lies between the two is infeasible even with no extra reserve."""
    model = load_model("llama-6l")
    t4 = load_gpu("t4-16g")
    probe = Cluster(name="c", inter_node_bandwidth_gbps=25.0, nodes=(Node(gpu=t4, count=1),))
    pred = AnalyticStageModel(gpus={t4.name: t4})
    plan = _one_stage_plan(t4.name, model.layers)
    peak = estimate_plans([plan], probe, model, pred, reserve_gib=0.0)[0].stage_peak_mib[0]
    reserve = load_runtime("t4-16g", "nvidia").driver_reserved_mib
    tight = dataclasses.replace(t4, memory_gib=(peak + reserve / 2) / 1024)  # peak < nominal, peak > usable
    cluster = dataclasses.replace(probe, nodes=(Node(gpu=tight, count=1),))
    m = estimate_plans([plan], cluster, model, AnalyticStageModel(gpus={t4.name: tight}), reserve_gib=0.0)[0]
    assert m.stage_peak_mib[0] == pytest.approx(peak) and peak < tight.memory_mib
    assert not m.feasible
    assert m.capacity_mib[0] == pytest.approx(tight.memory_mib - reserve)
    assert m.min_margin == pytest.approx((tight.memory_mib - reserve - peak) / (tight.memory_mib - reserve))
    assert m.min_margin < 0
    roomy = dataclasses.replace(t4, memory_gib=(peak + 2 * reserve) / 1024)
    cluster = dataclasses.replace(probe, nodes=(Node(gpu=roomy, count=1),))
    assert estimate_plans([plan], cluster, model, AnalyticStageModel(gpus={t4.name: roomy}), reserve_gib=0.0)[0].feasible


def test_search_names_the_gpu_whose_usable_memory_holds_no_layer():
    """One layer's weights, gradients and Adam state (18 B/param, tp 4) fit a T4's nominal 16 GiB but not its
    14.56 GiB usable: with every GPU in use the search is infeasible and names the T4 and its usable memory."""
    model = ModelArch(name="wide-2l", layers=2, hidden=17408, ffn_hidden=4 * 17408, heads=136, query_groups=136,
                      vocab=32000, seq_len=1024, mlp="gelu")
    a100, t4 = load_gpu("a100-80g"), load_gpu("t4-16g")
    one_layer = float(stage_params_per_rank(1, 4, False, False, model.hidden, model.ffn_hidden, model.heads,
                                            model.query_groups, model.vocab, model.mlp, tied=False)) * 18 / MIB
    assert usable_capacity_mib(t4) < one_layer < t4.memory_mib  # the case this test is about
    cluster = Cluster(name="c", inter_node_bandwidth_gbps=25.0, nodes=(Node(gpu=a100, count=8), Node(gpu=t4, count=4)))
    space = dataclasses.replace(load_search("default"), reserve_gib=0.0, distributed_optimizer=(False,),
                                sequence_parallel=(False,), tp_options=(1, 2, 4), global_batch=32)
    with pytest.raises(InfeasibleError, match=r"t4-16g \(16 GiB, 14\.56 GiB usable\) cannot hold even one layer"):
        search(cluster, model, space, AnalyticStageModel(gpus={a100.name: a100, t4.name: t4}))


def test_virtual_cluster_runs_out_of_memory_at_nominal_less_its_own_reserve():
    """By hand: the T4's traits (conf/simulator/t4-16g.yaml) reserve 1,280 MiB, PyTorch's 14.75 GiB on a Colab T4
    with ECC: 16 × 1024 − 1280 = 15,104 MiB is where a demand becomes an OOM, and what the run reports."""
    traits = load_traits("t4-16g")
    assert traits.driver_reserved_mib == 1280
    cluster, model = load_cluster("v100-t4-6"), load_model("llama-6l")
    t4 = cluster.gpu("t4-16g")
    assert traits.capacity_mib(t4) == 16 * 1024 - 1280 == 15104
    plan = _one_stage_plan("t4-16g", model.layers)
    plan = dataclasses.replace(plan, cluster=cluster.name)
    (sig,) = stage_signatures(plan, model)
    cost = stage_cost(sig, t4, traits)
    assert cost.capacity_mib == 15104
    demand = cost.peak_mem_mib(sig.inflight)
    run = simulate_plan(plan, cluster, model, seed=0)
    assert run.capacity_mib == (15104.0,) and run.oom == (demand > 15104)
    # the same plan on a T4 whose nominal memory sits just above / below demand + reserve
    for extra, oom in ((+1.0, False), (-1.0, True)):
        gpu = dataclasses.replace(t4, memory_gib=(demand + 1280 + extra) / 1024)
        one = Cluster(name=cluster.name, inter_node_bandwidth_gbps=25.0, nodes=(Node(gpu=gpu, count=1),))
        assert simulate_plan(plan, one, model, seed=0).oom is oom
