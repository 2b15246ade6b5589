"""Draw random valid plans from the plan space and measure them on the virtual cluster.

The space (conf/search; docs/architecture.md §Search): pp in [min_pp, max_pp]; GPU types in
contiguous groups of stages (type order random); per type one tp from the search's options that
divides heads and query_groups and fits a node; one dp for the plan; a micro batch with global_batch % (dp·mb) == 0; with use_all_gpus,
dp·Σtp over a type's stages equals that type's GPU count; a random layer split (≥ 1 layer per stage)
and random per-stage recomputation (none / selective / full, sometimes full of the first N layers);
the distributed optimizer and sequence parallelism drawn from the options given (default: off only,
which draws nothing, so the random stream and the plans of older seeds stay the same).
Plans that fail `validate_plan` are drawn again; plans that OOM are kept as measured OOM rows.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from memx.domain.errors import InputError
from memx.domain.precision import resolve_precision
from memx.domain.plan import SEARCH_BLOCK, Plan, Recompute, Stage, plan_to_json, validate_plan
from memx.simulator.runs import config_run_row, config_runs_frame, now_iso
from memx.simulator.schedule import simulate_plan
from memx.simulator.traits import GpuTraits
from memx.domain.specs import Cluster, ModelArch, SearchSpace

MAX_TRIES_PER_PLAN = 2000
OFF_ONLY = (False,)  # the default option set: the plans every sampler drew before issue #14


def _tp_choices(search: SearchSpace, model: ModelArch, cluster: Cluster, gpu: str) -> list[int]:
    node = max(cluster.node_sizes(gpu))
    return [t for t in search.tp_options
            if model.heads % t == 0 and model.query_groups % t == 0 and t <= node]


def _groups(rnd: random.Random, cluster: Cluster, model: ModelArch,
            search: SearchSpace) -> tuple[list[tuple[str, int, int]], int] | None:
    """((gpu, tp, stages of that type) per type in pipeline order, dp), or None when this draw fails."""
    types = [g.name for g in cluster.gpu_types]
    if not search.use_all_gpus:
        k = rnd.randint(1, len(types))
        types = rnd.sample(types, k)
    else:
        rnd.shuffle(types)
    dp = rnd.choice([d for d in range(1, search.global_batch + 1) if search.global_batch % d == 0
                     and all(cluster.gpu_count(t) >= d for t in types)])
    groups = []
    for gpu in types:
        tps = _tp_choices(search, model, cluster, gpu)
        if not tps:
            return None
        tp = rnd.choice(tps)
        budget = cluster.gpu_count(gpu) // (dp * tp)
        if budget < 1:
            return None
        if search.use_all_gpus:
            if cluster.gpu_count(gpu) != budget * dp * tp:
                return None
            n_stages = budget
        else:
            n_stages = rnd.randint(1, budget)
        groups.append((gpu, tp, n_stages))
    return groups, dp


def _split(rnd: random.Random, layers: int, pp: int) -> list[int]:
    cuts = sorted(rnd.sample(range(1, layers), pp - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [layers])]


def _recompute(rnd: random.Random, search: SearchSpace, layers: int) -> tuple[Recompute, int | None]:
    level = rnd.choice(search.recompute_levels)
    if level == SEARCH_BLOCK:  # Megatron's block method: full recomputation of the first N layers
        return (Recompute.FULL, rnd.randint(1, layers - 1)) if layers > 1 else (Recompute.FULL, None)
    return Recompute(level), None


def _option(rnd: random.Random, options: Sequence[bool]) -> bool:
    """One of `options`; a single option draws nothing from the stream."""
    if not options:
        raise InputError("an option set (distributed_optimizer / sequence_parallel) must hold true and/or false")
    return bool(options[0]) if len(options) == 1 else bool(rnd.choice(list(options)))


def draw_plan(rnd: random.Random, cluster: Cluster, model: ModelArch, search: SearchSpace, *,
              distributed_optimizer: Sequence[bool] = OFF_ONLY, sequence_parallel: Sequence[bool] = OFF_ONLY) -> Plan | None:
    """One random plan, or None when this draw does not satisfy the space's constraints."""
    drawn = _groups(rnd, cluster, model, search)
    if drawn is None:
        return None
    groups, dp = drawn
    pp = sum(n for _, _, n in groups)
    if not (search.min_pp <= pp <= search.max_pp) or pp > model.layers:
        return None
    mbs = [mb for mb in search.micro_batch_options if search.global_batch % (dp * mb) == 0]
    if not mbs:
        return None
    split = _split(rnd, model.layers, pp)
    stages, s = [], 0
    for gpu, tp, n in groups:
        for _ in range(n):
            level, rl = _recompute(rnd, search, split[s])
            stages.append(Stage(gpu=gpu, tp=tp, layers=split[s], recompute=level, recompute_layers=rl))
            s += 1
    plan = Plan(model=model.name, cluster=cluster.name, global_batch=search.global_batch,
                micro_batch=rnd.choice(mbs), seq_len=search.seq_len or model.seq_len, dp=dp, stages=tuple(stages))
    try:  # the space's precision over the plan's GPUs (auto: bf16 where all have it, else fp16)
        precision = resolve_precision(search.precision, [cluster.gpu(g) for g in dict.fromkeys(st.gpu for st in stages)])
    except InputError:
        return None  # a GPU of this draw cannot run the named precision
    # a mixture-of-experts model with tp > 1 runs sequence parallel: Megatron-LM refuses it otherwise
    # (memx.domain.plan.moe_problems); the draw from the stream is the same either way
    do = _option(rnd, distributed_optimizer)
    sp = _option(rnd, sequence_parallel) or (model.is_moe and any(st.tp > 1 for st in stages))
    return dataclasses.replace(plan, distributed_optimizer=do, sequence_parallel=sp, precision=precision)


