"""Per-stage recompute assignment on hand-made stage tables (paper §3.1.1, docs/architecture.md §Recompute)."""

import numpy as np
import pytest

from memx.planner.naive import evaluate_split
from memx.planner.objective import parse_weights
from memx.planner.recompute import fit, refine
from memx.planner.schedule import Pipeline
from memx.planner.tables import NONE, LayoutTables, decode_option, stage_options, stage_table

LEVELS = ("none", "full", "block")
N_MAX = 4


def _table(limit_mib, time_per_layer=10.0, act_mib=100.0, static_mib=50.0):
    """none: act per layer kept; full block k: k layers keep 10% of act and cost +1/3 forward each."""
    options = {n: stage_options(n, LEVELS) for n in range(1, N_MAX + 1)}
    pred = {}
    for n, opts in options.items():
        k = np.array([0 if c == NONE else c for c in opts], dtype=float)
        pred[n] = (time_per_layer * (n + k / 3.0), static_mib * n + act_mib * (n - 0.9 * k))
    static = np.array([0.0] + [static_mib * n for n in range(1, N_MAX + 1)])
    params = np.array([0.0] + [1e6 * n for n in range(1, N_MAX + 1)])
    return stage_table(N_MAX, N_MAX + 1, options, pred, limit_mib, static, params)


def _layout(limits, capacity, time_per_layer=(10.0, 10.0)):
    tables = [_table(lim, tpl) for lim, tpl in zip(limits, time_per_layer)]
    pp = len(tables)
    pipe = Pipeline(micro_batches=4, p2p_total_ms=0.0, gpu_weight=np.ones(pp), capacity_mib=np.asarray(capacity, float),
                    memory_bandwidth_gbps=np.full(pp, 1000.0), dp=1, dp_gbps=np.full(pp, 100.0))
    return LayoutTables.stack(tables, pipe)


def _run(lt, split, target=0.10, weights="default"):
    base = lt.base(np.array([split]))
    ok, base, a = fit(lt, base)
    if not ok.any():
        return None
    a = refine(lt, base, a, parse_weights(weights), epsilon_mib2=1e4, target_margin=target)
    codes = lt.code[lt.base(np.array([split]))[:, 0] * lt.k + a.level[:, 0]]
    return [decode_option(int(c), n) for c, n in zip(codes, split)], a


def test_prune_when_even_full_does_not_fit():
    # 3 layers: full keeps 150 static + 30 act = 180 MiB > 170 limit.
    lt = _layout(limits=(170.0, 1e9), capacity=(200.0, 1e9))
    assert _run(lt, (3, 1)) is None


def test_keep_none_when_none_fits():
    lt = _layout(limits=(1e9, 1e9), capacity=(1e9, 1e9))
    levels, a = _run(lt, (2, 2))
    assert levels == [("none", None), ("none", None)]
    assert float(a.time_ms[0]) == pytest.approx((4 - 1) * 20 + 40 + lt.tail_ms[1 * lt.rows + 2], rel=1e-5)


def test_cheapest_level_that_fits_is_forced():
    # 3 layers none = 450 MiB; block 1 = 360; block 2 = 270; full = 180. Limit 300 → block 2.
    lt = _layout(limits=(300.0, 1e9), capacity=(400.0, 1e9))
    levels, _ = _run(lt, (3, 1), target=0.0)
    assert levels[0] == ("full", 2) and levels[1] == ("none", None)


def test_refine_moves_a_tight_stage_up_only_when_phi_falls():
    # Both stages fit with none, but stage 0 sits at 2% margin: refinement raises its recompute.
    lt = _layout(limits=(1e9, 1e9), capacity=(459.0, 1e9))
    levels, a = _run(lt, (3, 1), target=0.5)
    assert levels[0] != ("none", None)  # moved up at least one level
    assert levels[1] == ("none", None)  # the roomy stage is never touched
    assert float(a.stats.min_margin[0]) > 0.02
    # The same plan with a time-only objective keeps none: the move would only cost time.
    levels_t, _ = _run(lt, (3, 1), target=0.5, weights="1,0,0")
    assert levels_t[0] == ("none", None)


def test_vectorised_equals_naive_on_hand_tables():
    lt = _layout(limits=(330.0, 260.0), capacity=(360.0, 300.0), time_per_layer=(10.0, 14.0))
    S = np.array([(a, 5 - a) for a in range(1, 5)])
    ok, base, a = fit(lt, lt.base(S))
    w = parse_weights("default")
    a = refine(lt, base, a, w, epsilon_mib2=1e4, target_margin=0.3)
    got = dict(zip(map(tuple, S[ok]), a.time_ms))
    for split in map(tuple, S):
        ref = evaluate_split(lt, split, w, epsilon_mib2=1e4, target_margin=0.3)
        assert (ref is None) == (split not in got)
        if ref is not None:
            assert got[split] == pytest.approx(ref.time_ms, rel=1e-5)
