"""Catalogs: every shipped entry loads; bad input names the file, the field and the allowed values."""

from pathlib import Path

import pytest

from memx.domain.catalog import known_names, load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError

REQUIRED_GPUS = {
    "a100-40g", "a100-80g", "v100-16g", "v100-32g", "t4-16g", "h100-80g", "h20-96g", "h800-80g", "l40s-48g",
    "rtx3090-24g", "mi210-64g", "mi250x-64g", "mi300x-192g", "ascend-910b-64g", "gaudi2-96g", "vendor-b-32g",
    "vendor-c-32g", "vendor-x-32g", "vendor-y-64g",
}


def test_every_catalog_entry_loads(conf_root):
    assert REQUIRED_GPUS <= set(known_names("gpus", conf_root))
    for name in known_names("gpus", conf_root):
        g = load_gpu(name, conf_root)
        assert g.name == name and g.memory_gib > 0 and g.peak_tflops_bf16 > 0
    for name in known_names("clusters", conf_root):
        assert load_cluster(name, conf_root).total_gpus > 0
    for name in known_names("models", conf_root):
        m = load_model(name, conf_root)
        assert m.hidden % m.heads == 0 and m.heads % m.query_groups == 0
    for name in known_names("search", conf_root):
        assert load_search(name, conf_root).global_batch > 0


def test_paper_clusters_match_the_paper(conf_root):
    c = load_cluster("three-vendor-20", conf_root)
    assert c.total_gpus == 20 and c.inter_node_bandwidth_gbps == 28
    assert {g.name: c.gpu_count(g.name) for g in c.gpu_types} == {"a100-80g": 4, "vendor-b-32g": 8, "vendor-c-32g": 8}
    xy = load_cluster("xy-2", conf_root)
    assert [(g.memory_gib, g.peak_tflops_bf16) for g in xy.gpu_types] == [(32, 300), (64, 256)]
    gpt2 = load_model("gpt2-1024", conf_root)
    assert (gpt2.hidden, gpt2.layers, gpt2.heads, gpt2.vocab, gpt2.seq_len, gpt2.mlp) == (1024, 24, 16, 52256, 1024, "gelu")


def test_unknown_name_lists_known_ones(conf_root):
    with pytest.raises(InputError) as e:
        load_model("llama9-1t", conf_root)
    assert "llama9-1t" in str(e.value) and "llama2-7b" in str(e.value)


def test_load_by_path(conf_root, tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nlayers: 2\nhidden: 64\nffn_hidden: 256\nheads: 4\nquery_groups: 2\nvocab: 100\nseq_len: 32\n")
    assert load_model(str(p), conf_root).query_groups == 2


def test_invalid_field_names_file_field_and_allowed_values(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: bad\nlayers: 2\nhidden: 64\nffn_hidden: 256\nheads: 4\nquery_groups: 2\nvocab: 100\nseq_len: 32\nmlp: relu\n")
    with pytest.raises(InputError) as e:
        load_model(str(p))
    msg = str(e.value)
    assert str(p) in msg and "'mlp'" in msg and "swiglu" in msg and "gelu" in msg


def test_every_bad_field_is_named(tmp_path):
    p = tmp_path / "bad-gpu.yaml"
    p.write_text("name: g\nvendor: v\nmemory_gib: -1\npeak_tflops_bf16: 0\nmemory_bandwidth_gbps: 1\nintra_node_bandwidth_gbps: 1\nextra: 3\n")
    with pytest.raises(InputError) as e:
        load_gpu(str(p))
    msg = str(e.value)
    assert "'memory_gib'" in msg and "'peak_tflops_bf16'" in msg and "'extra'" in msg


def test_heads_not_divisible_by_groups(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nlayers: 2\nhidden: 64\nffn_hidden: 256\nheads: 4\nquery_groups: 3\nvocab: 100\nseq_len: 32\n")
    with pytest.raises(InputError, match="query_groups"):
        load_model(str(p))


def test_cluster_with_unknown_gpu_names_the_node(tmp_path, conf_root):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\ninter_node_bandwidth_gbps: 10\nnodes:\n  - {gpu: a100-80g, count: 2}\n  - {gpu: nope-1g, count: 2}\n")
    with pytest.raises(InputError) as e:
        load_cluster(str(p), conf_root)
    assert "nodes.1.gpu" in str(e.value) and "a100-80g" in str(e.value)


def test_not_yaml_mapping(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match="mapping"):
        load_search(str(p))


def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="no such"):
        load_search(str(tmp_path / "nope.yaml"))


def test_default_conf_root_is_the_packaged_one():
    from memx.domain.catalog import default_conf_root

    assert (default_conf_root() / "gpus" / "a100-80g.yaml").is_file()
    assert Path(default_conf_root()).name == "conf"
