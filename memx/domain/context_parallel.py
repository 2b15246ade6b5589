"""Context parallelism in the plan (issue #27; docs/planner.md §Context parallelism).

Megatron-LM's `--context-parallel-size` cp splits every sequence of a micro batch over cp GPUs per stage
and tensor-parallel rank (Megatron-LM docs, "Context parallelism", docs/source/api-guide/context_parallel.rst;
Transformer Engine's ring attention). The ranks are ordered tp fastest, then cp, then dp, then pp
(megatron/core/parallel_state.py, order 'tp-cp-ep-dp-pp'), so a stage holds dp × cp groups of tp GPUs; the
gradients are reduced over the dp × cp ranks (megatron/core/distributed/finalize_model_grads.py and
optimizer/__init__.py: `get_data_parallel_group(with_context_parallel=True)`, the dp-cp group) and the
distributed optimizer shards over them too.

Every cost except attention is per token, so a cp plan costs exactly what its *rank-equivalent* plan costs
(`rank_equivalent`): dp·cp replicas at seq_len s/cp and global batch gb·cp (the same micro batches m, the same
tokens per GPU, the same p2p message per rank b·(s/cp)·h, the same dp·cp gradient group and optimizer
shards, the same GPUs placed the same way) — plus what the ring adds: each rank's attention runs over all s
keys (cp× the attention of an s/cp sequence) and K/V chunks circulate between the cp ranks. The planner
(memx.planner.context_parallel) and the virtual cluster (memx.simulator.context_parallel) each add those two
terms with their own formulas.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def context_problems(plan: Any) -> list[str]:
    """One message per factor context parallelism cp > 1 needs that does not divide (Megatron-LM
    megatron/training/arguments.py): seq_len a multiple of 2·cp ('seq-length should be a multiple of
    2 * context-parallel-size', the load-balanced causal split into 2·cp chunks, each rank holding chunks i
    and 2cp − 1 − i) — which also makes cp divide seq_len; the GPUs dp × cp × Σ tp fitting the cluster is
    checked with the other GPU counts (memx.domain.plan.validate_plan, `gpus_per_type`)."""
    cp = getattr(plan, "context_parallel", 1)
    if cp == 1:
        return []
    out = []
    if plan.seq_len % cp:
        out.append(f"field 'seq_len' ({plan.seq_len}) is not divisible by context_parallel ({cp})")
    if plan.seq_len % (2 * cp):
        out.append(f"field 'seq_len' ({plan.seq_len}) is not divisible by 2 × context_parallel ({2 * cp}), "
                   "which Megatron-LM's load-balanced causal split needs")
    return out


def rank_equivalent(plan: Any) -> Any:
    """The cp = 1 plan whose every GPU does what `plan`'s does apart from the ring attention (module docstring):
    dp·cp replicas, seq_len s/cp, global batch gb·cp (m unchanged). `plan` itself when cp = 1."""
    cp = getattr(plan, "context_parallel", 1)
    if cp == 1:
        return plan
    return dataclasses.replace(plan, dp=plan.dp * cp, seq_len=plan.seq_len // cp, global_batch=plan.global_batch * cp,
                               context_parallel=1, idle_gpus=None)


def cp_groups(where: list[list[int]], cp: int, stage: int) -> list[list[int]]:
    """The nodes of each cp group of `stage` in a rank-equivalent placement (`where`: node per (replica, stage)
    of the dp·cp replicas, memx.domain.plan.place_plan): replicas g·cp … g·cp + cp − 1 form group g (ranks
    ordered cp before dp)."""
    return [[where[g * cp + c][stage] for c in range(cp)] for g in range(len(where) // cp)]
