"""Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models), A100 80GB.

Table 4: one 22B-model layer (h 6144, a 64, s 2048, b 4, tp 8): 19.6 ms fwd+bwd; full recompute
+39 %, selective +7 %, sequence parallelism −3 %, selective + sequence +4 %. Fig. 1 / Fig. 7: activation
memory and its shares per recompute level, with and without sequence parallelism.
Megatron 2022 has no fused (flash) attention: the A100 traits are used with flash_attention off.
Tolerances: layer time ±10 %, recompute overheads ±4 percentage points, activation memory ±3 %,
relative activation shares ±2 points, static memory ±5 %.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from memx.domain.catalog import load_gpu
from memx.simulator import load_traits, signature_from_dict, stage_cost
from memx.simulator.stage import MIB

GIB = 1024.0


def layer22b(recompute: str, layers: int = 1, first: bool = False, last: bool = False, sp: bool = False):
    # the paper's GPT models tie the input and output embeddings (Megatron-LM's default; issue #23)
    s = signature_from_dict(dict(gpu="a100-80g", tp=8, layers=layers, micro_batch=4, seq_len=2048, recompute=recompute,
                                 recompute_layers=None, first=first, last=last, inflight=1, hidden=6144,
                                 ffn_hidden=4 * 6144, heads=64, query_groups=64, vocab=51200, mlp="gelu",
                                 sequence_parallel=sp, tied_embeddings=True))
    traits = dataclasses.replace(load_traits("a100-80g"), flash_attention=False)
    return stage_cost(s, load_gpu("a100-80g"), traits)


@pytest.fixture(scope="module")
def table4(realdata):
    return pd.read_csv(realdata / "papers" / "korthikanti2022_table4_layer_time_22B.csv").set_index("experiment")


def test_table4_layer_time_and_recompute_overheads(table4):
    base = table4.loc["baseline no recompute", "combined_ms"]
    none, sel, full = (layer22b(r).time_ms for r in ("none", "selective", "full"))
    print(f"22B layer: none {none:.2f} ms (paper {base}), full +{100 * (full / none - 1):.1f}% (paper +39%), "
          f"selective +{100 * (sel / none - 1):.1f}% (paper +7%)")
    assert none == pytest.approx(base, rel=0.10)
    assert full / none - 1 == pytest.approx(table4.loc["baseline with full recompute", "combined_ms"] / base - 1, abs=0.04)
    assert sel / none - 1 == pytest.approx(table4.loc["selective recompute", "combined_ms"] / base - 1, abs=0.04)


def test_table4_forward_and_backward_split(table4):
    c = layer22b("none")
    assert c.fwd_ms == pytest.approx(table4.loc["baseline no recompute", "forward_ms"], rel=0.10)
    assert c.bwd_ms == pytest.approx(table4.loc["baseline no recompute", "backward_ms"], rel=0.15)


def test_fig1_activation_and_static_memory_of_the_22b_model(realdata):
    fig1 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig1_memory_per_gpu_gib.csv")
    row = fig1[(fig1.model == "22B") & (fig1["mode"] == "tp_only_no_recompute")].iloc[0]
    model = layer22b("none", layers=48, first=True, last=True)
    per_layer = layer22b("none").act_mem_mib
    print(f"22B activations {48 * per_layer / GIB:.2f} GiB (paper {row.activations_GiB}), "
          f"static {model.static_mem_mib / GIB:.2f} GiB (paper {row.params_grads_optimizer_GiB})")
    assert 48 * per_layer / GIB == pytest.approx(row.activations_GiB, rel=0.03)
    assert model.static_mem_mib / GIB == pytest.approx(row.params_grads_optimizer_GiB, rel=0.05)


def test_fig7_relative_activation_memory(realdata):
    fig7 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig7_relative_activation_pct.csv").set_index("model")
    none, sel, full = (layer22b(r).act_mem_mib for r in ("none", "selective", "full"))
    assert 100 * sel / none == pytest.approx(fig7.loc["22B", "selective"], abs=2)
    assert 100 * full / none == pytest.approx(fig7.loc["22B", "full"], abs=2)


def test_eager_layer_memory_follows_korthikanti_eq2():
    # sbh·(10 + 24/t + 5as/(ht)) bytes per layer under TP without sequence parallelism (Korthikanti 2022 Eq. 2)
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) / MIB
    assert layer22b("none").act_mem_mib == pytest.approx(expected, rel=1e-9)


def test_table4_sequence_parallel_layer_times(table4):
    base = layer22b("none").time_ms
    sp, sp_sel = layer22b("none", sp=True).time_ms, layer22b("selective", sp=True).time_ms
    paper = table4.loc["baseline no recompute", "combined_ms"]
    print(f"22B layer: sequence parallel {100 * (sp / base - 1):+.1f}% (paper -3%), "
          f"selective + sequence {100 * (sp_sel / base - 1):+.1f}% (paper +4%)")
    assert sp / base - 1 == pytest.approx(table4.loc["sequence parallelism", "combined_ms"] / paper - 1, abs=0.04)
    assert sp_sel / base - 1 == pytest.approx(table4.loc["selective + sequence", "combined_ms"] / paper - 1, abs=0.04)
    assert layer22b("none", sp=True).fwd_ms < layer22b("none").fwd_ms


def test_fig7_and_fig1_sequence_parallel_activation_memory(realdata):
    fig7 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig7_relative_activation_pct.csv").set_index("model")
    fig1 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig1_memory_per_gpu_gib.csv")
    none = layer22b("none").act_mem_mib
    sp, sp_sel = layer22b("none", sp=True).act_mem_mib, layer22b("selective", sp=True).act_mem_mib
    assert 100 * sp / none == pytest.approx(fig7.loc["22B", "seqpar"], abs=2)
    assert 100 * sp_sel / none == pytest.approx(fig7.loc["22B", "seqpar+selective"], abs=2)
    row = fig1[(fig1.model == "22B") & (fig1["mode"] == "seqpar+selective")].iloc[0]
    assert 48 * sp_sel / GIB == pytest.approx(row.activations_GiB, rel=0.03)
