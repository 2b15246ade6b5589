"""The virtual cluster's step-level collectives besides the DP gradient ring (issue #23; docs/simulator.md
§Step-level collectives). Its own reading of what Megatron-LM runs (nothing here reads the planner):

- **Tied embeddings at pp > 1**: the last stage keeps a copy of the word embedding, and once per step, after
  the DP gradient sync and before the optimizer step, every (replica, tp rank)'s first- and last-stage ranks
  all-reduce that weight's gradient (megatron/core/distributed/finalize_model_grads.py, finalize_model_grads:
  `finish_grad_sync`, then `_allreduce_word_embedding_grads`, an all_reduce of `weight.main_grad` over the
  embedding group). The tensor is the rank's vocab/tp × hidden shard in the main-grad dtype
  (physics.GRAD_BYTES_OF: fp32 under bf16 / fp8, fp16 under fp16); a ring of 2 members (links.ring: the
  slowest hop at the sender's link efficiency, each step the collective step latency + the link latency),
  every replica's tp rings at once through the nodes' NICs. It is a blocking collective: both ends start it
  when the later of them has finished its DP step, and both leave it together (`synchronised`). With different
  tp at the two ends (FlagScale) the larger shard is sent (simulator assumption).
- **The same with a data-parallel degree per stage** (FlagScale's per-mesh dp, memx.domain.stage_dp): the
  embedding groups are FlagScale's, one per pipeline path (memx.domain.stage_dp.embedding_groups: a first-stage
  rank may sit in several, a last-stage one too), every (tp, cp) coordinate's at once; a rank runs its groups'
  all-reduces one after another in their order, each blocking: it starts when both its ranks have left their
  previous one (or their stage's DP step) and ends for both together (`mesh_embedding_sync`). The bytes of one
  are the shard's share embedding_groups gives (FlagScale's partial reduce with the distributed optimizer).
- **One DP collective per model chunk**: Megatron-LM wraps each interleaved model chunk in its own
  DistributedDataParallel with its own gradient buffer, and without `--overlap-grad-reduce` a buffer is one
  bucket (megatron/core/distributed/distributed_data_parallel.py: bucket_size None) — so a rank of an
  interleaved plan runs v DP collectives of 1/v of its gradients each: the same bytes, v times the ring's
  2(r − 1) latency steps (`chunk_latency_ms`).
- **The gradient-norm barrier**: with `--clip-grad` > 0 (Megatron-LM's default 1.0) the optimizer's step first
  computes the global gradient norm, an all-reduce of one fp32 number over the grad-stats group
  (megatron/core/optimizer/clip_grads.py get_grad_norm_fp32; the group is the model-parallel group, tp × pp
  ranks of one replica, or every rank with the distributed optimizer: megatron/core/optimizer/optimizer.py
  get_grad_stats_parallel_group, distrib_optimizer.py). No rank starts its Adam step before every rank of the
  group has finished its DP step, so the iteration ends at max_s ready_s + the all-reduce + max_s optimizer_s
  (`step_end`), not at max_s (ready_s + optimizer_s). The all-reduce of 4 bytes is latency-bound; NCCL
  runs such messages on its tree algorithm, 2·⌈log2 n⌉ steps (Sanders, Speck & Träff 2009, double binary
  trees; simulator assumption: each step the slowest member's collective step latency plus the largest link
  latency among the group's nodes, `grad_norm_ms`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from memx.domain.plan import Plan
from memx.domain.stage_dp import embedding_groups
from memx.domain.specs import Cluster, ModelArch
from memx.simulator.links import link, ring, ring_flows
from memx.simulator.physics import GRAD_BYTES_OF, ring_allreduce_ms
from memx.simulator.traits import GpuTraits


def embedding_allreduce_ms(plan: Plan, model: ModelArch, cluster: Cluster, where: list[list[int]],
                           tr: dict[str, GpuTraits]) -> float:
    """The tied embedding's gradient all-reduce of the slowest replica (module docstring); 0 untied or at pp 1."""
    if not (model.tied_embeddings and plan.pp > 1):
        return 0.0
    first, last = plan.stages[0], plan.stages[-1]
    tp = min(first.tp, last.tp)
    nbytes = GRAD_BYTES_OF[plan.precision] * model.vocab * model.hidden / tp
    pairs = [[w[0], w[-1]] for w in where]
    every: Counter = sum((ring_flows(p, tp) for p in pairs), Counter())
    out = 0.0
    for p in pairs:
        own = ring_flows(p, tp)
        bw, step = ring(cluster, p, [tr[first.gpu], tr[last.gpu]], tp, every - own)
        out = max(out, ring_allreduce_ms(nbytes, 2, bw, step))
    return out


