"""MemX and its ablations over the same space and predictor.

* `ours(weights)` — MemX: per-stage recompute (two-step assignment, memx.planner.recompute), memory from the
  shared predictor, objective Φ with `weights` (a profile name, "auto", or "space" = the search YAML's).
* `ours_uniform(weights)` — the ablation the paper never ran: the same search and Φ, but one recompute
  level for every stage of a plan. Implemented by searching each level alone
  (`recompute_levels = (level,)` for none, selective, full) and taking the lowest median-free Φ score
  (wT·log T + wM·log M + wV·log(V+ε)) among the searches' candidates within max_time_ratio of the
  overall fastest. The difference to `ours` isolates per-stage recomputation.
* `profiles()` — `ours` with each weight profile (default, safety, throughput): weight sensitivity,
  which the paper does not test.
"""

from memx.domain.plan import Recompute
from memx.planner.baselines.base import Planner, same_view, uniform_view
from memx.planner.objective import PROFILES


def ours(weights: str = "space", name: str = "ours") -> Planner:
    return Planner(name=name, label=f"MemX ({weights})" if weights != "space" else "MemX", level_sets=None,
                   memory="shared", weights=weights, view=same_view, doc=__doc__)


def ours_uniform(weights: str = "space") -> Planner:
    return Planner(name="ours-uniform", label="MemX, uniform recompute", level_sets=tuple((r,) for r in Recompute),
                   memory="shared", weights=weights, view=uniform_view, doc=__doc__)


def profiles() -> dict[str, Planner]:
    return {f"ours-{p}": ours(p, name=f"ours-{p}") for p in PROFILES}
