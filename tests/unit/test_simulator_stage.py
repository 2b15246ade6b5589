"""One stage alone on tp GPUs: physics sanity, recompute levels, OOM, noise, the stage_runs table."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from memx.domain.catalog import load_gpu
from memx.domain.errors import InputError
from memx.simulator import (
    STAGE_RUN_COLUMNS,
    load_traits,
    measure_stage,
    measure_stages,
    signature_from_dict,
    stage_cost,
)
from memx.simulator.stage import MIB

LLAMA = dict(hidden=4096, ffn_hidden=11008, heads=32, query_groups=32, vocab=32000, mlp="swiglu")


def sig(**over):
    base = dict(gpu="a100-80g", tp=2, layers=4, micro_batch=1, seq_len=4096, recompute="none",
                recompute_layers=None, first=False, last=False, inflight=2, **LLAMA)
    base.update(over)
    return signature_from_dict(base)


def cost(gpu="a100-80g", traits=None, **over):
    s = sig(gpu=gpu, **over)
    return stage_cost(s, load_gpu(gpu), traits or load_traits(gpu))


def test_simulator_does_not_import_the_planner_cost_model():
    banned = ["memx.planner.cost", "memx.planner.schedule", "memx.planner.recompute", "memx.planner.search", "memx.planner.objective"]
    code = ("import sys, memx.simulator, memx.cli.simulate; "
            f"bad = [m for m in {banned!r} if m in sys.modules]; assert not bad, bad; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


@pytest.mark.parametrize("field,value,needle", [
    ("tp", 3, "'tp'"), ("recompute", "block", "'recompute'"), ("mlp", "relu", "'mlp'"),
    ("layers", -1, "'layers'"), ("first", "yes", "'first'"), ("recompute_layers", 2, "'recompute_layers'"),
])
def test_bad_signature_names_the_field(field, value, needle):
    with pytest.raises(InputError, match=needle):
        sig(**{field: value})


def test_layers_zero_needs_embedding_or_output():
    with pytest.raises(InputError, match="'layers' is 0"):
        sig(layers=0)
    emb, out = cost(layers=0, first=True), cost(layers=0, last=True)
    assert 0 < emb.time_ms < out.time_ms  # the logits GEMM + cross entropy dwarf a gather
    assert emb.params == pytest.approx(32000 * 4096 / 2)


def test_static_memory_is_18_bytes_per_parameter():
    c = cost(layers=2)
    per_layer = (4096 * 4096 * 4 + 3 * 4096 * 11008) / 2 + 2 * 4096  # QKV+proj, SwiGLU MLP split by tp=2; norms
    assert c.params == pytest.approx(2 * per_layer)
    assert c.static_mem_mib == pytest.approx(2 * per_layer * 18 / MIB)


def test_peak_memory_grows_by_one_micro_batch_of_activations_per_inflight():
    c = cost()
    step = c.peak_mem_mib(3) - c.peak_mem_mib(2)
    assert step == pytest.approx(c.act_mem_mib * (1 + c.fragmentation_fraction))
    assert c.peak_mem_mib(1) > c.context_mem_mib + c.static_mem_mib


def test_recompute_levels_trade_time_for_memory_with_eager_attention():
    tr = dataclasses.replace(load_traits("a100-80g"), flash_attention=False)
    none, sel, full = (cost(traits=tr, recompute=r) for r in ("none", "selective", "full"))
    block = cost(traits=tr, recompute="full", recompute_layers=2)
    assert none.act_mem_mib > sel.act_mem_mib > full.act_mem_mib
    assert none.act_mem_mib > block.act_mem_mib > full.act_mem_mib  # block: first 2 of 4 layers in full
    assert none.time_ms < sel.time_ms < full.time_ms
    assert none.time_ms < block.time_ms < full.time_ms


def test_with_flash_attention_selective_saves_nothing():
    # paper §3.1.1: on modern GPUs selective saves little memory; with a fused kernel nothing is stored
    none, sel = cost(recompute="none"), cost(recompute="selective")
    assert sel.act_mem_mib == pytest.approx(none.act_mem_mib)
    assert sel.time_ms == pytest.approx(none.time_ms)


def test_eager_attention_stores_the_score_matrix():
    flash = cost()
    eager = cost(traits=dataclasses.replace(load_traits("a100-80g"), flash_attention=False))
    scores = 4 * 2 * 1 * (32 / 2) * 4096**2 / MIB  # 4 layers × 2 B × b·(a/t)·s²
    assert eager.act_mem_mib - flash.act_mem_mib == pytest.approx(scores, rel=0.01)


def test_bandwidth_limited_parts_pay_more_for_recompute():
    # paper §3.1.1: compute-rich, bandwidth-poor X pays more (relative) for full recompute than C
    def overhead(gpu):
        return cost(gpu=gpu, recompute="full").time_ms / cost(gpu=gpu).time_ms - 1
    assert overhead("vendor-x-32g") > overhead("vendor-c-32g") + 0.03


def test_small_gemms_reach_a_lower_fraction_of_peak():
    def tflops(hidden):
        c = cost(hidden=hidden, ffn_hidden=4 * hidden, heads=16, query_groups=16, mlp="gelu", seq_len=1024)
        flops = 4 * 72 * 1024 * hidden**2 * (1 + 1024 / (6 * hidden)) / 2  # 3× fwd GEMM FLOPs / tp (Narayanan 2021 Eq. 3)
        return flops / c.time_ms / 1e9
    assert tflops(1024) < 0.6 * tflops(8192)


def test_oom_gives_no_numbers():
    s = sig(layers=32, tp=1, inflight=8, micro_batch=4)
    run = measure_stage(s, load_gpu("a100-80g"), load_traits("a100-80g"), rng=np.random.default_rng(0))
    assert run.status == "oom" and "out of memory" in run.reason
    assert run.time_ms is None and run.peak_mem_mib is None and run.static_mem_mib is None


def test_measure_stages_is_deterministic_and_noisy_at_the_trait_level():
    rows = [sig().to_dict()] * 400
    a = measure_stages(rows, seed=1)
    b = measure_stages(rows, seed=1)
    c = measure_stages(rows, seed=2)
    assert list(a.columns) == list(STAGE_RUN_COLUMNS)
    assert a["time_ms"].tolist() == b["time_ms"].tolist()
    assert a["time_ms"].tolist() != c["time_ms"].tolist()
    rel_std = a["time_ms"].std() / a["time_ms"].mean()
    assert rel_std == pytest.approx(load_traits("a100-80g").noise_std_fraction, rel=0.25)
    assert a["peak_mem_mib"].nunique() == 1  # memory is not noisy
    assert set(a["backend"]) == {"simulated"} and set(a["status"]) == {"ok"}


def test_measure_stages_accepts_a_dataframe_and_reports_oom_rows():
    import pandas as pd
    df = pd.DataFrame([sig().to_dict(), sig(layers=32, tp=1, inflight=8, micro_batch=4).to_dict()])
    out = measure_stages(df, seed=0, repeats=2)
    assert out["status"].tolist() == ["ok", "ok", "oom", "oom"]
    assert out.loc[out.status == "oom", "time_ms"].isna().all()
    with pytest.raises(InputError, match="row 0"):
        measure_stages([{**sig().to_dict(), "tp": 0}], seed=0)
    with pytest.raises(InputError, match="'gpu'"):
        measure_stages(df, seed=0, gpus=[load_gpu("h100-80g")])


def test_output_layer_backward_adds_four_bytes_per_logit_beyond_the_kept_softmax():
    """The last stage keeps the fp32 softmax (4 B per logit) and its loss backward adds 4 B more: Megatron-LM computes
    the fp32 logit gradient in place in the kept softmax (tensor_parallel/cross_entropy.py), and 4 + 4 B is what its
    functional tests' measured max allocated bytes hold (physics.output_cost)."""
    from memx.simulator.physics import Device, output_cost

    s = sig(first=False, last=True, layers=0)
    d = s.dims()
    out = output_cost(Device.of(load_gpu("a100-80g"), load_traits("a100-80g")), d)
    logits = d.tokens * d.vocab / d.tp
    assert out.workspace_bytes == pytest.approx(4.0 * logits)
    assert out.act_bytes == pytest.approx(4.0 * d.tokens * d.hidden + 4.0 * logits)
