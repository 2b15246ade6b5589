"""Three step-level collectives of the closed form's tail (issue #23; docs/planner.md §1F1B assembly).

All are per-stage constants (they do not depend on a stage's layer count) added to the stage's tail —
optimizer step + T_dp, the terms after the last backward (memx.planner.schedule.stage_tail_ms):

- **The DP collective's latency.** NCCL's ring all-reduce of n ranks runs 2(n − 1) steps, each paying the
  per-hop latency α once: t = 2(n − 1)·α + 2(n − 1)/n · bytes / B (Patarasuk & Yuan 2009 §3; Thakur et al.
  2005 §4.5: the ring's α-β cost). The distributed optimizer's reduce-scatter + all-gather are (n − 1) steps
  each: the same 2(n − 1)·α. memx.planner.cost.dp_step_ms has the bandwidth part; this module the latency
  part, α = the slowest hop's network latency of the stage's dp ring (memx.planner.network.ring_link: the
  cluster YAML's per-node NIC latency, or the cross-vendor latency; 0 inside a node). Megatron-LM issues one
  collective per gradient bucket and model chunk: DistributedDataParallel sets `bucket_size = None` (one
  bucket per gradient buffer) unless `--overlap-grad-reduce` is set (megatron/core/distributed/
  distributed_data_parallel.py: "Set bucket_size to infinity if overlap_grad_reduce is False"; with it the
  default is max(40,000,000, 1,000,000 · dp) parameters, distributed_data_parallel_config.py `bucket_size`,
  and only on pipeline rank 0). MemX's launch scripts (memx.report.megatron) do not pass
  `--overlap-grad-reduce` (the tail is not overlapped with the backward here either), so a rank runs one
  collective per model chunk: v with the interleaved schedule (one DDP module per chunk), 1 otherwise.
- **The tied embedding's gradient all-reduce.** With tied embeddings and pp > 1, Megatron-LM keeps a copy
  of the word embedding on the last stage and all-reduces its gradient with the first stage's over the
  embedding group (each (dp, tp) coordinate's first- and last-stage ranks) once per step, after the DP
  gradient sync and before the optimizer step (megatron/core/distributed/finalize_model_grads.py,
  finalize_model_grads → _allreduce_word_embedding_grads → `torch.distributed.all_reduce(weight.main_grad,
  group=embd_group)`). The tensor is the `main_grad` — the gradient buffer's dtype, fp32 with bf16 / fp8
  (Megatron's `--accumulate-allreduce-grads-in-fp32`), fp16 under fp16 (memx.domain.precision.GRAD_BYTES) —
  of the rank's vocab/tp × hidden shard. A ring of 2 ranks: 2·(2 − 1)/2 · bytes / B + 2·(2 − 1)·α =
  bytes / B + 2α, on the link between the first and last stage's nodes, every replica's and tp rank's pair
  at once, both directions (`embedding_link`). When the two ends have different tp (FlagScale) the larger
  shard, vocab·hidden / min(tp_first, tp_last), is taken (our assumption). The position embedding's
  all-reduce (_allreduce_position_embedding_grads) is for learned absolute positions, which no catalog model
  has (rotary): not modelled.
- **The expert gradients' collective (MoE).** Megatron-LM's DistributedDataParallel groups parameters by
  (dtype, is_expert_parallel) and gives the expert ones (`allreduce = False`) their own buffers over the expert
  data-parallel group `intra_expt_dp_group`, world / (expert tp · ep · pp) = dp·cp/ep ranks, with their own
  bucket groups (`expert_parallel_buffers`, `expert_parallel_bucket_groups`); start_grad_sync /
  finish_grad_sync run the dense bucket groups, then the expert ones — without `--overlap-grad-reduce`
  synchronously, one collective (all-reduce, or reduce-scatter with the distributed optimizer, whose
  parameter all-gather loops the expert buffers too) per model chunk after the dense one
  (megatron/core/distributed/distributed_data_parallel.py). Its ring of n = dp·cp/ep ranks pays its own
  2(n − 1)·α per collective (`expert_dp_latency_ms`), α = the slowest hop of the ep expert-dp rings (replicas
  r ≡ j mod ep; memx.planner.moe.a2a_links); its bandwidth term, on the expert rings' own link, is in
  memx.planner.moe.dp_params_per_rank. 0 for a dense model or at n = 1 (ep = dp·cp: no expert replica).
  A stage (or chunk) holding only a MoE model's dense first layers has no expert buffer: charged anyway
  (the closed form takes every stage to hold a MoE layer, as memx.planner.moe.split_layers does past the first).

Nothing here reads the simulator (which has its own model: memx/simulator/schedule.py, memx/simulator/links.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memx.domain.precision import DEFAULT_PRECISION, GRAD_BYTES
from memx.domain.specs import Cluster, ModelArch
from memx.planner.cost import dp_step_ms
from memx.planner.network import slowest_hop


def dp_latency_ms(dp, step_latency_ms, collectives=1) -> np.ndarray:
    """The latency part of a stage's DP step: 2(n − 1)·α per collective, `collectives` of them (module
    docstring: one per model chunk); 0 at n = 1."""
    n = np.asarray(dp, dtype=np.float64)
    return np.where(n > 1, 2.0 * (n - 1) * np.asarray(step_latency_ms, dtype=np.float64) * collectives, 0.0)


def expert_dp_latency_ms(dp, expert_parallel, expert_links: Sequence[Sequence[float]] | None,
                         collectives: int = 1) -> np.ndarray:
    """(pp,) the latency of each stage's expert-gradient collective (module docstring): `dp_latency_ms` over
    n = dp / ep ranks (`dp`: the pipeline's data-parallel ranks, dp·cp; with a per-stage dp, dp and ep per stage,
    memx.planner.stage_dp) at each stage's expert-dp step latency
    (memx.planner.moe.a2a_links' fourth field), `collectives` of them (one per model chunk); 0 without links."""
    if expert_links is None:
        return np.zeros(0)
    return dp_latency_ms(dp // expert_parallel, [link[3] for link in expert_links], collectives)


def embedding_sync_ms(vocab: int, hidden: int, tp: int, bandwidth_gbps: float, latency_ms: float,
                      precision: str = DEFAULT_PRECISION) -> float:
    """The tied embedding's gradient all-reduce between the first and last stage's ranks: a 2-rank ring,
    bytes / B + 2α with bytes = vocab·hidden/tp · grad bytes (module docstring)."""
    nbytes = vocab * hidden / tp * GRAD_BYTES[precision]
    return nbytes / (bandwidth_gbps * 1e9) * 1e3 + 2.0 * latency_ms


def embedding_link(cluster: Cluster, where: Sequence[Sequence[int]], stage_tp: Sequence[int]) -> tuple[float, float]:
    """(GB/s, latency ms) of the embedding group's all-reduce: every replica's first- and last-stage nodes
    exchange both ways at once, one flow per tp rank (memx.planner.network.slowest_hop)."""
    tp = min(stage_tp[0], stage_tp[-1])
    hops = [h for w in where for h in ((w[0], w[-1]), (w[-1], w[0]))]
    return slowest_hop(cluster, hops, tp)


def tied_embedding_ms(model: ModelArch, stage_tp: Sequence[int], emb_link: tuple[float, float] | None,
                      precision: str = DEFAULT_PRECISION) -> float:
    """The embedding all-reduce of a pipeline with stages of `stage_tp` (`embedding_sync_ms` on `emb_link`,
    `embedding_link`): with tied embeddings at pp > 1 only; 0 otherwise or without a link."""
    if not (model.tied_embeddings and len(stage_tp) > 1 and emb_link is not None):
        return 0.0
    return embedding_sync_ms(model.vocab, model.hidden, min(stage_tp[0], stage_tp[-1]), *emb_link, precision)


def dp_collective_ms(params_per_rank: float, dp: int, link: tuple[float, float], distributed_optimizer: bool,
                     precision: str = DEFAULT_PRECISION, chunks: int = 1) -> float:
    """A stage's whole DP step on its ring `link` (GB/s, step latency ms; memx.planner.network.ring_link):
    memx.planner.cost.dp_step_ms's bandwidth part + `dp_latency_ms` (`chunks` collectives)."""
    bw, lat = link
    return float(dp_step_ms(params_per_rank, dp, bw, distributed_optimizer, precision)) + float(
        dp_latency_ms(dp, lat, chunks))


def tail_collectives_ms(model: ModelArch, *, stage_tp: Sequence[int], dp: int, virtual_stages: int, precision: str,
                        dp_latency: Sequence[float] | None, emb_link: tuple[float, float] | None,
                        expert_parallel: int = 1, expert_links: Sequence[Sequence[float]] | None = None) -> np.ndarray:
    """(pp,) what the step-level collectives add to each stage's tail: the DP step's latency (dp_latency: each
    stage's ring step latency, ms; None: no latency known, 0), one collective per model chunk; a MoE model's
    expert-gradient collective's latency (`expert_dp_latency_ms`; expert_links: memx.planner.moe.a2a_links of the
    plan, None for a dense model); and the tied embedding's all-reduce on the first and last stage
    (`tied_embedding_ms`)."""
    out = np.zeros(len(stage_tp)) if dp_latency is None else dp_latency_ms(dp, dp_latency, virtual_stages)
    if model.is_moe and expert_links is not None:
        out = out + expert_dp_latency_ms(dp, expert_parallel, expert_links, virtual_stages)
    emb = tied_embedding_ms(model, stage_tp, emb_link, precision)
    out[0] += emb  # 0 at pp = 1: one stage holds both ends, nothing to exchange
    out[-1] += emb
    return out
