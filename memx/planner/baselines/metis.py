"""Metis-like planner.

Source: T. Um et al., "Metis: Fast Automatic Distributed Training on Heterogeneous GPUs", USENIX ATC
2024 (public code: github.com/SamsungLabs/Metis — read, not copied). Metis searches data, pipeline and
tensor parallelism with uneven layer partitioning over heterogeneous GPUs, ranks plans by estimated
iteration time from profiled per-layer costs, and discards plans whose estimated memory exceeds a
device's capacity. It does not search recomputation.

Here: recompute off (`("none",)`), objective = predicted time (weights 1,0,0), memory as fits-or-not
with a fixed safety multiplier `MEMORY_FACTOR` on a simple closed-form estimate (memx.planner.cost's
static + in-flight activations; the factor 1.15 is our choice, standing in for the headroom such
planners leave for runtime overheads they do not model).

Job options (issue #14): neither the distributed optimizer nor sequence parallelism. Metis's search space
(paper §4: data, tensor and pipeline degrees per device group, uneven layer partitioning, micro batch) and its
memory estimate (parameters, gradients, optimizer states replicated per data-parallel rank, activations per
micro batch) have neither ZeRO sharding nor sequence parallelism; the Metis-like planner searches both off
whatever the space lists, and its memory estimate (`analytic_memory`) counts the activations sequence
parallelism would have split as replicated.

Replica groups (issue #15): Metis lets a stage span GPU types with an uneven batch split across that
stage's data-parallel replicas (per-stage dp and tp, Um et al. 2024 §4; `search_space/plan.py`,
`model/load_balancer.py`). The nearest MemX form is plan schema 2: the Metis-like planner also
searches up to two replica groups of whole nodes, each with its own pipeline and an uneven share of
the batch (`replica_groups = 2`: memx.planner.replica_search, its own memory estimate and time
objective), and keeps the faster pick. It differs from Metis in that a group is a whole pipeline:
Metis mixes types inside ONE stage's replicas with one layer partition for all, where schema 2
gives each type its own pipeline (partition, depth, tp, micro batch) and pays a cross-group
gradient exchange (memx.planner.replicas) instead of a mixed-type ring inside the stage.

Per-stage dp (issue #27): Metis' plans give each device group its own dp and tp (Um et al. 2024 §4), which a plan
stage's `data_parallel` now writes (memx.domain.stage_dp, FlagScale's per-mesh dp). With `stage_data_parallel: true`
in the space the Metis-like planner also searches that form (memx.planner.stage_dp_search, its own memory estimate,
no recomputation, time only) and keeps the fastest pick; off (the default space) it searches as before.
"""

from memx.planner.baselines.base import NO_RECOMPUTE, TIME_ONLY, Planner, no_recompute_view
from memx.planner.baselines.memory import analytic_memory

MEMORY_FACTOR = 1.15

METIS = Planner(name="metis", label="Metis-like", level_sets=NO_RECOMPUTE,
                memory=lambda gpus: analytic_memory(gpus, MEMORY_FACTOR), weights=TIME_ONLY,
                view=no_recompute_view, doc=__doc__, distributed_optimizer=(False,), sequence_parallel=(False,),
                replica_groups=2, stage_data_parallel=True)
