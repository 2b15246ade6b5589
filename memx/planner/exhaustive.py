"""The reference search: every split of every layout scored, in fixed-size chunks (`search(...,
exhaustive=True)`). Same evaluation, same decision sets (memx.planner.candidates) and exact medians in
two streaming passes (memx.planner.medians.RadixMedians), so memory is bounded by the chunk; the
fast search must give the same pick, top-k and Pareto front (tests/unit/test_search_exact.py)."""

from __future__ import annotations

from collections.abc import Callable

from memx.domain.specs import Cluster, SearchSpace, Weights
from memx.planner.bnb import Work
from memx.planner.candidates import Keeper
from memx.planner.medians import RadixMedians
from memx.planner.objective import auto_profile
from memx.planner.pick import front_tolerance
from memx.planner.prepared import Prepared, chunks, score_splits


def exhaustive_search(prepared: list[Prepared], *, total: int, space: SearchSpace, cluster: Cluster,
                      weights: Weights | None, top_k: int, chunk: int, tick: Callable[[int], None]
                      ) -> tuple[Keeper, Weights, tuple[float, float, float], Work]:
    work = Work()

    def scored(w: Weights | None):
        for li, prep in enumerate(prepared):
            lt = prep.build()
            for S in chunks(prep, total, chunk):
                sc = score_splits(lt, li, S, w, space)
                if w is not None:
                    work.scored += len(S)
                if sc is not None:
                    yield sc
            tick(1)

    if weights is None:
        first = Keeper(top_k=1, timed_only=True)
        for sc in scored(None):
            first.offer(sc)
        weights = auto_profile(cluster, first.by_time[0].margin if first.by_time else None)
    keeper = Keeper(top_k=top_k, max_time_ratio=space.max_time_ratio, margin_floor=space.margin_floor,
                    balance_tolerance=space.balance_tolerance, front_tolerance=front_tolerance(space))
    radix = RadixMedians()
    for sc in scored(weights):
        keeper.offer(sc)
        radix.first_pass((sc.assignment.time_ms, sc.assignment.stats.max_mib, sc.assignment.stats.variance_mib2))
    for sc in scored(weights):
        radix.second_pass((sc.assignment.time_ms, sc.assignment.stats.max_mib, sc.assignment.stats.variance_mib2))
    work.scored //= 2
    return keeper, weights, radix.medians(), work
