"""The drain overlap of plain 1F1B (`pipeline_assembly: cycle-mean-drain`, the default since session 11, issue #27;
docs/planner.md §The 1F1B steady state): each stage's tail (its DP gradient step and optimizer step) starts at that stage's own last
backward, not after stage 0's.

In 1F1B the last micro batch's backward runs from the last stage down to stage 0 (Narayanan et al. 2021 §2.2.1,
Fig. 4), so stage s finishes its last backward D_s = Σ_{s' < s} (b_{s'} + p2p_{s'}) before stage 0 does, with
b = 2/3 of the stage time t (forward : backward = 1 : 2, Narayanan et al. 2021 §5.1) and p2p_{s'} the gradient's
transfer over boundary s' (c·p2p, as the steady-state loops carry it). Megatron-LM starts a stage's gradient
reduction when its backward finishes (megatron/core/distributed/distributed_data_parallel.py,
finish_grad_sync after the last micro batch; with --overlap-grad-reduce even earlier, per bucket), so the
iteration ends at max_s (tail_s − D_s) after stage 0's last backward instead of max_s tail_s; D_0 = 0, so the
term is ≥ tail_0 ≥ 0 and ≤ max_s tail_s (never above the cycle-mean assembly's T).
The virtual cluster runs Megatron's gradient-norm barrier (memx.simulator.step_sync: with --clip-grad > 0 no
stage starts its optimizer step before every stage has finished its DP step), which makes the runtime's term
max_s (g_s − D_s) + max_s o_s with the tail split into all-reduce g_s and optimizer o_s. This term keeps one tail per
stage (the search's tables hold one): measured as a what-if, the split makes the closed form's time MAPE 0.02–0.05
points worse (docs/results.md §The 1F1B assembly, "The gradient-norm barrier and the default").
"""

from __future__ import annotations

import numpy as np

BACKWARD_SHARE = 2.0 / 3.0  # b / (f + b): forward : backward = 1 : 2 (Narayanan et al. 2021 §5.1)


def drained_tail_ms(stage_ms: np.ndarray, tail_ms: np.ndarray, loop_ms: np.ndarray | None) -> np.ndarray:
    """(N,) max_s (tail_s − D_s) of (pp, N) stage times and tails; loop_ms (pp − 1, N or 1) = 2·c·p2p_s of each
    boundary (Pipeline.loop_ms; None: no transfer time). Row by row in the stage times' dtype, so a column's
    value is the same in any batch (memx.planner.schedule.stage_sum). Rows past a layout's own stages (0 time,
    0 tail, 0 loop) give 0 − D_s ≤ tail_0 and change nothing."""
    share = stage_ms.dtype.type(BACKWARD_SHARE)
    half = None if loop_ms is None else loop_ms * stage_ms.dtype.type(0.5)
    out = tail_ms[0].copy()
    lead = np.zeros_like(stage_ms[0])
    for s in range(1, stage_ms.shape[0]):
        lead = lead + stage_ms[s - 1] * share
        if half is not None:
            lead = lead + half[s - 1]
        out = np.maximum(out, tail_ms[s] - lead)
    return out


def drained_tail_py(t: list[float], tail: list[float], loop) -> float:
    """drained_tail_ms of one plan in Python floats (memx.planner.naive's reference enumeration, and the per-stage-dp
    search's one split at a time, memx.planner.stage_dp_search)."""
    gaps = [0.0] * max(len(t) - 1, 0) if loop is None else [float(x) / 2.0 for x in np.asarray(loop)[:, 0]]
    best, lead = tail[0], 0.0
    for s in range(1, len(t)):
        lead += t[s - 1] * BACKWARD_SHARE + gaps[s - 1]
        best = max(best, tail[s] - lead)
    return best
