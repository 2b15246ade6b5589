"""The plan space: layouts (GPU type order, per-stage tp, dp, micro batch) and layer splits.

A layout fixes everything but the layer split and the per-stage recomputation. Stages of one GPU
type are contiguous in the pipeline and share one tp degree (our decision: a type's stages are
interchangeable, so mixing tp inside a type only multiplies the space; documented in
docs/planner.md). Every uneven layer split is enumerated (`splits`), bounded per stage by the cheap
static-memory bound before anything is predicted.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from memx.domain.errors import InputError
from memx.domain.plan import Plan, Recompute, Stage, place_plan
from memx.domain.precision import DEFAULT_PRECISION, resolve_precision
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.planner.context_parallel import cp_links, launcher_runs_cp
from memx.planner.interleave import wrap_gbps
from memx.planner.moe import a2a_links, expert_dp_size, expert_option_problems, expert_parallelisms, with_experts
from memx.planner.collectives import embedding_link
from memx.planner.network import p2p_link, ring_link
from memx.planner.tables import StageContext, stage_contexts


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A pipeline skeleton: stage GPU types and tp, dp, micro batch, and link bandwidths."""

    stage_gpus: tuple[str, ...]
    stage_tp: tuple[int, ...]
    dp: int
    micro_batch: int
    micro_batches: int  # m
    p2p_gbps: tuple[float, ...]  # bandwidth between stage s and s+1 (len pp-1)
    dp_gbps: tuple[float, ...]  # bandwidth of stage s's DP all-reduce ring
    p2p_latency_ms: tuple[float, ...] | None = None  # latency between stage s and s+1; None: the cluster's
    dp_latency_ms: tuple[float, ...] | None = None  # step latency of stage s's DP ring; None: no latency term
    embedding_link: tuple[float, float] | None = None  # first ↔ last stage (GB/s, ms): the tied-embedding all-reduce
    distributed_optimizer: bool = False  # ZeRO-1 over the dp ranks (memx.planner.cost.static_bytes_per_param)
    sequence_parallel: bool = False  # at tp > 1 (Korthikanti et al. 2022)
    virtual_stages: int = 1  # interleaved 1F1B chunks per rank (memx.planner.interleave); 1: plain 1F1B
    wrap_gbps: float | None = None  # interleaved: bandwidth of the last stage → first stage hop
    precision: str = DEFAULT_PRECISION  # the plan's training precision (memx.domain.precision.resolve_precision)
    expert_parallel: int = 1  # MoE (memx.planner.moe): ep, one for every stage
    a2a_links: tuple[tuple[float, float, float, float], ...] | None = None  # MoE: memx.planner.moe.a2a_links; None: dense
    # context parallelism (memx.planner.context_parallel): cp, and each stage's ring (GB/s, latency ms); with
    # cp > 1 the links above are the rank-equivalent plan's (dp·cp replicas)
    context_parallel: int = 1
    cp_links: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def pp(self) -> int:
        return len(self.stage_gpus)

    def contexts(self) -> tuple[StageContext, ...]:
        ctxs = stage_contexts(self.stage_gpus, self.stage_tp, micro_batch=self.micro_batch,
                              micro_batches=self.micro_batches, distributed_optimizer=self.distributed_optimizer,
                              dp=self.dp, sequence_parallel=self.sequence_parallel,
                              virtual_stages=self.virtual_stages, precision=self.precision,
                              context_parallel=self.context_parallel, cp_links=self.cp_links)
        if self.a2a_links is None:
            return ctxs
        return with_experts(ctxs, self.expert_parallel,
                            expert_dp_size(self.dp, self.context_parallel, self.expert_parallel), self.a2a_links)

    def to_plan(self, model: ModelArch, cluster: Cluster, global_batch: int, seq_len: int,
                layers: tuple[int, ...], recompute: tuple[tuple[Recompute, int | None], ...]) -> Plan:
        stages = tuple(
            Stage(gpu=g, tp=t, layers=int(n), recompute=r, recompute_layers=rl)
            for g, t, n, (r, rl) in zip(self.stage_gpus, self.stage_tp, layers, recompute, strict=True)
        )
        return Plan(model=model.name, cluster=cluster.name, global_batch=global_batch,
                    micro_batch=self.micro_batch, seq_len=seq_len, dp=self.dp, stages=stages,
                    distributed_optimizer=self.distributed_optimizer, sequence_parallel=self.sequence_parallel,
                    virtual_stages=self.virtual_stages, precision=self.precision,
                    expert_parallel=self.expert_parallel, context_parallel=self.context_parallel)


