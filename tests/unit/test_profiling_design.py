"""Minimal-set design: run counts, coverage of the search's ranges, source tags."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.profiling import BACKENDS, profile
from memx.profiling.design import full_grid_size, gpu_axes, three
from memx.domain.errors import InputError
from memx.domain.records import signature_key


@pytest.fixture(scope="module")
def default_result(conf_root):
    c, m, s = load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root), load_search("default", conf_root)
    return c, m, s, profile(c, m, s, seed=1, conf_root=conf_root)


def test_three_point_levels():
    assert three([1, 2, 4, 8]) == (1, 2, 8)
    assert three([1, 2, 4]) == (1, 2, 4)
    assert three([2]) == (2,)


def test_default_scenario_at_most_243_runs_per_gpu_type(default_result):
    _, _, _, r = default_result
    assert set(r.runs_by_gpu) == {"a100-80g", "vendor-b-32g", "vendor-c-32g"}
    assert all(0 < n <= 243 for n in r.runs_by_gpu.values()), r.runs_by_gpu
    assert r.runs == sum(r.runs_by_gpu.values())
    assert r.full_grid > 100 * r.runs  # the paper's point: orders of magnitude fewer runs
    assert r.failed == 0


def test_grid_covers_the_search_range_ends(default_result):
    c, m, s, r = default_result
    df = r.stage_runs
    for gpu in r.runs_by_gpu:
        g = df[(df.gpu == gpu) & df.source.str.startswith("design:")]
        ax = gpu_axes(c, m, s, c.gpu(gpu))
        assert {min(ax.tps), max(ax.tps)} <= set(g.tp)
        assert {min(s.micro_batch_options), max(s.micro_batch_options)} <= set(g.micro_batch)
        assert {"none", "selective", "full"} <= set(g.recompute)
        assert g.recompute_layers.notna().any()  # block recompute
        assert 1 in set(g.layers) and g.layers.max() >= max(ax.max_layers_by_tp.values())
        assert g["first"].any() and g["last"].any()
        assert {1, s.max_pp} <= set(g.inflight)
    # whole-model stages (pp = 1) on the GPU that can hold all layers
    whole = df[df["first"] & df["last"]]
    assert (whole.layers == m.layers).all() and len(whole) > 0


def test_source_tags_and_dense_intervals(default_result):
    _, _, _, r = default_result
    src = r.stage_runs.source
    assert src.str.startswith("sweep:").any() and (src == "design:grid").any() and (src == "design:inflight").any()
    for param in ("layers", "micro_batch", "seq_len"):
        dense = r.stage_runs[src == f"design:dense:{param}"]
        assert 5 <= len(dense) <= 7, param
        assert dense.gpu.nunique() == 1
        assert dense[param].nunique() == len(dense)
    assert set(r.stage_runs.backend) == {"simulated"}
    assert r.stage_runs.measured_at.str.endswith("+00:00").all()


def test_sensitivity_table_selects_moving_parameters(default_result):
    _, _, _, r = default_result
    sens = r.sensitivity
    assert {"gpu", "parameter", "time_change", "mem_change", "selected"} <= set(sens.columns)
    layers = sens[sens.parameter == "layers"]
    assert layers.selected.all() and (layers.mem_change > 0.3).all()
    assert not sens[sens.parameter == "seq_len"].selected.any()  # not searched: reported only


def test_full_grid_formula(conf_root):
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    ax = gpu_axes(c, m, s, c.gpu("vendor-x-32g"))
    # tp 1 only (one GPU per node), mb 2, inflight 1..4, Σ_n positions(n)·(2 levels + n−1 block counts)
    per_n = sum((3 + (n == 6)) * (2 + n - 1) for n in range(1, 7))
    assert full_grid_size(ax) == 1 * 2 * 4 * per_n


def test_unknown_backend_names_the_valid_ones(conf_root):
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    with pytest.raises(InputError) as exc:
        profile(c, m, s, backend="magic")
    assert all(b in str(exc.value) for b in BACKENDS)


def test_same_seed_same_numbers(conf_root):
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    a = profile(c, m, s, seed=3).stage_runs
    b = profile(c, m, s, seed=3, jobs=2).stage_runs
    ta = {signature_key(r): r["time_ms"] for r in a.to_dict("records") if r["status"] == "ok"}
    tb = {signature_key(r): r["time_ms"] for r in b.to_dict("records") if r["status"] == "ok"}
    assert ta == tb and len(ta) > 50  # per-point seeds: order and parallelism do not matter


def test_points_at_tp_above_one_carry_the_searched_sequence_parallelism(default_result):
    """Issue #14: the default search asks for SP at tp > 1, so the grid measures it; tp 1 never carries it."""
    c, _, s, r = default_result
    assert s.sequence_parallel == (True,)
    df = r.stage_runs
    design = df[df.source.str.startswith("design:") & (df.source != "design:option:sequence_parallel")]
    assert (design.sequence_parallel == (design.tp > 1)).all()
    assert not (df.source == "design:option:sequence_parallel").any()  # issue #23: off (design.axis_points)
    assert (design.tp > 1).any() and (design.tp == 1).any()
    assert not df.distributed_optimizer.any()  # the distributed optimizer stays analytic (docs/profiling.md)
    for gpu in r.runs_by_gpu:
        sweep = df[(df.gpu == gpu) & (df.source == "sweep:sequence_parallel")]
        top = max(gpu_axes(c, load_model("llama2-7b"), s, c.gpu(gpu)).tps)
        # off at the largest tp (on there is the tp sweep's point, measured once)
        assert sweep.tp.tolist() == [top] and sweep.sequence_parallel.tolist() == [False]
        on = df[(df.gpu == gpu) & (df.source == "sweep:tp") & (df.tp == top)]
        assert on.sequence_parallel.tolist() == [True]
    sens = r.sensitivity[r.sensitivity.parameter == "sequence_parallel"]
    assert len(sens) == len(r.runs_by_gpu) and not sens.searched.any() and not sens.selected.any()
    assert (sens.mem_change > 0.01).all()  # SP shards the LayerNorm/dropout activations (Korthikanti 2022)


def test_both_sequence_parallel_values_double_the_full_grid_at_tp_above_one(conf_root):
    c, m, s = load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root), load_search("default", conf_root)
    one = gpu_axes(c, m, s, c.gpu("a100-80g"))
    both = gpu_axes(c, m, dataclasses.replace(s, sequence_parallel=(False, True)), c.gpu("a100-80g"))
    assert one.sequence_parallel and not both.sequence_parallel  # the first listed value
    above = sum(t > 1 for t in one.tps)
    assert full_grid_size(both) * len(one.tps) == full_grid_size(one) * (len(one.tps) + above)
