"""FaSOP-like planner.

Source: S. Hwang et al., "FASOP: Fast yet Accurate Automated Search for Optimal Parallelization of
Transformers on Heterogeneous GPU Clusters", HPDC 2024. FaSOP searches device placement and
(tp, pp, dp) plans over heterogeneous GPU clusters, ranks them by estimated iteration time and flags
out-of-memory plans with a formula-based memory estimate. It is not open source; the MemX paper
re-implemented it on AMP's code (so its search cost equals AMP's).

Here: objective = predicted time (weights 1,0,0); OOM flag = the textbook formula (static 18 B/param
+ Korthikanti 2022 Eq. 2 activations of the GPT layer under TP, `korthikanti_memory`); recomputation
only as one setting for the whole plan (none or full for every stage — Megatron-LM's single
`--recompute-*` flag), each searched separately, fastest wins. When predicting a given plan it sees
one uniform level (the most memory-saving level any stage uses).

Job options (issue #14): neither the distributed optimizer nor sequence parallelism — FaSOP's search (paper §3:
device placement, tp / pp / dp, micro batch) has neither, and the MemX paper re-implemented it on AMP's code
(paper, note to Tables 5–8), which has neither (memx.planner.baselines.amp). Its formula (`korthikanti_memory`)
is Eq. 2, no sequence parallelism, as FaSOP's own.
"""

from memx.domain.plan import Recompute
from memx.planner.baselines.base import TIME_ONLY, Planner, uniform_view
from memx.planner.baselines.memory import korthikanti_memory

FASOP = Planner(name="fasop", label="FaSOP-like", level_sets=((Recompute.NONE,), (Recompute.FULL,)), memory=korthikanti_memory,
                weights=TIME_ONLY, view=uniform_view, doc=__doc__, distributed_optimizer=(False,), sequence_parallel=(False,))
