"""Fingerprint = hash(GPU types, model structure, global batch): each of the three changes it; adding
nodes of known GPU types does not."""

from __future__ import annotations

import dataclasses

from memx.domain.catalog import load_cluster, load_gpu, load_model
from memx.pipeline.registry import fingerprint
from memx.domain.specs import Cluster, Node


def test_each_trigger_changes_the_fingerprint_and_growth_does_not():
    cl, mo = load_cluster("three-vendor-20"), load_model("llama2-7b")
    base = fingerprint(cl, mo, 128)
    assert base == fingerprint(cl, mo, 128)
    grown = Cluster(name="grown", inter_node_bandwidth_gbps=cl.inter_node_bandwidth_gbps, nodes=cl.nodes + cl.nodes)
    assert fingerprint(grown, mo, 128).fingerprint == base.fingerprint
    swapped = dataclasses.replace(cl, nodes=cl.nodes[:2] + (Node(gpu=load_gpu("h100-80g"), count=8),))
    fps = {
        "gpu types": fingerprint(swapped, mo, 128),
        "model structure": fingerprint(cl, dataclasses.replace(mo, hidden=5120), 128),
        "global batch": fingerprint(cl, mo, 256),
    }
    for why, fp in fps.items():
        assert fp.fingerprint != base.fingerprint, why
    assert fps["gpu types"].gpu_types != base.gpu_types
    assert fps["model structure"].model_fingerprint != base.model_fingerprint
    assert fps["global batch"].global_batch == 256 and fps["global batch"].tags()["global_batch"] == "256"


def test_a_changed_spec_sheet_under_the_same_name_changes_it():
    cl, mo = load_cluster("xy-2"), load_model("llama-6l")
    faster = dataclasses.replace(cl.nodes[0].gpu, peak_tflops_bf16=999)
    changed = dataclasses.replace(cl, nodes=(Node(gpu=faster, count=1),) + cl.nodes[1:])
    assert fingerprint(changed, mo, 16).fingerprint != fingerprint(cl, mo, 16).fingerprint
