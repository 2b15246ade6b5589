"""Issue #26, plan CPU fixed costs: the faster forms give exactly what they replace — names factorised by
runs (runtime_terms.name_codes) as np.unique, the static bounds of all contexts at once (predictions.
static_bounds) as static_bound one context at a time, the sampler's row-by-row inverse (compositions.
upper_bound_rows) as np.searchsorted, one layer's closed-form terms per run of rows (runtime_terms.per_run)
as per row. (The sampler's draws themselves: tests/unit/test_search_batched.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.compositions import upper_bound_rows
from memx.planner.cost import AnalyticStageModel
from memx.planner.predictions import static_bound, static_bounds, with_twins
from memx.planner.prepared import layout_contexts
from memx.planner.runtime_terms import name_codes
from memx.planner.signatures import signature_columns
from memx.planner.space import enumerate_layouts

NAMES = ["a100-80g", "v100-32g", "h100-80g"]


@pytest.mark.parametrize("column", [
    np.array(NAMES, dtype=object)[np.repeat([1, 0, 1, 2, 2, 0], [5, 1, 3, 2, 4, 7])],  # runs, values recurring
    np.array(NAMES)[np.random.default_rng(0).integers(0, 3, 200)],  # '<U' strings, short runs
    np.array(["bf16"], dtype=object)[np.zeros(9, dtype=np.int64)],  # one run
    np.array([1, 1.0, True, "1", None, None], dtype=object),  # equal values with different str(): np.unique itself
    np.array([], dtype=object),
])
def test_name_codes_is_np_unique_of_the_strings(column):
    uniq, inv = name_codes(column)
    want_uniq, want_inv = np.unique(column.astype(str), return_inverse=True)
    assert uniq.tolist() == want_uniq.tolist() and inv.tolist() == want_inv.reshape(-1).tolist()


@pytest.mark.parametrize("distributed_optimizer", [(True,), (False,), (True, False)])
def test_static_bounds_of_all_contexts_match_one_at_a_time(distributed_optimizer):
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")  # fp16 contexts, and bf16 added
    space = dataclasses.replace(load_search("default"), distributed_optimizer=distributed_optimizer)
    contexts = with_twins(layout_contexts(enumerate_layouts(cluster, model, space), model.layers))
    contexts |= {dataclasses.replace(c, precision="bf16"): cap for c, cap in contexts.items() if c.gpu == "a100-80g"}
    limits = {g.name: g.memory_mib - space.reserve_gib * 1024.0 for g in cluster.gpu_types}
    got = static_bounds(contexts, model, limits)
    assert got == {c: static_bound(c, model, limits[c.gpu], cap) for c, cap in contexts.items()}
    assert len({c.precision for c in contexts}) > 1 and 0 < min(got.values()) < max(got.values())


def test_upper_bound_rows_is_searchsorted_row_by_row():
    rng = np.random.default_rng(3)
    for width in (1, 2, 7, 32, 33):
        e = np.sort(rng.random((6, width)), axis=1) + np.arange(6)[:, None]  # row j in [j, j + 1), as the sampler's
        e[2] = 2.0  # a row of equal entries (no weight: cw = 0)
        row = rng.integers(0, 6, 400)
        q = np.where(rng.random(400) < 0.3, e[row, rng.integers(0, width, 400)], row + rng.random(400))  # ties too
        q[:3] = row[:3] + 1.0  # j + u rounded up to j + 1
        want = [np.searchsorted(e[r], x, side="right") for r, x in zip(row, q)]
        assert upper_bound_rows(e, row, q).tolist() == want


def test_closed_form_per_run_gives_each_row_its_own_numbers():
    """The closed form computes one layer's terms once per run of equal rows (runtime_terms.per_run): the
    same rows in any order — runs broken up, one row each — give the same numbers, bit for bit."""
    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    space = load_search("default")
    contexts = list(layout_contexts(enumerate_layouts(cluster, model, space), model.layers))[:40]
    ci = np.repeat(np.arange(len(contexts)), 24)
    layers = np.tile(np.repeat([1, 4, 8, 16], 6), len(contexts))
    codes = np.tile(np.tile([-2, -1, 1, 2, 3, 16], 4), len(contexts))
    codes = np.where(codes > layers, layers, codes)
    sigs = signature_columns(contexts, layers, codes, ci, model, model.seq_len)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    grouped = pred.predict_columns(sigs)
    order = np.random.default_rng(0).permutation(len(ci))
    shuffled = pred.predict_columns({k: v[order] for k, v in sigs.items()})
    for k, v in grouped.items():
        assert np.array_equal(v[order], shuffled[k]), k
