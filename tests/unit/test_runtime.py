"""The runtime catalog (memx.domain.runtime, conf/runtime) and the runtime terms of the closed-form
stage model (memx.planner.cost with runtime="catalog")."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import yaml

from memx.domain.catalog import load_cluster
from memx.domain.errors import InputError
from memx.domain.runtime import NUMBER_FIELDS, RuntimeProfile, load_runtime, load_runtime_file, runtime_folder
from memx.planner.cost import AnalyticStageModel, predict_stage_frame
from support.signatures import stage_row


def _frame(*rows):
    df = pd.DataFrame(list(rows))
    df["recompute_layers"] = df["recompute_layers"].astype("Int64")
    return df


def test_every_shipped_entry_loads_and_every_number_names_a_source(conf_root):
    folder = runtime_folder(conf_root)
    names = sorted(p.stem for p in folder.glob("*.yaml"))
    assert "default" in names and "nvidia" in names
    for name in names:
        raw = yaml.safe_load((folder / f"{name}.yaml").read_text())
        for key, entry in raw.items():
            if key not in ("name", "extends", "notes"):
                assert key in NUMBER_FIELDS and entry["source"].strip(), (name, key)
        profile = load_runtime_file(folder / f"{name}.yaml")
        assert isinstance(profile, RuntimeProfile) and profile.name == name


def test_lookup_falls_back_from_gpu_to_vendor_to_default(conf_root):
    assert load_runtime("t4-16g", "nvidia", conf_root).name == "t4-16g"
    assert load_runtime("no-such-gpu", "nvidia", conf_root).name == "nvidia"
    assert load_runtime("vendor-b-32g", "vendor-b", conf_root).name == "default"
    t4 = load_runtime("t4-16g", "nvidia", conf_root)
    nvidia = load_runtime("nvidia", None, conf_root)
    assert not t4.flash_attention and t4.context_mib == nvidia.context_mib  # inherited through `extends`


def _write(tmp_path, name, body):
    folder = tmp_path / "runtime"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(body)
    return tmp_path


def test_unknown_field_names_file_field_and_allowed_fields(tmp_path, conf_root):
    base = (runtime_folder(conf_root) / "default.yaml").read_text()
    root = _write(tmp_path, "default", base + 'warp_drive_mib: {value: 1, source: "x"}\n')
    with pytest.raises(InputError) as err:
        load_runtime("x", None, root)
    msg = str(err.value)
    assert "default.yaml" in msg and "warp_drive_mib" in msg and "context_mib" in msg


def test_a_number_without_source_is_rejected(tmp_path, conf_root):
    root = _write(tmp_path, "default", (runtime_folder(conf_root) / "default.yaml").read_text())
    _write(tmp_path, "mygpu", "name: mygpu\nextends: default\ncontext_mib: 300\n")
    with pytest.raises(InputError, match="mygpu.yaml: field 'context_mib' must be"):
        load_runtime("mygpu", None, root)


def test_out_of_range_efficiency_and_bad_extends_are_input_errors(tmp_path, conf_root):
    root = _write(tmp_path, "default", (runtime_folder(conf_root) / "default.yaml").read_text())
    _write(tmp_path, "fast", 'name: fast\nextends: default\nlink_efficiency: {value: 1.5, source: "x"}\n')
    with pytest.raises(InputError, match="link_efficiency"):
        load_runtime("fast", None, root)
    _write(tmp_path, "orphan", "name: orphan\nextends: nowhere\n")
    with pytest.raises(InputError, match="field 'extends'"):
        load_runtime("orphan", None, root)


def test_runtime_none_is_the_earlier_closed_form(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    gpus = {g.name: g for g in c.gpu_types}
    df = _frame(stage_row(), stage_row(recompute="full"), stage_row(last=True, gpu="vendor-b-32g"))
    old = AnalyticStageModel(gpus=gpus, runtime="none").predict(df)
    pd.testing.assert_frame_equal(old, pd.DataFrame(predict_stage_frame(df, gpus, mfu=0.5, elementwise_passes=2.0),
                                                    index=df.index))
    eager = {n: dataclasses.replace(load_runtime(n, g.vendor, conf_root), flash_attention=False) for n, g in gpus.items()}
    df = _frame(*(stage_row(mlp="gelu", ffn_hidden=4 * 4096, **o) for o in ({}, {"recompute": "full"}, {"last": True})))
    old = AnalyticStageModel(gpus=gpus, runtime="none").predict(df)
    new = AnalyticStageModel(gpus=gpus, runtime=eager).predict(df)
    # GPT layer, eager attention with dropout: Korthikanti's tensors (replicated without sequence
    # parallelism) plus context, communicators, allocator overhead and workspace
    assert np.all(new["peak_mem_mib"] > old["peak_mem_mib"])
    np.testing.assert_allclose(new["static_mem_mib"], old["static_mem_mib"])
    with pytest.raises(InputError, match="field 'runtime'"):
        AnalyticStageModel(gpus=gpus, runtime="bogus").predict(df)


def test_fixed_overheads_and_allocator_fraction_enter_the_peak_but_not_the_driver_reserve(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    gpus = {g.name: g for g in c.gpu_types}
    prof = load_runtime("a100-80g", "nvidia", conf_root)
    bare = dataclasses.replace(prof, driver_reserved_mib=0, context_mib=0, collective_comm_mib=0, p2p_comm_mib=0,
                               allocator_overhead_fraction=0)
    df = _frame(stage_row())
    full = AnalyticStageModel(gpus=gpus, runtime={"a100-80g": prof}).predict(df)["peak_mem_mib"].iloc[0]
    alloc = AnalyticStageModel(gpus=gpus, runtime={"a100-80g": bare}).predict(df)["peak_mem_mib"].iloc[0]
    # interior stage, tp 2: tp + dp + model-parallel + world collectives, two pipeline neighbours; the driver
    # reserve is off the capacity (usable_capacity_mib), never in a peak (issue #27)
    fixed = prof.context_mib + 4 * prof.collective_comm_mib + 2 * prof.p2p_comm_mib
    assert full == pytest.approx(alloc * (1 + prof.allocator_overhead_fraction) + fixed)
    more = dataclasses.replace(prof, driver_reserved_mib=prof.driver_reserved_mib + 4096)
    assert AnalyticStageModel(gpus=gpus, runtime={"a100-80g": more}).predict(df)["peak_mem_mib"].iloc[0] == full


def test_flash_attention_sequence_parallel_and_logits_change_memory_the_right_way(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    gpus = {g.name: g for g in c.gpu_types}
    prof = load_runtime("a100-80g", "nvidia", conf_root)

    def peak(p, **over):
        return AnalyticStageModel(gpus=gpus, runtime={"a100-80g": p}).predict(_frame(stage_row(**over)))["peak_mem_mib"].iloc[0]

    eager = dataclasses.replace(prof, flash_attention=False)
    assert peak(eager) > peak(prof)  # eager attention stores the s² scores (Korthikanti 2022 §4.1)
    assert peak(eager, recompute="selective") < peak(eager)
    assert peak(dataclasses.replace(prof, sequence_parallel=True)) < peak(prof)
    # last stage: fp32 logits kept plus their fp32 gradient: ≥ 8 bytes per logit per TP rank
    logits_mib = 8.0 * 4096 * 32000 / 2 / 2**20
    assert peak(prof, last=True, inflight=1) - peak(prof, inflight=1) > logits_mib


def test_small_gemms_reach_less_of_peak_and_p2p_hops_cost_time(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    model = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types})
    t = model.predict(_frame(stage_row(micro_batch=1, seq_len=256), stage_row(micro_batch=4, seq_len=4096)))["time_ms"].to_numpy()
    per_token = t / np.array([256, 4 * 4096])
    assert per_token[0] > 1.3 * per_token[1]  # wave quantisation, launch and host floors at small sizes
    prof = load_runtime("a100-80g", "nvidia", conf_root)
    slow = dataclasses.replace(prof, p2p_latency_ms=prof.p2p_latency_ms + 1.0)
    gpus = {g.name: g for g in c.gpu_types}

    def time(p, **over):
        return AnalyticStageModel(gpus=gpus, runtime={"a100-80g": p}).predict(_frame(stage_row(**over)))["time_ms"].iloc[0]

    # two hops (activation out, gradient back) per micro batch on the 1F1B cycle (Narayanan 2021 §2.2)
    assert time(slow) - time(prof) == pytest.approx(2.0)
    assert time(slow, first=True, last=True) == pytest.approx(time(prof, first=True, last=True))


def test_backward_tp_collectives_as_megatron_runs_them(conf_root):
    """Issue #23 (memx.planner.runtime_terms.backward_tp_ms): with tp_overlap_exposed_fraction 1 (the catalog's default) a
    layer without sequence parallelism pays the paper's 2 backward all-reduces exactly; with it, Megatron's
    re-all-gathers of the two saved s/t inputs add one all-reduce's time per layer and recomputed forward; None is
    the paper's formula; a fraction e charges the overlapped collectives at e (2 all-reduces without SP, 2 with)."""
    from types import SimpleNamespace

    from memx.planner.runtime_terms import ring_ms

    c = load_cluster("three-vendor-20", conf_root)
    gpus = {g.name: g for g in c.gpu_types}
    prof = load_runtime("a100-80g", "nvidia", conf_root)
    assert prof.tp_overlap_exposed_fraction == 1.0

    def time(e, **over):
        p = dataclasses.replace(prof, tp_overlap_exposed_fraction=e)
        return AnalyticStageModel(gpus=gpus, runtime={"a100-80g": p}).predict(_frame(stage_row(**over)))["time_ms"].iloc[0]

    row = stage_row()
    a100 = gpus["a100-80g"]
    link = SimpleNamespace(link_bytes_per_ms=a100.intra_node_bandwidth_gbps * 1e6 * prof.link_efficiency,
                           step_ms=prof.collective_step_ms)
    rc_ring = float(ring_ms(2.0 * row["micro_batch"] * row["seq_len"] * row["hidden"], row["tp"], link))
    L = row["layers"]
    assert time(1.0) == pytest.approx(time(None), rel=1e-12)  # no SP: the paper's formula
    assert time(1.0, sequence_parallel=True) - time(None, sequence_parallel=True) == pytest.approx(L * rc_ring)
    assert time(1.0) - time(0.5) == pytest.approx(L * rc_ring)  # 2 overlapped all-reduces at half their time
    assert time(1.0, sequence_parallel=True) - time(0.0, sequence_parallel=True) == pytest.approx(2 * L * rc_ring)
    # a recomputed layer's forward collectives block whatever the fraction (the f/g forward all-reduces)
    assert time(None, recompute="full") - time(None) == pytest.approx(time(0.5, recompute="full") - time(0.5))

