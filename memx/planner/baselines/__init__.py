"""Re-implemented baselines (decision logic only) and MemX ablations, as planners over the same plan
space and the same stage predictions. See memx/baselines/base.py and each module's docstring.

    from memx.planner.baselines import methods
    for name, planner in methods(weights="safety").items():
        pick = planner.plan(cluster, model, space, predictor)      # Pick: plan, own predictions, search_s
        est = planner.estimate(plans, cluster, model, predictor)   # MethodEstimate per given plan
"""

from memx.planner.baselines.ablations import ours, ours_uniform, profiles
from memx.planner.baselines.amp import AMP
from memx.planner.baselines.base import (
    TIME_ONLY,
    MethodEstimate,
    OwnMemory,
    Pick,
    Planner,
    StaticScaled,
    no_recompute_view,
    uniform_view,
)
from memx.planner.baselines.fasop import FASOP
from memx.planner.baselines.hexiscale import HEXISCALE
from memx.planner.baselines.metis import METIS

BASELINES = {p.name: p for p in (AMP, METIS, HEXISCALE, FASOP)}


def methods(weights: str = "space", *, with_profiles: bool = False) -> dict[str, Planner]:
    """The four baselines, MemX (`weights`) and MemX with uniform recompute; optionally every profile."""
    out = {**BASELINES, "ours": ours(weights), "ours-uniform": ours_uniform(weights)}
    if with_profiles:
        out.update(profiles())
    return out


__all__ = ["AMP", "BASELINES", "FASOP", "HEXISCALE", "METIS", "TIME_ONLY", "MethodEstimate", "OwnMemory", "Pick",
           "Planner", "StaticScaled", "methods", "no_recompute_view", "ours", "ours_uniform", "profiles",
           "uniform_view"]
