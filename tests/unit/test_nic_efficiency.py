"""The NICs' achieved bandwidth (issues #23, #27; memx.planner.network, docs/planner.md §Network): every NIC hop of the
closed form at `nic_efficiency` × its line rate — the cluster YAML's figure, else the runtime catalog's (default.yaml
0.9) for the closed form with conf/runtime, else line rate (runtime "none", the learned predictor) — the
context-parallel ring's NVLink efficiency on its NVLink hops only, the virtual cluster untouched; a value outside
(0, 1] refused naming the file and the field."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError, SpecError
from memx.domain.plan import Plan, Stage
from memx.domain.runtime import runtime_folder
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.planner.network import achieved, nic_gbps, pair_link, ring_link
from memx.planner.space import plan_links
from memx.simulator import links

V100_NIC, T4_NIC, LAT = 1.25, 6.25, 0.05  # conf/clusters/v100-t4-16.yaml: 10 Gb/s and 50 Gb/s NICs


def test_every_nic_hop_of_the_closed_form_and_none_of_the_virtual_cluster():
    cluster = dataclasses.replace(load_cluster("v100-t4-16"), nic_efficiency=0.8)
    assert nic_gbps(cluster, 0) == pytest.approx(0.8 * V100_NIC) and nic_gbps(cluster, 3) == pytest.approx(0.8 * T4_NIC)
    assert pair_link(cluster, 0, 3) == (pytest.approx(0.8 * V100_NIC), LAT)
    assert pair_link(cluster, 1, 1) == (150.0, 0.0)  # NVLink: not a NIC
    assert ring_link(cluster, [0, 1, 2, 3], 4) == (pytest.approx(0.8 * V100_NIC / 4), LAT)
    assert links.link(cluster, 0, 3) == (V100_NIC * 1e6, LAT)  # the simulator keeps its own link model


def test_the_dp_ring_across_nodes_slows_by_the_efficiency():
    cluster, model = load_cluster("a100-h20-h100-256"), load_model("llama2-7b")
    plan = Plan(model=model.name, cluster=cluster.name, global_batch=32, micro_batch=1, seq_len=4096, dp=4,
                stages=(Stage(gpu="a100-80g", tp=8, layers=32),))
    half = dataclasses.replace(cluster, nic_efficiency=0.5)
    assert plan_links(half, plan)[1][0] == pytest.approx(0.5 * plan_links(cluster, plan)[1][0])
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    base, slow = (estimate_plans([plan], c, model, pred)[0] for c in (cluster, half))
    assert slow.iteration_time_ms > base.iteration_time_ms
    assert slow.stage_peak_mib == base.stage_peak_mib  # the network does not enter the peak


def test_the_cp_ring_runs_a_nic_hop_at_the_nics_rate_not_at_the_nvlink_efficiency():
    cluster, model = load_cluster("a100-h20-h100-256"), load_model("llama3-8b-32k")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})

    def t(tp: int, nic_efficiency: float | None) -> float:
        plan = Plan(model=model.name, cluster=cluster.name, global_batch=8, micro_batch=1, seq_len=model.seq_len,
                    dp=1, context_parallel=2, sequence_parallel=True,
                    stages=(Stage(gpu="a100-80g", tp=tp, layers=32, recompute="full"),))
        return estimate_plans([plan], dataclasses.replace(cluster, nic_efficiency=nic_efficiency), model,
                              pred)[0].iteration_time_ms

    # tp 8 × cp 2: the two cp ranks of a TP rank sit on two nodes, the ring's slowest hop is the NIC
    assert t(8, 1.0) < t(8, None) == t(8, 0.9)  # without the field: the catalog's 0.9 (not the NVLink 0.77 as well)
    assert t(8, 0.5) > t(8, 1.0)
    # tp 4 × cp 2: the ring stays in one node; the field changes nothing there
    assert t(4, 1.0) == t(4, None)


@pytest.mark.parametrize("value", [0, -0.5, 1.5])
def test_a_value_outside_zero_one_is_refused(value):
    with pytest.raises(SpecError, match="nic_efficiency"):
        dataclasses.replace(load_cluster("v100-t4-16"), nic_efficiency=value)


def test_a_bad_value_in_the_yaml_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ninter_node_bandwidth_gbps: 25\nnic_efficiency: 1.2\nnodes:\n  - {gpu: a100-80g, count: 8}\n")
    with pytest.raises(InputError) as err:
        load_cluster(path)
    assert str(path) in str(err.value) and "nic_efficiency" in str(err.value)
    path.write_text("name: c\ninter_node_bandwidth_gbps: 25\nnic_efficiency: 0.9\nnodes:\n  - {gpu: a100-80g, count: 8}\n")
    assert load_cluster(path).nic_efficiency == 0.9


def _dp_plan(cluster, model) -> Plan:
    return Plan(model=model.name, cluster=cluster.name, global_batch=32, micro_batch=1, seq_len=4096, dp=4,
                stages=(Stage(gpu="a100-80g", tp=8, layers=32),))


def test_without_the_field_the_closed_form_takes_the_runtime_catalogs_figure():
    cluster, model = load_cluster("a100-h20-h100-256"), load_model("llama2-7b")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    assert pred.nic_efficiency(cluster.gpu_types) == 0.9  # conf/runtime/default.yaml, inherited by every vendor
    seen = achieved(cluster, pred)
    assert seen.nic_efficiency == 0.9 and achieved(cluster, pred) is seen  # one object: the link caches keep hitting
    assert nic_gbps(seen, 0) == pytest.approx(0.9 * cluster.nic_gbps(0))
    plan = _dp_plan(cluster, model)
    default, explicit, line = (estimate_plans([plan], c, model, pred)[0].iteration_time_ms
                               for c in (cluster, seen, dataclasses.replace(cluster, nic_efficiency=1.0)))
    assert default == explicit > line
    own = dataclasses.replace(cluster, nic_efficiency=0.7)
    assert achieved(own, pred) is own  # the cluster's own figure wins


def test_the_papers_closed_form_and_a_predictor_without_a_figure_keep_line_rate():
    cluster = load_cluster("a100-h20-h100-256")
    paper = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="none")
    assert paper.nic_efficiency(cluster.gpu_types) is None and achieved(cluster, paper) is cluster

    class Learned:  # the learned predictor's communication terms were fit at line rate: it gives no figure
        name = "learned"

        def predict(self, sigs):
            raise AssertionError("not called")

    assert achieved(cluster, Learned()) is cluster


def _runtime_copy(tmp_path, value: str):
    shutil.copytree(runtime_folder(), tmp_path / "runtime")
    path = tmp_path / "runtime" / "default.yaml"
    text = path.read_text()
    path.write_text(text[:text.index("nic_efficiency:")] + f"nic_efficiency:\n  value: {value}\n  source: \"test\"\n")
    return path


def test_a_catalog_null_restores_line_rate_and_a_bad_value_names_the_file_and_the_field(tmp_path):
    cluster = load_cluster("a100-h20-h100-256")
    gpus = {g.name: g for g in cluster.gpu_types}
    _runtime_copy(tmp_path, "null")
    assert AnalyticStageModel(gpus=gpus, conf_root=tmp_path).nic_efficiency(cluster.gpu_types) is None
    path = _runtime_copy(tmp_path / "bad", "1.5")
    with pytest.raises(InputError) as err:
        AnalyticStageModel(gpus=gpus, conf_root=tmp_path / "bad").nic_efficiency(cluster.gpu_types)
    assert str(path) in str(err.value) and "nic_efficiency" in str(err.value)
