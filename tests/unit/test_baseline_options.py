"""Baselines and the job options of issue #14: each baseline searches the distributed optimizer / sequence
parallelism only where its original system has them (none of the four does), and its own memory estimate
follows the options a stage carries (hand calculations: Megatron-LM distributed-optimizer bytes, Korthikanti
et al. 2022 Eq. 2 vs Eq. 4)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.planner.baselines import AMP, BASELINES, methods
from memx.planner.baselines.memory import analytic_memory, korthikanti_memory
from memx.planner.cost import MIB, AnalyticStageModel, stage_params_per_rank
from tests.support.signatures import stage_row


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_a_baseline_without_the_options_searches_them_off_whatever_the_space_lists(name):
    planner = BASELINES[name]
    on = dataclasses.replace(load_search("small"), distributed_optimizer=(True,), sequence_parallel=(True,))
    both = dataclasses.replace(on, distributed_optimizer=(False, True), sequence_parallel=(False, True))
    assert planner.job_options(on) == planner.job_options(both) == {"distributed_optimizer": (False,),
                                                                    "sequence_parallel": (False,)}
    assert methods()["ours"].job_options(on) == {"distributed_optimizer": (True,), "sequence_parallel": (True,)}


def test_amp_picks_a_plan_without_the_options_where_memx_keeps_them():
    cl, mo = load_cluster("v100-t4-6"), load_model("llama-6l")
    space = dataclasses.replace(load_search("small"), distributed_optimizer=(True,), sequence_parallel=(True,))
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    amp = AMP.plan(cl, mo, space, pred, top_k=3)
    assert amp.plan is not None and not amp.plan.distributed_optimizer and not amp.plan.sequence_parallel
    assert all(not c.plan.distributed_optimizer for c in amp.candidates)
    ours = methods()["ours"].plan(cl, mo, space, pred, top_k=3)
    assert ours.plan.distributed_optimizer


def _sigs(**over) -> pd.DataFrame:
    return pd.DataFrame([stage_row(**over)])


def test_analytic_memory_with_the_distributed_optimizer_is_lower_by_the_sharded_states():
    gpus = {"a100-80g": load_gpu("a100-80g")}
    for memory, factor in ((analytic_memory(gpus, 1.15), 1.15), (korthikanti_memory(gpus), 1.0)):
        off = memory(_sigs(distributed_optimizer=False, dp=4))
        on = memory(_sigs(distributed_optimizer=True, dp=4))
        params = stage_params_per_rank(8.0, 2.0, False, False, 4096, 11008, 32, 32, 32000, "swiglu", tied=False)
        # 18 B/param → 6 + 12/4 = 9 B/param: 9 B per parameter of the rank's stage saved (Megatron-LM docs; ZeRO §5.1)
        saved = factor * float(params) * 9.0 / MIB
        assert float(off["peak_mem_mib"].iloc[0] - on["peak_mem_mib"].iloc[0]) == pytest.approx(saved, rel=1e-9)
        assert float(on["static_mem_mib"].iloc[0]) == pytest.approx(float(params) * 9.0 / MIB, rel=1e-9)
        one = memory(_sigs(distributed_optimizer=True, dp=1))  # one data-parallel rank: nothing to shard
        assert float(one["peak_mem_mib"].iloc[0]) == pytest.approx(float(off["peak_mem_mib"].iloc[0]))


def test_memory_without_sequence_parallelism_keeps_the_replicated_activations():
    gpus = {"a100-80g": load_gpu("a100-80g")}
    s, b, h, t, L, k = 4096, 1, 4096, 2, 8, 2  # stage_row: 8 layers, tp 2, 2 micro batches in flight
    sbh = s * b * h
    # FaSOP's formula: Eq. 2 sbh(10 + 24/t + …) vs Eq. 4 sbh(34/t + …): 10sbh(1 − 1/t) per layer and micro batch
    fas = korthikanti_memory(gpus)
    d = fas(_sigs(sequence_parallel=False))["peak_mem_mib"].iloc[0] - fas(_sigs(sequence_parallel=True))["peak_mem_mib"].iloc[0]
    assert d == pytest.approx(k * L * 10 * sbh * (1 - 1 / t) / MIB)
    # the flat closed form (LLaMA, no dropout): 8sbh(1 − 1/t) per kept layer, 2sbh(1 − 1/t) per recomputed input
    flat = analytic_memory(gpus, 1.0)
    d = flat(_sigs(sequence_parallel=False))["peak_mem_mib"].iloc[0] - flat(_sigs(sequence_parallel=True))["peak_mem_mib"].iloc[0]
    assert d == pytest.approx(k * L * 8 * sbh * (1 - 1 / t) / MIB)
    rec = dict(recompute="full", recompute_layers=3)
    d = (flat(_sigs(sequence_parallel=False, **rec))["peak_mem_mib"].iloc[0]
         - flat(_sigs(sequence_parallel=True, **rec))["peak_mem_mib"].iloc[0])
    assert d == pytest.approx(k * (5 * 8 + 3 * 2) * sbh * (1 - 1 / t) / MIB)
    # at tp = 1 sequence parallelism changes nothing
    one = [flat(_sigs(tp=1, sequence_parallel=v))["peak_mem_mib"].iloc[0] for v in (False, True)]
    assert one[0] == pytest.approx(one[1])