def valid_tps(model: ModelArch, cluster: Cluster, gpu: str, options: tuple[int, ...]) -> list[int]:
    """tp divides heads and query groups and fits inside one node of that GPU type."""
    node_max = max(cluster.node_sizes(gpu))
    return [t for t in options if model.heads % t == 0 and model.query_groups % t == 0 and t <= node_max]


def _stage_counts(count: int, dp: int, tp: int, use_all: bool) -> list[int]:
    if count % (dp * tp) == 0 and use_all:
        return [count // (dp * tp)]
    if use_all:
        return []
    return list(range(1, count // (dp * tp) + 1))


def plan_links(cluster: Cluster, plan: Plan) -> tuple | None:
    """(bandwidth between consecutive stages GB/s, bandwidth of each stage's DP ring GB/s, latency between
    consecutive stages ms, each stage's DP ring step latency ms, (GB/s, latency ms) of the first ↔ last stage
    embedding all-reduce) from the first-fit placement (memx.planner.network, docs/planner.md §Network):
    a p2p transfer on the link between the two stages' nodes, the replicas' concurrent transfers sharing the
    NICs they cross (`p2p_link`, the slowest replica); a stage's dp replicas in one
    ring per tp rank, at the ring's slowest hop, the stage's GPUs sharing their nodes' NICs; the embedding
    group's pairs all at once (memx.planner.collectives.embedding_link; None at pp 1: no embedding group)."""
    where = place_plan(plan, cluster)
    if where is None:
        return None
    p2p = tuple(p2p_link(cluster, [(w[s], w[s + 1]) for w in where]) for s in range(plan.pp - 1))
    rings = [ring_link(cluster, [where[r][s] for r in range(plan.dp)], st.tp) for s, st in enumerate(plan.stages)]
    return (tuple(bw for bw, _ in p2p), tuple(bw for bw, _ in rings), tuple(lat for _, lat in p2p),
            tuple(lat for _, lat in rings),
            embedding_link(cluster, where, [st.tp for st in plan.stages]) if plan.pp > 1 else None)


def enumerate_layouts(cluster: Cluster, model: ModelArch, space: SearchSpace) -> list[Layout]:
    """All layouts of the space, in a deterministic order."""
    seq = space.seq_len or model.seq_len
    out: list[Layout] = []
    subsets = gpu_subsets(cluster, space)
    precisions = subset_precisions(cluster, space, subsets)
    count = {g.name: cluster.gpu_count(g.name) for g in cluster.gpu_types}
    for subset in subsets:
        if subset not in precisions:
            continue
        tp_choices = [valid_tps(model, cluster, g, space.tp_options) for g in subset]
        for dp in range(1, min(count[g] for g in subset) + 1):
            for tps in itertools.product(*tp_choices):
                if not launcher_runs(space.launcher, tps):
                    continue
                k_choices = [_stage_counts(count[g], dp, t, space.use_all_gpus) for g, t in zip(subset, tps)]
                for ks in itertools.product(*k_choices):
                    pp = sum(ks)
                    if not (space.min_pp <= pp <= min(space.max_pp, model.layers)):
                        continue
                    for order in itertools.permutations(range(len(subset))):
                        gpus = tuple(subset[i] for i in order for _ in range(ks[i]))
                        tpl = tuple(tps[i] for i in order for _ in range(ks[i]))
                        if not _ends_ok(space.launcher, model, tpl):
                            continue
                        out.extend(_with_micro_batches(cluster, model, space, gpus, tpl, dp, seq,
                                                       precisions[subset]))
    return out


def gpu_subsets(cluster: Cluster, space: SearchSpace) -> list[tuple[str, ...]]:
    """The GPU types a plan may use: all of them (use_all_gpus) or any non-empty subset. With launcher
    `megatron`, the types of one vendor only (one NCCL/RCCL job cannot join vendors: docs/megatron.md); with
    use_all_gpus, every GPU of that vendor."""
    types = [g.name for g in cluster.gpu_types]
    if space.use_all_gpus:
        subsets = [tuple(types)]
        if space.launcher == "megatron":
            vendors = dict.fromkeys(cluster.gpu(t).vendor for t in types)
            subsets = [tuple(t for t in types if cluster.gpu(t).vendor == v) for v in vendors]
        return subsets
    subsets = [c for r in range(1, len(types) + 1) for c in itertools.combinations(types, r)]
    if space.launcher == "megatron":
        subsets = [c for c in subsets if len({cluster.gpu(t).vendor for t in c}) == 1]
    return subsets


def launcher_runs(launcher: str, type_tps: tuple[int, ...]) -> bool:
    """The per-type tp choice is one the launcher starts (SearchSpace.launcher): megatron one tp for every
    stage (one --tensor-model-parallel-size, Megatron-LM arguments.py); flagscale with tied embeddings the same
    tp on the first and the last stage (FlagScale train/arguments.py pre_validate_args) — checked per stage
    order in `_ends_ok`."""
    return launcher != "megatron" or len(set(type_tps)) <= 1


def _ends_ok(launcher: str, model: ModelArch, tps: tuple[int, ...]) -> bool:
    return not (launcher == "flagscale" and model.tied_embeddings and tps[0] != tps[-1])


def subset_precisions(cluster: Cluster, space: SearchSpace, subsets: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """The precision each GPU subset trains in (`space.precision` resolved over its GPUs); a subset that
    cannot run it is left out, and when none can, the InputError (exit 2) names a GPU and its precisions."""
    out: dict[tuple[str, ...], str] = {}
    error: InputError | None = None
    for subset in subsets:
        try:
            out[subset] = resolve_precision(space.precision, [cluster.gpu(g) for g in subset], f"search space {space.name}")
        except InputError as exc:
            error = error or exc
    if not out and error is not None:
        raise error
    return out


def _with_micro_batches(cluster, model, space, gpus, tps, dp, seq, precision=DEFAULT_PRECISION) -> list[Layout]:
    probe = Plan(model=model.name, cluster=cluster.name, global_batch=space.global_batch, micro_batch=1,
                 seq_len=seq, dp=dp, stages=tuple(Stage(gpu=g, tp=t, layers=1) for g, t in zip(gpus, tps)))
    links = plan_links(cluster, probe)
    if links is None:
        return []
    out: list[Layout] = []
    if 1 in space.context_parallel_options:
        out += _layouts(cluster, model, space, probe, links, precision, _experts(cluster, model, space, probe))
    return out + context_parallel_layouts(cluster, model, space, probe, links, precision)


def _layouts(cluster, model, space, probe: Plan, links, precision, experts, cp: int = 1, ring=None) -> list[Layout]:
    """Every micro batch, option and interleaving of the probe's GPUs with cp ranks per replica (dp = probe.dp /
    cp, the probe's placement and links: its rank-equivalent plan) and the expert-parallel sizes `experts`
    ({ep: all-to-all links}; {1: None} for a dense model)."""
    gpus, tps = tuple(st.gpu for st in probe.stages), tuple(st.tp for st in probe.stages)
    dp = probe.dp // cp
    return [
        Layout(stage_gpus=gpus, stage_tp=tps, dp=dp, micro_batch=mb, micro_batches=space.global_batch // (dp * mb),
               p2p_gbps=links[0], dp_gbps=links[1], p2p_latency_ms=links[2], dp_latency_ms=links[3],
               embedding_link=links[4], distributed_optimizer=do,
               sequence_parallel=sp, virtual_stages=v, wrap_gbps=wrap, precision=precision, expert_parallel=ep,
               a2a_links=a2a, context_parallel=cp, cp_links=ring)
        for mb in space.micro_batch_options
        if space.global_batch % (dp * mb) == 0
        for do in _effective(space.distributed_optimizer, probe.dp > 1)  # the optimizer shards over dp·cp ranks
        for sp in _effective(space.sequence_parallel, max(tps) > 1)
        for v in interleavings(space, len(gpus), space.global_batch // (dp * mb), model.layers)
        for wrap in [wrap_gbps(cluster, probe) if v > 1 else None]
        for ep, a2a in experts.items()
        if sp or max(tps) == 1 or not model.is_moe  # Megatron: MoE with tp > 1 needs it (memx.domain.plan.moe_problems)
    ]


def context_sizes(space: SearchSpace, replicas: int, seq_len: int) -> list[int]:
    """The cp > 1 of SearchSpace.context_parallel_options a layout of `replicas` TP groups per stage runs: cp
    divides the replicas (dp = replicas / cp) and 2·cp the sequence (memx.domain.context_parallel)."""
    return [cp for cp in space.context_parallel_options if cp > 1 and replicas % cp == 0 and seq_len % (2 * cp) == 0]


def context_parallel_layouts(cluster, model, space, probe: Plan, links, precision) -> list[Layout]:
    """The layouts of the probe's GPUs with context parallelism: `probe` (dp = r replicas) read as dp = r/cp
    with cp ranks each — the same placement and links (its rank-equivalent plan), m = global_batch / (dp·mb).
    A mixture-of-experts model's ep groups are carved from the r = dp·cp ranks (memx.domain.plan.moe_problems):
    the ep values and all-to-all links are the rank-equivalent probe's."""
    gpus = [cluster.gpu(g) for g in dict.fromkeys(st.gpu for st in probe.stages)]
    if not launcher_runs_cp(space.launcher, gpus):
        return []
    experts = _experts(cluster, model, space, probe)
    return [layout for cp in context_sizes(space, probe.dp, probe.seq_len)
            for layout in _layouts(cluster, model, space, probe, links, precision, experts, cp,
                                   cp_links(cluster, dataclasses.replace(probe, dp=probe.dp // cp, context_parallel=cp)))]


def _experts(cluster, model, space, probe: Plan) -> dict:
    """{ep: its all-to-all links per stage} of the probe's replicas (memx.planner.moe.a2a_links); {1: None} for a
    dense model."""
    return {ep: a2a_links(cluster, dataclasses.replace(probe, expert_parallel=ep)) if model.is_moe else None
            for ep in expert_parallelisms(space, model, probe.dp)}


def interleavings(space: SearchSpace, pp: int, micro_batches: int, layers: int) -> list[int]:
    """The virtual-stage counts searched for a layout (SearchSpace.virtual_stages_options): 1 always when
    listed; v > 1 only where Megatron's interleaved schedule runs it (pp > 1, m a multiple of pp,
    memx.domain.plan.interleave_problems) and every stage can hold v layers (layers ≥ v·pp)."""
    return [v for v in space.virtual_stages_options
            if v == 1 or (pp > 1 and micro_batches % pp == 0 and layers >= v * pp)]


def _effective(options: tuple[bool, ...], matters: bool) -> tuple[bool, ...]:
    """The option values searched for one layout: all of them where the option changes the job, else
    only the first listed (the distributed optimizer at dp 1 and sequence parallelism at tp 1 change
    nothing, so [false, true] would only repeat the same plans)."""
    return options if matters else options[:1]


def check_space_input(model: ModelArch, space: SearchSpace) -> None:
    if not any(space.global_batch % mb == 0 for mb in space.micro_batch_options):
        raise InputError(
            f"search '{space.name}': field 'global_batch' ({space.global_batch}) is not divisible by any "
            f"'micro_batch_options' value {list(space.micro_batch_options)}"
        )
    if not any(model.heads % t == 0 and model.query_groups % t == 0 for t in space.tp_options):
        raise InputError(
            f"search '{space.name}': no value of field 'tp_options' {list(space.tp_options)} divides heads "
            f"({model.heads}) and query_groups ({model.query_groups}) of model {model.name}"
        )
    if problems := expert_option_problems(space, model):
        raise InputError(problems[0])


def splits(total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """All compositions of `total` layers into len(lo) stages with lo[s] ≤ n_s ≤ hi[s].

    Returns an int16 array (n_splits, pp), rows in lexicographic order (`splits_many` of one box)."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    return splits_many(total, lo[None, :], hi[None, :])[0]


def splits_many(total: int, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The splits of many boxes at once (issue #26: one call for all the leaves of a branch-and-bound round):
    every composition of `total` into P stages with lo[i, s] ≤ n_s ≤ hi[i, s], for each box i of lo, hi (B, P).

    Returns (splits (N, P) int16, box (N,) int64): box i's rows together, boxes in order, each box's rows in
    lexicographic order — the rows of `splits` of each box, concatenated. Built stage by stage with numpy
    repeat/cumsum (values and parent pointers), then read back along the parents: O(N·P), never a Python loop
    per split or per box. A partial split takes only values that leave the rest reachable (left − Σ hi of the
    later stages ≤ n_s ≤ left − Σ lo of them), so no partial split is a dead end."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.minimum(np.asarray(hi, dtype=np.int64), total)
    B, pp = lo.shape
    ok = (lo <= hi).all(axis=1) & (lo.sum(axis=1) <= total) & (hi.sum(axis=1) >= total)
    if pp == 0 or not ok.any():
        return np.zeros((0, pp), dtype=np.int16), np.zeros(0, dtype=np.int64)
    rest_lo = np.cumsum(lo[:, ::-1], axis=1)[:, ::-1] - lo  # Σ lo of the later stages
    rest_hi = np.cumsum(hi[:, ::-1], axis=1)[:, ::-1] - hi
    box = np.nonzero(ok)[0]
    left = np.full(len(box), total, dtype=np.int64)
    values, parents = [], []
    for s in range(pp):
        vmin = np.maximum(lo[box, s], left - rest_hi[box, s])
        vmax = np.minimum(hi[box, s], left - rest_lo[box, s])
        cnt = np.maximum(vmax - vmin + 1, 0)
        idx = np.repeat(np.arange(len(left), dtype=np.int64), cnt)
        vals = vmin[idx] + (np.arange(idx.size) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        values.append(vals.astype(np.int16))
        parents.append(idx)
        left, box = left[idx] - vals, box[idx]
    out = np.empty((len(values[-1]), pp), dtype=np.int16)
    row = np.arange(len(values[-1]), dtype=np.int64)
    for s in range(pp - 1, -1, -1):
        out[:, s] = values[s][row]
        row = parents[s][row]
    return out, box


@lru_cache(maxsize=None)
def count_compositions(total: int, pp: int) -> int:
    """C(total−1, pp−1): layer splits with every stage ≥ 1 layer."""
    return math.comb(total - 1, pp - 1) if pp >= 1 else 0


@lru_cache(maxsize=None)
def count_with_options(total: int, pp: int, options: tuple[int, ...]) -> int:
    """Σ over splits of Π_s options_s(n_s): the plan space including per-stage recompute choices.

    options[n] = number of recompute choices for a stage of n layers, the same for every stage.
    Computed by polynomial multiplication (generating functions), exact in Python integers.
    """
    poly = [1]
    for opts in [options] * pp:
        nxt = [0] * (total + 1)  # terms above x^total never reach it
        for i, a in enumerate(poly):
            if a:
                for n in range(1, len(opts)):
                    if opts[n] and i + n <= total:
                        nxt[i + n] += a * int(opts[n])
        poly = nxt
    return poly[total] if total < len(poly) else 0
