"""HexiScale-like planner.

Source: R. Yan et al., "HexiScale: Accommodating Large Language Model Training over Heterogeneous
Environment", arXiv 2409.01143 (2024). HexiScale partitions the model asymmetrically over
heterogeneous GPUs (different tp / layer counts per group), minimising iteration time subject to a
per-device memory constraint from its own estimate; it does not search activation recomputation
(MemX paper §4.4: its pick runs out of memory without recomputation).

Here: recompute off (`("none",)`), objective = predicted time (weights 1,0,0), memory-constrained by
its own estimate — the closed-form model (memx.planner.cost) without any multiplier, which misses the
runtime context, allocator fragmentation and workspaces — so its pick can OOM on the virtual cluster.

Job options (issue #14): neither the distributed optimizer nor sequence parallelism. HexiScale's search
(paper §3–4: asymmetric data / tensor / pipeline partitions over device groups, layer assignment) and its
per-device memory constraint (model states replicated over data-parallel ranks, activations of the in-flight
micro batches) name neither ZeRO sharding nor sequence parallelism; the HexiScale-like planner searches both
off whatever the space lists.
"""

from memx.planner.baselines.base import NO_RECOMPUTE, TIME_ONLY, Planner, no_recompute_view
from memx.planner.baselines.memory import analytic_memory

HEXISCALE = Planner(name="hexiscale", label="HexiScale-like", level_sets=NO_RECOMPUTE,
                    memory=lambda gpus: analytic_memory(gpus, 1.0), weights=TIME_ONLY,
                    view=no_recompute_view, doc=__doc__, distributed_optimizer=(False,), sequence_parallel=(False,))
