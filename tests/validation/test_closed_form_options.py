"""The closed form's sequence-parallel and distributed-optimizer terms against published numbers,
read in place from ../shared/realdata/papers (skipped when absent).

- Korthikanti et al. 2022 Fig. 7: activation memory with sequence parallelism alone, relative to TP
  only (GPT layers, eager attention, dropout), and Table 4: the 22B layer with and without sequence
  parallelism, alone and with selective recomputation.
- Fig. 1 model states with the distributed optimizer: tests/validation/test_analytic_korthikanti2022.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from memx.domain.runtime import load_runtime
from memx.planner.cost import AnalyticStageModel
from memx.planner.runtime_terms import activation_bytes, shapes
from test_closed_form_published import A100, layer_signatures  # same folder: pytest puts it on sys.path
from test_closed_form_published import _korthikanti as _cfg


def test_fig7_sequence_parallel_alone(realdata):
    """Fig. 7 'seqpar' column (activations with SP, no recompute, % of TP only): within 1.5 points
    (exact formulas; chart values)."""
    fig7 = pd.read_csv(realdata / "papers" / "korthikanti2022_fig7_relative_activation_pct.csv").set_index("model")
    cfg = _cfg(realdata)
    for model in ("22B", "175B", "530B"):
        c = cfg.loc[model]
        cols = {"micro_batch": [c["microbatch"]], "seq_len": [c["seq"]], "hidden": [c["hidden"]],
                "ffn_hidden": [4 * c["hidden"]], "heads": [c["heads"]], "query_groups": [c["heads"]],
                "vocab": [c["vocab"]], "tp": [c["tp"]], "mlp": ["gelu"]}
        off, on = (activation_bytes(shapes(cols, np.array([sp])), np.array([False]))[0][0] for sp in (False, True))
        assert 100 * on / off == pytest.approx(fig7.loc[model, "seqpar"], abs=1.5), model


def test_table4_sequence_parallel_layer_time(realdata, conf_root):
    """Table 4 (22B layer, A100, TP 8): sequence parallelism 19.6 → 19.0 ms (−3 %), selective 20.9 →
    selective + SP 20.3 ms (−3 %). The closed form (SP from the signature column) shards the memory-bound
    norm/dropout/residual traffic by tp (1.7 ms) and, as Megatron-LM's backward does, all-gathers the two saved
    s/t GEMM inputs again (memx.planner.runtime_terms.backward_tp_ms, +0.8 ms): a saving of 0.85 ms, 4.1 % and 3.9 %,
    within 2 points of the measured one (the paper's formula, without the re-gathers, predicted 8 %), and the SP
    times within 5 % absolute (+4.2 %, +2.7 %). (Before issue #23's batched attention backward — runtime_terms.
    gemm_fwd_bwd_ms `batch` — the layer was 9 % slower than measured with SP and 14 % without.)"""
    t4 = pd.read_csv(realdata / "papers" / "korthikanti2022_table4_layer_time_22B.csv").set_index("experiment")
    c = _cfg(realdata).loc["22B"]
    prof = dataclasses.replace(load_runtime("a100-80g", "nvidia", conf_root), flash_attention=False)
    model = AnalyticStageModel(gpus={A100.name: A100}, runtime={A100.name: prof})
    variants = [dict(recompute=rc, sequence_parallel=sp) for rc in ("none", "selective") for sp in (False, True)]
    t = model.predict(layer_signatures(c, variants))["time_ms"].to_numpy()
    print("Table 4 closed form (none, none+SP, selective, selective+SP) ms:", np.round(t, 2))
    measured = [1 - t4.loc[b, "combined_ms"] / t4.loc[a, "combined_ms"] for a, b in
                (("baseline no recompute", "sequence parallelism"), ("selective recompute", "selective + sequence"))]
    for (off, on), m in zip(((t[0], t[1]), (t[2], t[3])), measured):
        assert 0.0 < 1 - on / off == pytest.approx(m, abs=0.02)
    assert t[1] == pytest.approx(t4.loc["sequence parallelism", "combined_ms"], rel=0.05)
    assert t[3] == pytest.approx(t4.loc["selective + sequence", "combined_ms"], rel=0.05)


def test_table4_full_over_selective_layer_ratio(realdata, conf_root):
    """Issue #23: Table 4's layer with full recomputation (no SP, 27.2 ms) over selective + SP (20.3 ms) is 1.340.
    The closed form: 1.351 (within 0.02) with Megatron's backward re-gathers under SP counted; the paper's formula
    (tp_overlap_exposed_fraction None) gives 1.407, and 0.5 (overlap half hidden: the best fit to Table 4's five
    times, 0.7 % MAPE, but 3.8 % on Table 5) 1.366 — measured side by side (docs/results.md)."""
    t4 = pd.read_csv(realdata / "papers" / "korthikanti2022_table4_layer_time_22B.csv").set_index("experiment")
    c = _cfg(realdata).loc["22B"]
    measured = t4.loc["baseline with full recompute", "combined_ms"] / t4.loc["selective + sequence", "combined_ms"]
    prof = dataclasses.replace(load_runtime("a100-80g", "nvidia", conf_root), flash_attention=False)
    variants = [dict(recompute="full", sequence_parallel=False), dict(recompute="selective", sequence_parallel=True)]

    def ratio(p) -> float:
        t = AnalyticStageModel(gpus={A100.name: A100}, runtime={A100.name: p}).predict(
            layer_signatures(c, variants))["time_ms"].to_numpy()
        return float(t[0] / t[1])

    assert ratio(prof) == pytest.approx(measured, abs=0.02)
    assert abs(ratio(dataclasses.replace(prof, tp_overlap_exposed_fraction=None)) - measured) > 0.05

