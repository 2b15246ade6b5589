"""The interleaved 1F1B schedule on the virtual cluster, event by event (issue #27; docs/simulator.md
§Interleaved 1F1B). Independent of the planner: it derives nothing from the closed form.

Megatron-LM's interleaved schedule (Narayanan et al. 2021 §2.2.2; megatron/core/pipeline_parallel/
schedules.py, `forward_backward_pipelining_with_interleaving`): rank s holds v model chunks, virtual stages
s, s + pp, …, s + (v − 1)·pp, each with an equal share (layers / v) of the rank's layers. Its v·m
forward chunk-steps follow Megatron's schedule table (`get_schedule_table` with
`microbatch_group_size_per_vp_stage` = pp: micro batches in groups of pp, chunk by chunk within a group);
backward steps take the same table with the chunks reversed. Rank s runs
(pp − s − 1)·2 + (v − 1)·pp warm-up forwards (`get_pp_rank_microbatches`), then one forward / one backward
until the forwards run out, then the remaining backwards. A forward needs the previous virtual stage's
activation, a backward the next one's gradient; each hop between ranks is a p2p transfer over that pair's
link, the hop from the last rank back to the first included. Activations: every forward adds its chunk's
activations to what the rank holds until that chunk's backward frees them; the peak is read off the run.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Mapping

import numpy as np

from memx.domain.plan import Plan
from memx.simulator.stage import StageCost, StageSignature, noise_factor
from memx.simulator.traits import GpuTraits

Op = tuple[int, int, int]  # (kind 0 forward / 1 backward, chunk, micro batch)


def schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro batch, chunk) of every forward chunk-step in order: groups of `group` micro batches, each
    group run chunk 0 … v − 1 (Megatron-LM get_schedule_table)."""
    out: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        out += [(j, c) for c in range(v) for j in range(lo, hi)]
    return out


def interleaved_order(pp: int, v: int, m: int, s: int) -> list[Op]:
    """The operations rank s runs, in order (warm-up, 1F1B steady state, cool-down)."""
    table = schedule_table(m, v, pp)
    total = m * v
    warm = min((pp - s - 1) * 2 + (v - 1) * pp, total)
    fwd = [(0, c, j) for j, c in table]
    bwd = [(1, v - 1 - c, j) for j, c in table]  # backward runs the chunks in reverse
    order = fwd[:warm]
    for i in range(total - warm):
        order += [fwd[warm + i], bwd[i]]
    return order + bwd[total - warm:]


def chunk_signatures(sig: StageSignature, s: int, pp: int, v: int) -> list[StageSignature]:
    """The v chunk signatures of rank s: layers / v each (and a block recompute's layers / v, Megatron applies
    --recompute-num-layers per chunk); the embedding sits in virtual stage 0, the output layer in the last."""
    rl = None if sig.recompute_layers is None else sig.recompute_layers // v
    return [dataclasses.replace(sig, layers=sig.layers // v, recompute_layers=rl, first=s == 0 and c == 0,
                                last=s == pp - 1 and c == v - 1) for c in range(v)]


def _input(kind: int, c: int, s: int, pp: int, v: int) -> tuple[int, int, int] | None:
    """(rank, chunk, hop) whose output op (kind, c) on rank s waits for; hop: boundary index, pp − 1 for the
    wrap; None: no input (the first virtual stage's forward). A last virtual stage's backward waits for its
    own forward (hop −1: no transfer)."""
    if kind == 0:
        if s > 0:
            return s - 1, c, s - 1
        return (pp - 1, c - 1, pp - 1) if c > 0 else None
    if s < pp - 1:
        return s + 1, c, s
    return (0, c + 1, pp - 1) if c < v - 1 else (s, c, -1)


def run_interleaved(fwd: list[list[list[float]]], bwd: list[list[list[float]]],
                    hop_ms: list[float]) -> tuple[list[float], list[float]]:
    """Event-driven interleaved 1F1B of one replica. fwd/bwd[s][c][j]: durations of chunk c of micro batch j
    on rank s; hop_ms[b]: one transfer over boundary b (b = s: rank s ↔ s + 1; b = pp − 1: last ↔ first).
    Returns per rank its finish time and busy time."""
    pp, v, m = len(fwd), len(fwd[0]), len(fwd[0][0])
    orders = [interleaved_order(pp, v, m, s) for s in range(pp)]
    done: dict[tuple[int, int, int, int], float] = {}  # (kind, rank, chunk, micro batch) → end time
    ptr, free, busy = [0] * pp, [0.0] * pp, [0.0] * pp
    events = [(0.0, s) for s in range(pp)]
    while events:
        _, s = heapq.heappop(events)
        while ptr[s] < len(orders[s]):
            kind, c, j = orders[s][ptr[s]]
            src = _input(kind, c, s, pp, v)
            if src is None:
                arrive = 0.0
            else:
                r, cc, hop = src
                key = (0 if hop == -1 else kind, r, cc, j)
                if key not in done:
                    break
                arrive = done[key] + (hop_ms[hop] if hop >= 0 else 0.0)
            dur = bwd[s][c][j] if kind else fwd[s][c][j]
            end = max(free[s], arrive) + dur
            free[s], busy[s], ptr[s] = end, busy[s] + dur, ptr[s] + 1
            done[(kind, s, c, j)] = end
            for r in {(s + 1) % pp, (s - 1) % pp}:  # a neighbour may wait for this output
                heapq.heappush(events, (end, r))
    if any(ptr[s] != len(orders[s]) for s in range(pp)):  # cannot happen for Megatron's order; guards edits
        raise RuntimeError("interleaved 1F1B schedule deadlocked")
    return free, busy


def peak_held_mib(plan: Plan, chunk_act_mib: list[list[float]]) -> list[float]:
    """Per rank, the most activations (MiB) it holds at once in the interleaved order (timing-free: the
    order alone fixes what is held)."""
    pp, v, m = plan.pp, plan.virtual_stages, plan.micro_batches
    out = []
    for s in range(pp):
        held = top = 0.0
        for kind, c, _ in interleaved_order(pp, v, m, s):
            held += -chunk_act_mib[s][c] if kind else chunk_act_mib[s][c]
            top = max(top, held)
        out.append(top)
    return out



def interleaved_replicas(plan: Plan, chunks: list[list[StageCost]], p2p: np.ndarray, tr: Mapping[str, GpuTraits],
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Finish and busy time [replica, rank]; every forward / backward of every chunk of every micro batch
    has its own noise draw. p2p[r]: replica r's hop times, the wrap last (memx.simulator.schedule._p2p_ms)."""
    pp, v, m = plan.pp, plan.virtual_stages, plan.micro_batches
    sigma = np.array([tr[st.gpu].noise_std_fraction for st in plan.stages])[None, :, None, None, None]
    noise = noise_factor(rng, sigma, (plan.dp, pp, v, m, 2))
    base = np.array([[[c.fwd_ms, c.bwd_ms] for c in row] for row in chunks])[None, :, :, None, :]
    dur = base * noise
    finish, busy = np.zeros((plan.dp, pp)), np.zeros((plan.dp, pp))
    for r in range(plan.dp):
        finish[r], busy[r] = run_interleaved(dur[r, ..., 0].tolist(), dur[r, ..., 1].tolist(), p2p[r].tolist())
    return finish, busy
