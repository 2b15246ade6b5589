"""A data-parallel degree per stage (issue #27; docs/architecture.md §Plan JSON, docs/planner.md §Data parallel
per stage).

FlagScale's heterogeneous training gives every process mesh its own [tp, cp, ep, dp, pp]
(flagscale/train/arguments.py `pre_validate_args`; Metis, Um et al. 2024 §4, and HexiScale search the same
form): a stage of 4 GPUs at tp 2 × dp 2 may feed a stage at tp 4 × dp 1. FlagScale's rule, which the plan
follows: the job's `data_parallel_size` and `micro_batch_size` are the FIRST mesh's ("Use the first data
parallel size as the global data parallel size to loader data"), so one micro batch holds B = dp_0 · b_0
samples and m = global_batch / B micro batches run through every stage; a mesh with dp_i ranks splits each
micro batch dp_i ways, per-rank micro batch b_i = B / dp_i (`args.micro_batch_size = data_parallel_size ·
micro_batch_size // dp`), and FlagScale asserts `data_parallel_size * micro_batch_size % dp_i == 0` for every
mesh. Between two stages the activation of shape [s, B, h] is re-sliced along the batch (and, with sequence
parallelism, the sequence): source rank k of dp_a sends each destination rank whose batch segment overlaps its
own the overlapping rows (flagscale/train/hetero/parallel_context.py `find_overlapped_mapping`,
`get_inter_mesh_tensor_slices`) — `handoff` below; the gradients come back the same way.

In the plan, `dp` and `micro_batch` keep meaning stage 0's (so m = global_batch / (dp × micro_batch) as
before) and a stage may carry `data_parallel` (its dp_i; absent: the plan's dp). Older plans have none and
load unchanged. Context parallelism combines with it: one cp for the plan (FlagScale's pre_validate_args asserts every
mesh's cp equal; its heterogeneous ParallelContext then asserts cp == 1, so FlagScale does not start such a plan
today: memx.planner.context_parallel.launcher_runs_cp), each stage holding dp_i · cp TP groups (`stage_groups`).
The tied embedding's gradient all-reduce between the first and last stage follows FlagScale's pipeline paths
(`embedding_groups`). This module is pure domain (who holds what, who sends to whom): the planner
(memx.planner.stage_dp) and the virtual cluster (memx.simulator.stage_dp) each put their own costs on it.
"""

from __future__ import annotations

import functools
import math
from typing import Any


def stage_dps(plan: Any) -> tuple[int, ...]:
    """dp_i of every stage: its `data_parallel`, else the plan's dp."""
    return tuple(plan.dp if getattr(st, "data_parallel", None) is None else st.data_parallel for st in plan.stages)


def has_stage_dp(plan: Any) -> bool:
    """Whether some stage's dp differs from the plan's (a schema-2 plan has none)."""
    return hasattr(plan, "stages") and any(d != plan.dp for d in stage_dps(plan))


def samples_per_micro_batch(plan: Any) -> int:
    """B = dp_0 · b_0: the samples of one micro batch, split dp_i ways on stage i (FlagScale, module docstring)."""
    return plan.dp * plan.micro_batch


