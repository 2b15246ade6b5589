"""vTrain (MICRO 2024) ground_truth_multi.csv: 109 measured Megatron-DeepSpeed iterations on 64–512 A100s over an
800 Gb/s-per-node network; the 103 at tp ≤ 8, against the closed form and the virtual cluster (bench/vtrain_multi.py
builds the plans, cluster and model, and states what it takes from vTrain's configs: one path for bench and test).

Neither side was fitted to this file (the A100 traits were fitted to the single-node file; the closed form reads the
runtime catalog). Bounds are regression guards around the figures measured when the test was written
(docs/results.md §vTrain multi-node): closed form MAPE 8.78 % with the catalog's NICs at 0.9 (9.01 % at line rate;
175 B: 1.26 %), 7 rows that ran called out of memory; virtual cluster 8.61 %, 4 rows that ran ran out of memory
there.
"""

from __future__ import annotations

import pytest

from bench.vtrain_multi import closed_form, load_multi, scores, virtual_cluster


@pytest.fixture(scope="module")
def rows(realdata):
    return load_multi(realdata)


@pytest.fixture(scope="module")
def nominal(rows):
    """The closed form's scores with the NICs at line rate (the runtime catalog's figure taken away)."""
    return scores(rows, *closed_form(rows, line_rate=True))


def test_closed_form_on_vtrain_multi_node(rows):
    s = scores(rows, *closed_form(rows))  # as memx plans: the NICs at the runtime catalog's 0.9
    print("\n".join(s.lines("closed form")))
    assert s.n == 103
    assert s.mape < 0.10
    assert s.per_model[175.0][1] < 0.03  # the four 175 B layouts: pipeline- and tp-bound, within 1.3 %
    assert s.called_oom <= 7


def test_virtual_cluster_on_vtrain_multi_node(rows):
    s = scores(rows, *virtual_cluster(rows))
    print("\n".join(s.lines("virtual cluster")))
    assert s.n >= 99
    assert s.mape < 0.10
    assert s.called_oom <= 4


@pytest.mark.parametrize("given", [None, 0.78])
def test_nic_below_line_rate_moves_the_closed_form_toward_the_measurements(rows, nominal, given):
    """`nic_efficiency` (memx.planner.network; docs/results.md §The NIC's achieved bandwidth): the runtime catalog's
    0.9 (None: no cluster field) and a cluster's 0.78 each lower every model's MAPE from line rate — the closed
    form is too fast where the DP ring crosses nodes — but by < 1 point: on this data the network is not what the
    closed form gets most wrong."""
    slower = scores(rows, *closed_form(rows, nic_efficiency=given))
    assert slower.mape < nominal.mape
    assert all(slower.per_model[p][1] < nominal.per_model[p][1] for p in nominal.per_model)
    assert nominal.mape - slower.mape < 0.01
