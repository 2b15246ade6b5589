"""The validated-catalog cache (memx.domain.spec_cache): a hit skips pydantic (and the parsed text, PyYAML), a
changed file or another code version misses, a corrupt or foreign cache file is ignored, and only a command that
succeeds writes entries. `flush()` counts both kinds: a spec and the parsed text of its file."""

from __future__ import annotations

import pickle

import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain import spec_cache
from memx.domain.catalog import load_cluster, load_model
from memx.domain.errors import InputError

CLUSTER = """name: c2
inter_node_bandwidth_gbps: 25
nodes:
  - {gpu: a100-80g, count: 2}
"""


@pytest.fixture(autouse=True)
def _clean():
    spec_cache.discard()  # entries other tests validated in this process
    yield
    spec_cache.discard()


def _no_pydantic(monkeypatch):
    def refuse(spec_type):
        raise AssertionError(f"validated {spec_type.__name__} again instead of reading the cache")
    monkeypatch.setattr(spec_cache, "adapter", refuse)


def test_a_flushed_entry_is_read_back_without_validating(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    first = load_cluster(tmp_path / "c.yaml")
    assert spec_cache.flush() == 4  # the cluster and its GPU entry, each spec and its file's parsed text
    assert len(list(spec_cache.cache_folder().glob("*.pickle"))) == 2
    _no_pydantic(monkeypatch)
    monkeypatch.setattr(spec_cache, "load_yaml", lambda text: pytest.fail("parsed a cached text again"))
    assert load_cluster(tmp_path / "c.yaml") == first and spec_cache.flush() == 0


def test_a_changed_file_or_code_version_misses(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    load_cluster(tmp_path / "c.yaml")
    spec_cache.flush()
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("25", "50"))
    assert load_cluster(tmp_path / "c.yaml").inter_node_bandwidth_gbps == 50
    assert spec_cache.flush() == 2  # the cluster's text and spec; the GPU entry is unchanged: a hit
    monkeypatch.setattr(spec_cache, "code_version", lambda: "another memx")
    load_cluster(tmp_path / "c.yaml")
    assert spec_cache.flush() == 4


def test_a_corrupt_or_foreign_cache_file_is_ignored_and_replaced(tmp_path):
    want = load_model("llama-6l")
    spec_cache.flush()
    (entry,) = spec_cache.cache_folder().glob("*.pickle")
    for junk in (b"", b"\x80\x05 not a pickle", pickle.dumps({"hidden": 1})):
        entry.write_bytes(junk)
        assert load_model("llama-6l") == want
        assert spec_cache.flush() == 1 and pickle.loads(entry.read_bytes()) == want
    (text,) = (spec_cache.cache_folder().parent / "yaml").glob("*.pickle")  # the parsed text: unreadable is parsed
    text.write_bytes(b"\x80\x05 not a pickle")
    assert load_model("llama-6l") == want and spec_cache.flush() == 1 and isinstance(pickle.loads(text.read_bytes()), dict)


def test_only_a_command_that_succeeds_writes_entries():
    runner = CliRunner()
    bad = runner.invoke(app, ["cluster", "add-node", "xy-2", "--gpu", "a100-80g", "--count", "0"])
    assert bad.exit_code == 2 and not spec_cache.cache_folder().exists()
    ok = runner.invoke(app, ["catalog", "gpus"])
    assert ok.exit_code == 0 and len(list(spec_cache.cache_folder().glob("*.pickle"))) > 10


def test_bad_input_is_reported_as_before(tmp_path):
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("count: 2", "count: -2"))
    with pytest.raises(InputError, match="count"):
        load_cluster(tmp_path / "c.yaml")
    assert spec_cache.flush() == 3  # the GPU entry and the two parsed texts: no spec for a mapping that fails
    assert len(list(spec_cache.cache_folder().glob("*.pickle"))) == 1
    (tmp_path / "d.yaml").write_text("name: [unclosed")
    with pytest.raises(InputError, match="not valid YAML"):
        load_cluster(tmp_path / "d.yaml")
    assert spec_cache.flush() == 0  # a text that does not parse is not cached
