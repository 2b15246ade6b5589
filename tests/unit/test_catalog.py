"""Catalogs: every shipped entry loads; bad input names the file, the field and the allowed values."""

from pathlib import Path

import pytest

from memx.domain.catalog import known_names, load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError, SpecError
from memx.domain.plan import Recompute
from memx.domain.specs import RECOMPUTE_LEVELS, GpuType, ModelArch, Node, SearchSpace

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


def _bad_input(path: Path, text: str, load, *args) -> str:
    """Write `text` to `path`, load it, and return the InputError's message."""
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load(str(path), *args)
    assert str(path) in str(e.value)
    return str(e.value)


def test_three_bad_fields_are_named_in_one_message(tmp_path):
    msg = _bad_input(tmp_path / "m.yaml", "name: m\nlayers: 0\nhidden: 64\nffn_hidden: -8\nheads: 4\nquery_groups: 2\n"
                     "vocab: 100\nseq_len: 32\nmlp: relu\nnotes: three mistakes\n", load_model)
    assert all(f"'{f}'" in msg for f in ("layers", "ffn_hidden", "mlp")) and "gelu" in msg
    assert "notes" not in msg  # free text, allowed in every catalog entry


def test_cross_field_problems_are_named_together(tmp_path):
    msg = _bad_input(tmp_path / "m.yaml", "name: m\nlayers: 2\nhidden: 66\nffn_hidden: 256\nheads: 4\nquery_groups: 3\n"
                     "vocab: 100\nseq_len: 32\n", load_model)
    assert "field 'hidden'" in msg and "field 'heads'" in msg and "query_groups" in msg
    msg = _bad_input(tmp_path / "s.yaml", "name: s\nglobal_batch: 8\nmin_pp: 4\nmax_pp: 2\n", load_search)
    assert "'min_pp'" in msg and "'max_pp'" in msg


def test_cluster_reports_unknown_gpu_and_bad_count_together(tmp_path, conf_root):
    msg = _bad_input(tmp_path / "c.yaml", "name: c\ninter_node_bandwidth_gbps: 10\nnodes:\n  - {gpu: a100-80g, count: 0}\n"
                     "  - {gpu: nope-1g, count: 2}\n", load_cluster, conf_root)
    assert "'nodes.0.count'" in msg and "'nodes.1.gpu'" in msg and "nope-1g" in msg


def test_specs_validate_at_construction_naming_every_field():
    with pytest.raises(SpecError) as e:
        ModelArch(name="x", layers=0, hidden=64, ffn_hidden=0, heads=4, query_groups=2, vocab=1, seq_len=8, mlp="relu")
    assert {p[0] for p in e.value.problems} == {"layers", "ffn_hidden", "mlp"}
    assert isinstance(e.value, InputError)  # bad input: exit code 2
    with pytest.raises(SpecError, match="query_groups"):
        ModelArch(name="x", layers=1, hidden=64, ffn_hidden=8, heads=4, query_groups=3, vocab=1, seq_len=8)
    with pytest.raises(SpecError, match="'count'"):
        Node(gpu=GpuType(name="g", vendor="v", memory_gib=1, peak_tflops_bf16=1, memory_bandwidth_gbps=1,
                         intra_node_bandwidth_gbps=1), count=0)
    with pytest.raises(SpecError, match="recompute_levels.*allowed: none, selective, full, block"):
        SearchSpace(name="s", global_batch=8, recompute_levels=("sometimes",))


def test_search_space_is_built_normalised(conf_root):
    s = SearchSpace(name="s", global_batch=8, tp_options=(4, 1, 4), micro_batch_options=(2, 1),
                    recompute_levels=("full", "none", "full"))
    assert (s.tp_options, s.micro_batch_options, s.recompute_levels) == ((1, 4), (1, 2), ("full", "none"))
    assert s.recompute_levels == tuple(dict.fromkeys(s.recompute_levels))
    assert RECOMPUTE_LEVELS == (*(r.value for r in Recompute), "block")
    assert load_search("default", conf_root) == SearchSpace(name="default", global_batch=128, max_time_ratio=1.25)


def test_one_class_per_spec():
    """The spec dataclasses are the only spec types: no pydantic mirror (`*Yaml`) classes remain."""
    import inspect

    import pydantic

    import memx.domain.catalog
    import memx.domain.specs
    import memx.simulator.traits

    for module in (memx.domain.catalog, memx.domain.specs, memx.simulator.traits):
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
        assert not [c for c in classes if c.__name__.endswith("Yaml") or issubclass(c, pydantic.BaseModel)]
    domain = Path(memx.domain.specs.__file__).parent
    assert not [p for p in domain.glob("*.py") if "Yaml(" in p.read_text()]
    assert type(load_gpu("a100-80g")) is GpuType and type(load_model("llama2-7b")) is ModelArch


def test_size_bounds_are_inclusive_and_documented(tmp_path):
    """A bound itself is accepted, one above it is refused naming the field and the bound."""
    from memx.domain import specs

    per_node = specs.MAX_GPUS_PER_NODE
    nodes = "\n".join([f"  - {{gpu: h100-80g, count: {per_node}}}"] * (specs.MAX_CLUSTER_GPUS // per_node))
    big = tmp_path / "big.yaml"
    big.write_text(f"name: big\ninter_node_bandwidth_gbps: 50\nnodes:\n{nodes}\n")
    assert load_cluster(big).total_gpus == specs.MAX_CLUSTER_GPUS
    big.write_text(big.read_text() + "  - {gpu: h100-80g, count: 1}\n")
    with pytest.raises(InputError, match=r"field 'nodes': hold at most 65536 GPUs"):
        load_cluster(big)
    arch = dict(name="m", hidden=64, ffn_hidden=64, heads=4, query_groups=4, vocab=8, seq_len=8)
    assert ModelArch(layers=specs.MAX_LAYERS, **arch).layers == 1024
    with pytest.raises(SpecError, match=r"field 'layers': must be ≤ 1024; got 1025$"):
        ModelArch(layers=specs.MAX_LAYERS + 1, **arch)
    for name in ("MAX_GPUS_PER_NODE", "MAX_CLUSTER_GPUS", "MAX_LAYERS", "MAX_WIDTH", "MAX_SEQ_LEN", "MAX_VOCAB"):
        assert f"{name} = " in Path(specs.__file__).read_text()  # each bound is one named, commented constant