def synchronised(ready: list[float], emb_ms: float) -> list[float]:
    """Each stage's time after its DP step (`ready`) with the embedding all-reduce: the first and last stage
    leave it together, `emb_ms` after the later of them arrives; the others unchanged."""
    if emb_ms <= 0.0 or len(ready) < 2:
        return ready
    both = max(ready[0], ready[-1]) + emb_ms
    return [both, *ready[1:-1], both]


def chunk_latency_ms(plan: Plan, cluster: Cluster, where: list[list[int]], tr: dict[str, GpuTraits]) -> list[float]:
    """Per stage, the latency of the v − 1 further DP collectives of an interleaved plan (module docstring):
    (v − 1) · 2(r − 1) ring steps over the stage's replicas (r = plan.dp); 0 for plain 1F1B."""
    v, r = plan.virtual_stages, plan.dp
    if v <= 1 or r <= 1:
        return [0.0] * plan.pp
    out = []
    for s, st in enumerate(plan.stages):
        _, step = ring(cluster, [where[k][s] for k in range(r)], [tr[st.gpu]] * r, st.tp)
        out.append((v - 1) * 2.0 * (r - 1) * step)
    return out


def mesh_embedding_sync(plan: Plan, model: ModelArch, cluster: Cluster, where: list[list[int]],
                        tr: dict[str, GpuTraits], first_ready: float, last_ready: float) -> tuple[float, float]:
    """When the first and the last stage of a per-stage-dp plan (`where`: each stage's TP group nodes, group
    g·cp + c cp rank c of dp rank g) leave the tied embedding's all-reduces, both having left their DP step at
    `first_ready` / `last_ready` (module docstring); the ready times unchanged untied or at pp 1."""
    if not (model.tied_embeddings and plan.pp > 1):
        return first_ready, last_ready
    first, last, cp = plan.stages[0], plan.stages[-1], plan.context_parallel
    tp = min(first.tp, last.tp)
    nbytes = GRAD_BYTES_OF[plan.precision] * model.vocab * model.hidden / tp
    groups = embedding_groups(plan)
    pairs = {(f, l_, c): [where[0][f * cp + c], where[-1][l_ * cp + c]] for f, l_, _ in groups for c in range(cp)}
    every: Counter = sum((ring_flows(p, tp) for p in pairs.values()), Counter())
    done_f: dict[int, float] = {}
    done_l: dict[int, float] = {}
    for f, l_, share in groups:  # in order: each rank's groups one after another
        ms = 0.0
        for c in range(cp):  # the cp coordinates' all-reduces run at once, on their own ranks
            p = pairs[(f, l_, c)]
            bw, step = ring(cluster, p, [tr[first.gpu], tr[last.gpu]], tp, every - ring_flows(p, tp))
            ms = max(ms, ring_allreduce_ms(share * nbytes, 2, bw, step))
        end = max(done_f.get(f, first_ready), done_l.get(l_, last_ready)) + ms
        done_f[f] = done_l[l_] = end
    return max(done_f.values()), max(done_l.values())


def grad_norm_ms(cluster: Cluster, members: Sequence[tuple[int, GpuTraits]]) -> float:
    """The gradient norm's all-reduce over the grad-stats group `members` ((node, traits) per rank): 2·⌈log2 n⌉
    tree steps (module docstring); 0 for one rank."""
    n = len(members)
    if n <= 1:
        return 0.0
    nodes = sorted({node for node, _ in members})
    lat = max((link(cluster, a, b)[1] for a, b in zip(nodes, nodes[1:])), default=0.0)
    step = max(t.collective_step_latency_ms for _, t in members) + lat
    return 2.0 * math.ceil(math.log2(n)) * step


def step_end(ready: Sequence[float], optimizer_ms: Sequence[float], norm_ms: float | None) -> float:
    """When the last stage has done its Adam step, each stage ready (DP step done) at `ready`: behind the
    gradient-norm barrier every stage starts it `norm_ms` after the last of them is ready (module docstring);
    None (--clip-grad 0): each stage right after its own DP step."""
    if norm_ms is None:
        return float(max(r + o for r, o in zip(ready, optimizer_ms)))
    return float(max(ready)) + norm_ms + float(max(optimizer_ms))