def stage_micro_batches(plan: Any) -> tuple[int, ...]:
    """b_i = B / dp_i, the per-rank micro batch of every stage (FlagScale pre_validate_args)."""
    b = samples_per_micro_batch(plan)
    return tuple(b // d for d in stage_dps(plan))


def stage_dp_problems(plan: Any, model: Any) -> list[str]:
    """One message per factor a per-stage dp breaks (empty for a plan without one). FlagScale's assertions
    (flagscale/train/arguments.py pre_validate_args): stage 0's dp is the job's (`data_parallel_size =
    hetero_process_meshes_dp[0]`); every dp_i divides B = dp × micro_batch; with tied embeddings and the
    distributed optimizer, dp_0 and dp_last divide one another. Context parallelism combines (one cp for the
    whole plan: pre_validate_args asserts 'all hetero_process_meshes_cp ... should be the same'; its checks are
    memx.domain.context_parallel's). What does not (FlagScale refuses the first: `pre_validate_args` asserts
    'virtual pipeline not support now!' whenever enable_hetero is set): virtual_stages > 1. A mixture-of-experts
    model combines (ep 1: session 14; ep > 1: session 15): FlagScale's meshes take an ep each (`hetero_process_meshes`
    [tp, cp, ep, dp, pp]; examples/deepseek_v3/conf/train/hetero.yaml runs ep 2 on meshes of dp 4, 2, 2) and each
    mesh builds its expert grid from its own tp · cp · dp_i ranks (hetero/parallel_context.py ProcessMesh: 'world_size
    is not divisible by expert_tensor_model_pipeline_parallel size'), so each stage's ep_i (`stage_eps`: its
    `expert_parallel`, else the plan's) divides its dp_i · cp (expert tp = tp) and the model's experts; the first
    stage's is the plan's, and pre_validate_args asserts every mesh's ep is 1 or none is; a stage's experts reduce
    over its dp_i · cp / ep_i expert-dp ranks (memx.planner.stage_dp). A stage's own expert_parallel needs a
    per-stage dp (stock Megatron-LM has one ep for every stage)."""
    raw = [getattr(st, "data_parallel", None) for st in plan.stages]
    own_ep = [getattr(st, "expert_parallel", None) for st in plan.stages]
    if all(d is None for d in raw + own_ep):
        return []
    out = []
    if raw[0] is not None and raw[0] != plan.dp:
        out.append(f"stages[0].data_parallel ({raw[0]}) must equal field 'dp' ({plan.dp}): the first stage's dp is "
                   "the job's data-parallel size (FlagScale: data_parallel_size = the first mesh's dp)")
    b = samples_per_micro_batch(plan)
    out += [f"stages[{i}].data_parallel ({d}) does not divide dp × micro_batch ({plan.dp} × {plan.micro_batch} = "
            f"{b} samples per micro batch; FlagScale asserts data_parallel_size * micro_batch_size % dp_i == 0)"
            for i, d in enumerate(stage_dps(plan)) if b % d]
    if not has_stage_dp(plan):
        given = [i for i, e in enumerate(own_ep) if e is not None and e != plan.expert_parallel]
        return out + ([f"stages[{', '.join(map(str, given))}].expert_parallel differ from field 'expert_parallel' "
                       f"({plan.expert_parallel}) in a plan without a per-stage data_parallel: one ep for every stage "
                       "there (Megatron-LM); a per-stage ep needs FlagScale's meshes of their own dp"] if given else [])
    if plan.virtual_stages > 1:
        out.append(f"field 'virtual_stages' ({plan.virtual_stages}) with a per-stage data_parallel: not supported "
                   "(FlagScale: 'virtual pipeline not support now!' with heterogeneous meshes); allowed: 1")
    dps = stage_dps(plan)
    return out + _stage_ep_problems(plan, model, own_ep) + _tied_problems(plan, model, dps)


def stage_eps(plan: Any) -> tuple[int, ...]:
    """ep_i of every stage: its `expert_parallel`, else the plan's (FlagScale's per-mesh ep; module docstring)."""
    return tuple(getattr(plan, "expert_parallel", 1) if getattr(st, "expert_parallel", None) is None
                 else st.expert_parallel for st in plan.stages)


def _stage_ep_problems(plan: Any, model: Any, own_ep: list[int | None]) -> list[str]:
    """A per-stage-dp plan's ep per stage (stage_dp_problems' docstring)."""
    eps, dps, cp, out = stage_eps(plan), stage_dps(plan), plan.context_parallel, []
    if own_ep[0] is not None and own_ep[0] != plan.expert_parallel:
        out.append(f"stages[0].expert_parallel ({own_ep[0]}) must equal field 'expert_parallel' "
                   f"({plan.expert_parallel}): the first stage's ep is the job's")
    if 1 in eps and any(e > 1 for e in eps):
        out.append(f"expert_parallel per stage {list(eps)}: every stage's must be 1 or none may be (FlagScale "
                   "pre_validate_args: 'all hetero_process_meshes_ep ... should be the 1 or none ... is not 1')")
    experts = getattr(model, "num_experts", None)
    for i, (e, d) in enumerate(zip(eps, dps)):
        name = f"stages[{i}].expert_parallel" if own_ep[i] is not None else "field 'expert_parallel'"
        if e > 1 and (d * cp) % e:
            out.append(f"{name} ({e}) does not divide stages[{i}].data_parallel × context_parallel ({d} × {cp}): "
                       "each mesh's tp × cp × dp GPUs split into expert tp (= tp) × ep × expert dp (FlagScale "
                       "ProcessMesh)")
        if own_ep[i] is None or e == plan.expert_parallel or e == 1:
            continue  # the plan's own ep: memx.domain.plan.moe_problems
        if not experts:
            out.append(f"{name} ({e}) needs a mixture-of-experts model; {model.name} has no 'num_experts'")
        elif experts % e:
            out.append(f"{name} ({e}) does not divide num_experts ({experts}) of model {model.name}")
    return out


def _tied_problems(plan: Any, model: Any, dps: tuple[int, ...]) -> list[str]:
    out = []
    if (getattr(model, "tied_embeddings", False) and plan.distributed_optimizer
            and dps[0] % dps[-1] and dps[-1] % dps[0]):
        out.append(f"tied embeddings with the distributed optimizer need the first and last stage's dp ({dps[0]}, "
                   f"{dps[-1]}) to divide one another (FlagScale pre_validate_args)")
    return out


def segments(n: int, total: int) -> list[tuple[int, int]]:
    """The n equal [start, end) segments of `total` rows (FlagScale find_overlapped_mapping)."""
    step = total // n
    return [(i * step, (i + 1) * step) for i in range(n)]


def handoff(dp_a: int, dp_b: int) -> list[tuple[int, int, int]]:
    """(source rank, destination rank, rows) of every piece one micro batch's activation moves from a stage of
    dp_a ranks to one of dp_b ranks, rows counted in units of B / lcm(dp_a, dp_b) samples: rank k of one side
    holds the k-th of its equal batch segments, and every overlapping pair exchanges the overlap
    (flagscale/train/hetero/parallel_context.py find_overlapped_mapping). Equal dp: rank k → rank k, whole."""
    total = math.lcm(dp_a, dp_b)
    out = []
    for a, (s1, e1) in enumerate(segments(dp_a, total)):
        for b, (s2, e2) in enumerate(segments(dp_b, total)):
            if s1 < e2 and e1 > s2:
                out.append((a, b, min(e1, e2) - max(s1, s2)))
    return out


def stage_groups(plan: Any) -> tuple[int, ...]:
    """TP groups of every stage: dp_i · cp (with context parallelism the ranks are ordered tp, cp, dp, pp —
    FlagScale's ProcessMesh order 'tp-cp-ep-dp-pp', hetero/parallel_context.py — so group g·cp + c is cp rank c of
    the stage's dp rank g)."""
    cp = getattr(plan, "context_parallel", 1)
    return tuple(d * cp for d in stage_dps(plan))


def place_stage_groups(plan: Any, cluster: Any, free: list[int] | None = None) -> list[list[int]] | None:
    """Per stage, the node of each of its dp_i · cp TP groups (`stage_groups`; first-fit, stage by stage, as
    memx.domain.plan.place_plan packs replicas), or None when they do not fit; `free` (GPUs left per node) is
    consumed where given."""
    key = tuple((st.gpu, st.tp, g) for st, g in zip(plan.stages, stage_groups(plan)))
    if free is not None:
        return _first_fit(cluster, key, free)
    placed = _placed(cluster, key)  # a search places the same few thousand layouts many times
    return None if placed is None else [list(row) for row in placed]


@functools.lru_cache(maxsize=1 << 14)
def _placed(cluster: Any, key: tuple[tuple[str, int, int], ...]) -> tuple[tuple[int, ...], ...] | None:
    out = _first_fit(cluster, key, [n.count for n in cluster.nodes])
    return None if out is None else tuple(tuple(row) for row in out)


def _first_fit(cluster: Any, key: tuple[tuple[str, int, int], ...], free: list[int]) -> list[list[int]] | None:
    out = []
    for gpu, tp, groups in key:
        row = []
        for _ in range(groups):
            node = next((i for i, n in enumerate(cluster.nodes) if n.gpu.name == gpu and free[i] >= tp), None)
            if node is None:
                return None
            free[node] -= tp
            row.append(node)
        out.append(row)
    return out


def group_handoff(plan: Any, s: int) -> list[tuple[int, int, int]]:
    """`handoff` from stage s to s + 1 between TP groups (`stage_groups` indices): cp rank c of one stage sends
    to cp rank c of the next (one cp for the plan: the sequence segments match), the batch re-sliced as `handoff`."""
    cp, dps = getattr(plan, "context_parallel", 1), stage_dps(plan)
    return [(a * cp + c, b * cp + c, rows) for a, b, rows in handoff(dps[s], dps[s + 1]) for c in range(cp)]


def embedding_groups(plan: Any) -> list[tuple[int, int, float]]:
    """The tied embedding's gradient all-reduces of one (tp, cp) coordinate, in the order the ranks run them:
    (first-stage dp rank, last-stage dp rank, the share of the rank's vocab/tp × hidden gradient it reduces).

    FlagScale (hetero/parallel_context.py build_global_process_groups): every pipeline path — a rank of each
    stage, consecutive ones joined where their batch segments overlap (`find_overlapped_mapping`, `handoff`) —
    gives the embedding group [its first rank, its last rank]; a rank in several groups all-reduces in each in
    turn (backends/Megatron-LM/.../finalize_model_grads.py.patch `_allreduce_embedding_grad`, `for group in
    embd_group`). With equal dp at every stage this is Megatron-LM's one group per pipeline. What each moves:
    the whole shard, except with the distributed optimizer and different first and last dp, where FlagScale
    requires `use_partial_reduce_for_shared_embedding` (pre_validate_args; memx.report.flagscale sets it) and a
    rank of dp_own ranks in g groups reduces 1 / (dp_own · g) of the shard per group (the rows of its own
    optimizer shard, split over its groups). With the distributed optimizer, equal end dp and a rank in several
    groups FlagScale reduces only in its first group; the cost model charges every group (an upper bound)."""
    dps = stage_dps(plan)
    reach: list[set[int]] = [{k} for k in range(dps[0])]  # per rank of the current stage: the first ranks joined to it
    for s in range(len(dps) - 1):
        nxt: list[set[int]] = [set() for _ in range(dps[s + 1])]
        for a, b, _ in handoff(dps[s], dps[s + 1]):
            nxt[b] |= reach[a]
        reach = nxt
    pairs = sorted((f, last) for last, firsts in enumerate(reach) for f in firsts)
    if not (getattr(plan, "distributed_optimizer", False) and dps[0] != dps[-1]):
        return [(f, last, 1.0) for f, last in pairs]
    per_first = {f: sum(1 for x, _ in pairs if x == f) for f, _ in pairs}
    return [(f, last, 1.0 / (dps[0] * per_first[f])) for f, last in pairs]
