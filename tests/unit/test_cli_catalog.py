"""Layered catalogs (the user's --conf folder over $MEMX_HOME/conf over the packaged conf/) and
`memx cluster add-node` writing the user's catalog, never the packaged one, with comments kept."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.catalog import load_cluster, packaged_conf_root
from memx.domain.home import memx_home

runner = CliRunner()
MINE = """# my cluster
name: mine
inter_node_bandwidth_gbps: 25   # one 200 Gb/s NIC per node
nodes:
  - gpu: a100-80g   # the old node
    count: 4
  - gpu: h100-80g
    count: 4
"""


def _user_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "user-conf"
    (conf / "clusters").mkdir(parents=True)
    (conf / "clusters" / "mine.yaml").write_text(MINE)
    return conf


def test_a_folder_with_only_clusters_finds_the_packaged_gpus_and_search(tmp_path):
    conf = _user_conf(tmp_path)
    res = runner.invoke(app, ["plan", "--conf", str(conf), "--cluster", "mine", "--model", "llama-6l", "--search",
                              "small", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    sim = runner.invoke(app, ["simulate", "plan", str(tmp_path / "out" / "plan.json"), "--conf", str(conf)])
    assert sim.exit_code == 0, sim.output  # the packaged simulator traits too


def test_the_user_wins_on_a_name_clash_and_catalog_says_where_each_entry_comes_from(tmp_path):
    conf = _user_conf(tmp_path)
    (conf / "clusters" / "xy-2.yaml").write_text(MINE.replace("name: mine", "name: xy-2"))
    assert load_cluster("xy-2", conf).total_gpus == 8  # the packaged xy-2 has 2
    res = runner.invoke(app, ["catalog", "clusters", "--conf", str(conf)])
    rows = dict(line.split() for line in res.stdout.splitlines())
    assert rows["xy-2"] == str(conf / "clusters") and rows["mine"] == str(conf / "clusters")
    assert rows["three-vendor-20"] == str(packaged_conf_root() / "clusters")


def test_a_missing_conf_folder_says_so(tmp_path):
    res = runner.invoke(app, ["catalog", "--conf", str(tmp_path / "nope")])
    assert res.exit_code == 2 and f"catalog folder {tmp_path / 'nope'}" in res.stderr and "no such folder" in res.stderr


def test_add_node_to_a_packaged_cluster_writes_memx_home_and_keeps_comments(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    packaged = packaged_conf_root() / "clusters" / "xy-2.yaml"
    before = packaged.read_text()
    res = runner.invoke(app, ["cluster", "add-node", "xy-2", "--gpu", "a100-80g", "--count", "4"])
    assert res.exit_code == 0, res.output
    written = memx_home() / "conf" / "clusters" / "xy-2.yaml"
    assert f"wrote {written}" in res.stdout and packaged.read_text() == before
    assert written.read_text() == before + "  - {gpu: a100-80g, count: 4}\n"  # the header comment is kept
    assert load_cluster("xy-2").gpu_count("a100-80g") == 4  # $MEMX_HOME/conf wins over the packaged entry


def test_add_node_to_a_user_file_edits_it_in_place_with_its_comments(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    conf = _user_conf(tmp_path)
    res = runner.invoke(app, ["cluster", "add-node", "mine", "--gpu", "h100-80g", "--count", "2", "--conf", str(conf)])
    assert res.exit_code == 0, res.output
    text = (conf / "clusters" / "mine.yaml").read_text()
    assert text == MINE + "  - gpu: h100-80g\n    count: 2\n"
    assert yaml.safe_load(text)["nodes"][-1] == {"gpu": "h100-80g", "count": 2}
    assert not (memx_home() / "conf").exists()