def draw_plans(cluster: Cluster, model: ModelArch, search: SearchSpace, *, n: int, seed: int,
               distributed_optimizer: Sequence[bool] = OFF_ONLY, sequence_parallel: Sequence[bool] = OFF_ONLY) -> list[Plan]:
    """`n` distinct valid plans (fewer only if the space holds fewer); deterministic for a seed.
    `distributed_optimizer` / `sequence_parallel`: the values each plan draws from ((False, True): both)."""
    rnd, plans, seen = random.Random(seed), [], set()
    tries = 0
    while len(plans) < n and tries < MAX_TRIES_PER_PLAN * max(n, 1):
        tries += 1
        plan = draw_plan(rnd, cluster, model, search, distributed_optimizer=distributed_optimizer,
                         sequence_parallel=sequence_parallel)
        if plan is None:
            continue
        key = plan_to_json(plan)
        if key in seen:
            continue
        try:
            validate_plan(plan, cluster, model)
        except InputError:
            continue
        seen.add(key)
        plans.append(plan)
    return plans


def sample_plans(cluster: Cluster, model: ModelArch, search: SearchSpace, *, n: int, seed: int,
                 conf_root: Path | None = None, traits: Mapping[str, GpuTraits] | None = None,
                 distributed_optimizer: Sequence[bool] = OFF_ONLY, sequence_parallel: Sequence[bool] = OFF_ONLY
                 ) -> pd.DataFrame:
    """Draw `n` plans and measure each once (its own noise seed): a config_runs DataFrame."""
    if n < 1:
        raise InputError(f"field 'n' must be ≥ 1, got {n}")
    plans = draw_plans(cluster, model, search, n=n, seed=seed, distributed_optimizer=distributed_optimizer,
                       sequence_parallel=sequence_parallel)
    if not plans:
        raise InputError(f"no valid plan found for cluster {cluster.name}, model {model.name}, search {search.name}")
    stamp, rows = now_iso(), []
    for i, plan in enumerate(plans):
        run_seed = seed * 1_000_003 + i
        run = simulate_plan(plan, cluster, model, seed=run_seed, conf_root=conf_root, traits=traits)
        rows.append(config_run_row(plan, run, seed=run_seed, measured_at=stamp))
    return config_runs_frame(rows)
