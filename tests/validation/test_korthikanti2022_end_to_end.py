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
ratio is 1.41 on Table 4's 22B layer against 1.34 measured). Table 5 was used by no
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


def test_table5_iteration_time(rows):
    mape, n = _mape(rows)
    assert n == 8
    assert mape <= 0.035, mape  # 2.9 % (module docstring)
    assert _mape(rows, "interleaved")[0] <= 0.045 and _mape(rows, "interleaved")[1] == 4
    for case, mode, _, p, m in rows:
        assert p / m - 1 == pytest.approx(0.0, abs=0.075), (case, mode, p, m)  # −6.5 … +0.2 % (module docstring)
    # the speed-up of sequence parallelism + selective over full recomputation (Table 5: +29 … +32 %) within 10
    # points (measured: predicted +35 … +39 %, 3.0–9.8 points high: the closed form's recomputed forward costs
    # more than Megatron's; 2.3–6.8 before issue #23; 3.0–9.0 with Megatron's optimizer step)
    pred = {(c, mode): p for c, mode, _, p, _ in rows}
    meas = {(c, mode): m for c, mode, _, _, m in rows}
    for c in {c for c, _ in pred}:
        gain = pred[(c, "full")] / pred[(c, "selective")] - meas[(c, "full")] / meas[(c, "selective")]
        assert 0.0 <= gain <= 0.10, (c, gain)


def test_table5_flat_form_is_worse(cases, rows):
    """Issue #23's before / after on this source: the flat closed form (50 % of peak throughout) is 13–44 % slow."""
    assert _mape(mg.evaluate_time(cases, flat=True))[0] > 3 * _mape(rows)[0]
