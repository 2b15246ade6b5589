"""AMP-like planner.

Source: D. Li et al., "AMP: Automatically Finding Model Parallel Strategies with Heterogeneity
Awareness", NeurIPS 2022 (public code: github.com/DachengLi1/AMP — read, not copied). AMP enumerates
(tp, pp, dp, micro batch) and the layer placement over heterogeneous devices and ranks the candidates
by a cost model of iteration time (per-layer compute + communication of the pipeline). It has no
memory model and does not search activation recomputation (MemX paper §4: "memory only as a
fits-or-not constraint, or not at all").

Here: the MemX plan space with recompute off everywhere (`recompute_levels = ("none",)`), the shared
stage predictor's times, objective = predicted iteration time (weights 1,0,0) and no memory check at
all (`OwnMemory(memory=None)`), so its pick may run out of memory. (The engine's static-memory bound —
weights, gradients and Adam state at 18 B/param must fit a GPU — still prunes: such a plan cannot
even be launched, which any planner notices.) When predicting a given plan it
ignores that plan's recomputation (it has no recompute model).

Job options (issue #14): neither the distributed optimizer nor sequence parallelism. AMP's search space (paper
§3: tp, pp, dp, micro batch and the placement of layers on devices) has no ZeRO stage, and its runtime (the
repository's DeepSpeed pipeline engine with Megatron-style tensor parallelism) predates Megatron-LM's sequence
parallelism (Korthikanti et al. 2022); so the AMP-like planner searches `distributed_optimizer = [false]`,
`sequence_parallel = [false]` whatever the space lists.

Replica groups (issue #15): AMP's heterogeneous trials put the data-parallel replicas of one pipeline
on different GPU types (Li et al. 2022 §3.2). The AMP-like planner therefore also searches plan
schema 2 (`replica_groups = 2`: memx.planner.replica_search, groups of whole nodes, with its own
time objective and no memory check) and keeps the faster pick. The nearest schema-2 form is a
superset of AMP's: AMP's replicas share one layer partition and split the batch evenly, ours may
differ in partition, tp and micro batch per group and split the batch unevenly; so the AMP-like
pick is never slower (by the shared predictor) than a pick restricted to AMP's own form.
"""

from memx.planner.baselines.base import NO_RECOMPUTE, TIME_ONLY, Planner, no_recompute_view

AMP = Planner(name="amp", label="AMP-like", level_sets=NO_RECOMPUTE, memory=None, weights=TIME_ONLY,
              view=no_recompute_view, doc=__doc__, distributed_optimizer=(False,), sequence_parallel=(False,),
              replica_groups=2)
