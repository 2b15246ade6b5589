"""Korthikanti et al. 2022 Table 5 (arXiv:2205.05198; A100-80GB, Megatron-LM): end-to-end iteration time of the
22B, 175B, 530B and 1T GPT models (Table 3 configurations: tp 8, pp 1–64, dp 1, the 175B and 530B models with the
interleaved schedule at 3 virtual stages) with full recomputation and with sequence parallelism + selective
recomputation, read in place from ../shared/realdata/papers (skipped when absent). Each is predicted as a given
plan by the runtime-aware closed form (tests/validation/megatron_cases.py). Measured (session 4): MAPE 2.0 %
(every case within −4.4 … +4.5 %; the interleaved 175B and 530B: 2.3 %), the flat form 29.1 % (+13 … +44 %).
Issue #23 (the attention core's backward GEMMs batched per head, runtime_terms.gemm_fwd_bwd_ms `batch`): MAPE
3.4 % (−8.2 … +0.2 %; interleaved 3.8 %). The 22B layer itself moved towards Table 4's measurement (+14/+9/+12/+7 %
→ +5.3/−0.2/+3.8/−1.4 %, tests/validation/test_closed_form_options.py), so the session-4 agreement of the
iterations was partly two errors cancelling: what the selective runs now miss (up to 8 %) lies outside the
layer's forward and backward (docs/benchmarks.md §Issue #23: embedding-gradient and latency terms). Issue #23
(expert-DP collective and Korthikanti non-layer time): the optimizer step as the passes Megatron-LM's step makes
(memx.planner.schedule.optimizer_step_bytes: 50 B/param in bf16 instead of 36) — MAPE 2.9 % (−6.5 … +0.2 %;
interleaved 3.7 %); only the 22B (pp 1, 2.8 B params per GPU, one micro batch) moves by more than 0.2 points
(selective −8.2 → −6.5 %, full −1.3 → +0.0 %). What the selective runs still miss is not outside the layer
in the pipelined cases: the non-layer terms are the same in both modes there, and the full runs are within
−2.5 … +0.2 %, so the selective-only miss scales with the layer (the closed form's full / selective layer
ratio is 1.41 on Table 4's 22B layer against 1.34 measured). Issue #23 (selective recompute and cp memory): that
ratio came from the backward's TP collectives under sequence parallelism — Megatron-LM all-gathers each saved s/t
GEMM input again in the backward (memx.planner.runtime_terms.backward_tp_ms), which the paper's formula leaves out, so
every SP (= selective) run was short of two all-gathers per layer. Counted (conf/runtime/default.yaml
tp_overlap_exposed_fraction 1.0): MAPE 2.9 → 1.8 % (−4.9 … +0.2 %), the layer ratio 1.35; the full runs (no SP)
unchanged. Table 5 was used by no
fit: the A100 efficiencies in conf/runtime cite NVIDIA's GEMM guide and FlashAttention-2; of this paper's times only
Table 4's 22B layer was checked before (test_closed_form_published.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import megatron_cases as mg  # same folder: pytest puts it on sys.path


@pytest.fixture(scope="module")
def cases(realdata):
    return mg.korthikanti_table5_cases(realdata / "papers")


@pytest.fixture(scope="module")
def rows(cases):
    return mg.evaluate_time(cases)


def _mape(rows, kind=None):
    errs = [abs(p / m - 1) for _, _, k, p, m in rows if kind in (None, k)]
    return float(np.mean(errs)), len(errs)


def _gains(rows) -> dict[str, float]:
    """Per model: predicted − measured speed-up of SP + selective over full recomputation (Table 5: +29 … +32 %)."""
    pred = {(c, mode): p for c, mode, _, p, _ in rows}
    meas = {(c, mode): m for c, mode, _, _, m in rows}
    return {c: pred[(c, "full")] / pred[(c, "selective")] - meas[(c, "full")] / meas[(c, "selective")]
            for c in {c for c, _ in pred}}


def test_table5_iteration_time(rows):
    mape, n = _mape(rows)
    assert n == 8
    assert mape <= 0.025, mape  # 1.8 % (module docstring)
    assert _mape(rows, "interleaved")[0] <= 0.035 and _mape(rows, "interleaved")[1] == 4  # 2.6 %
    for case, mode, _, p, m in rows:
        assert p / m - 1 == pytest.approx(0.0, abs=0.055), (case, mode, p, m)  # −4.9 … +0.2 % (module docstring)
    # the speed-up of sequence parallelism + selective over full recomputation within 5 points (measured 1.1–3.9
    # points high; 3.0–9.8 with the paper's backward TP formula: test_table5_backward_regather_side_by_side)
    for c, gain in _gains(rows).items():
        assert 0.0 <= gain <= 0.05, (c, gain)


def test_table5_backward_regather_side_by_side(cases, rows):
    """Issue #23's option measured side by side: the paper's backward TP formula (tp_overlap_exposed_fraction None:
    no SP re-gather) leaves the selective runs 2.0–6.5 % fast (MAPE 2.9 %); with the re-gathers counted every
    selective run moves towards its measurement and no full run moves (they run without SP)."""
    paper = mg.evaluate_time(cases, profile={"tp_overlap_exposed_fraction": None})
    assert _mape(paper)[0] > _mape(rows)[0] + 0.01
    for (case, mode, _, p_new, m), (_, _, _, p_old, _) in zip(rows, paper):
        if mode == "full":
            assert p_new == pytest.approx(p_old, rel=1e-9), case
        else:
            assert abs(p_new / m - 1) < abs(p_old / m - 1), case
    assert max(_gains(paper).values()) > 0.05


def test_table5_flat_form_is_worse(cases, rows):
    """Issue #23's before / after on this source: the flat closed form (50 % of peak throughout) is 13–44 % slow."""
    assert _mape(mg.evaluate_time(cases, flat=True))[0] > 3 * _mape(rows)[0]
