"""The plan space: layouts (GPU type order, per-stage tp, dp, micro batch) and layer splits.

A layout fixes everything but the layer split and the per-stage recomputation. Stages of one GPU
type are contiguous in the pipeline and share one tp degree (our decision: a type's stages are
interchangeable, so mixing tp inside a type only multiplies the space; documented in
docs/planner.md). Every uneven layer split is enumerated (`splits`), bounded per stage by the cheap
static-memory bound before anything is predicted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from memx.domain.errors import InputError
from memx.domain.plan import Plan, Recompute, Stage, place_plan
from memx.domain.errors import InputError
from memx.domain.precision import DEFAULT_PRECISION, resolve_precision
from memx.domain.specs import Cluster, ModelArch, SearchSpace
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
    distributed_optimizer: bool = False  # ZeRO-1 over the dp ranks (memx.planner.cost.static_bytes_per_param)
    sequence_parallel: bool = False  # at tp > 1 (Korthikanti et al. 2022)
    precision: str = DEFAULT_PRECISION  # the plan's training precision (memx.domain.precision.resolve_precision)

    @property
    def pp(self) -> int:
        return len(self.stage_gpus)

    def contexts(self) -> tuple[StageContext, ...]:
        return stage_contexts(self.stage_gpus, self.stage_tp, micro_batch=self.micro_batch,
                              micro_batches=self.micro_batches, distributed_optimizer=self.distributed_optimizer,
                              dp=self.dp, sequence_parallel=self.sequence_parallel, precision=self.precision)

    def to_plan(self, model: ModelArch, cluster: Cluster, global_batch: int, seq_len: int,
                layers: tuple[int, ...], recompute: tuple[tuple[Recompute, int | None], ...]) -> Plan:
        stages = tuple(
            Stage(gpu=g, tp=t, layers=int(n), recompute=r, recompute_layers=rl)
            for g, t, n, (r, rl) in zip(self.stage_gpus, self.stage_tp, layers, recompute, strict=True)
        )
        return Plan(model=model.name, cluster=cluster.name, global_batch=global_batch,
                    micro_batch=self.micro_batch, seq_len=seq_len, dp=self.dp, stages=stages,
                    distributed_optimizer=self.distributed_optimizer, sequence_parallel=self.sequence_parallel,
                    precision=self.precision)


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


def plan_links(cluster: Cluster, plan: Plan) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(bandwidth between consecutive stages, bandwidth of each stage's DP ring) in GB/s, from the
    first-fit placement: intra-node when both ends share a node, else the inter-node links."""
    where = place_plan(plan, cluster)
    if where is None:
        return None
    inter = cluster.inter_node_bandwidth_gbps
    intra = {g.name: g.intra_node_bandwidth_gbps for g in cluster.gpu_types}
    r0 = where[0]
    p2p = tuple(
        intra[plan.stages[s].gpu] if r0[s] == r0[s + 1] else inter for s in range(plan.pp - 1)
    )
    dpbw = tuple(
        intra[st.gpu] if len({where[r][s] for r in range(plan.dp)}) == 1 else inter
        for s, st in enumerate(plan.stages)
    )
    return p2p, dpbw


def enumerate_layouts(cluster: Cluster, model: ModelArch, space: SearchSpace) -> list[Layout]:
    """All layouts of the space, in a deterministic order."""
    types = [g.name for g in cluster.gpu_types]
    subsets = [tuple(types)] if space.use_all_gpus else [
        c for r in range(1, len(types) + 1) for c in itertools.combinations(types, r)
    ]
    seq = space.seq_len or model.seq_len
    out: list[Layout] = []
    precisions = subset_precisions(cluster, space, subsets)
    for subset in subsets:
        if subset not in precisions:
            continue
        min_count = min(cluster.gpu_count(g) for g in subset)
        for dp in range(1, min_count + 1):
            tp_choices = [valid_tps(model, cluster, g, space.tp_options) for g in subset]
            for tps in itertools.product(*tp_choices):
                k_choices = [_stage_counts(cluster.gpu_count(g), dp, t, space.use_all_gpus) for g, t in zip(subset, tps)]
                for ks in itertools.product(*k_choices):
                    pp = sum(ks)
                    if not (space.min_pp <= pp <= min(space.max_pp, model.layers)):
                        continue
                    for order in itertools.permutations(range(len(subset))):
                        gpus = tuple(subset[i] for i in order for _ in range(ks[i]))
                        tpl = tuple(tps[i] for i in order for _ in range(ks[i]))
                        out.extend(_with_micro_batches(cluster, model, space, gpus, tpl, dp, seq,
                                                       precisions[subset]))
    return out


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
    return [
        Layout(stage_gpus=gpus, stage_tp=tps, dp=dp, micro_batch=mb, micro_batches=space.global_batch // (dp * mb),
               p2p_gbps=links[0], dp_gbps=links[1], distributed_optimizer=do, sequence_parallel=sp, precision=precision)
        for mb in space.micro_batch_options
        if space.global_batch % (dp * mb) == 0
        for do in _effective(space.distributed_optimizer, dp > 1)
        for sp in _effective(space.sequence_parallel, max(tps) > 1)
    ]


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


def splits(total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """All compositions of `total` layers into len(lo) stages with lo[s] ≤ n_s ≤ hi[s].

    Returns an int16 array (n_splits, pp), rows in lexicographic order. Built stage by stage with
    numpy repeat/cumsum (values and parent pointers), then read back along the parents: O(N·pp),
    never a Python loop per split.
    """
    pp = len(lo)
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.minimum(np.asarray(hi, dtype=np.int64), total)
    if pp == 0 or np.any(lo > hi) or lo.sum() > total or hi.sum() < total:
        return np.zeros((0, pp), dtype=np.int16)
    rest_lo = np.concatenate([np.cumsum(lo[::-1])[::-1][1:], [0]])
    rest_hi = np.concatenate([np.cumsum(hi[::-1])[::-1][1:], [0]])
    left = np.array([total], dtype=np.int64)
    values, parents = [], []
    for s in range(pp):
        vmin = np.maximum(lo[s], left - rest_hi[s])
        vmax = np.minimum(hi[s], left - rest_lo[s])
        cnt = np.maximum(vmax - vmin + 1, 0)
        idx = np.repeat(np.arange(len(left), dtype=np.int64), cnt)
        vals = vmin[idx] + (np.arange(idx.size) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        values.append(vals.astype(np.int16))
        parents.append(idx)
        left = left[idx] - vals
    out = np.empty((len(values[-1]), pp), dtype=np.int16)
    row = np.arange(len(values[-1]), dtype=np.int64)
    for s in range(pp - 1, -1, -1):
        out[:, s] = values[s][row]
        row = parents[s][row]
    return out


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
        nxt = [0] * (len(poly) + len(opts))
        for i, a in enumerate(poly):
            if a:
                for n in range(1, len(opts)):
                    if opts[n] and i + n < len(nxt):
                        nxt[i + n] += a * int(opts[n])
        poly = nxt
    return poly[total] if total < len(poly) else 0
