"""`memx cluster add-node`: the catalog changes atomically and bad input exits 2."""

import shutil
from pathlib import Path

from typer.testing import CliRunner

from memx.domain.catalog import load_cluster
from memx.cli.app import app

runner = CliRunner()


def _conf(tmp_path, conf_root):
    dst = tmp_path / "conf"
    shutil.copytree(conf_root, dst)
    return dst


def test_add_node_appends_and_reports(tmp_path, conf_root, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    conf = _conf(tmp_path, conf_root)
    with temporary_settings(updates={PREFECT_API_URL: None}):  # no Prefect server to tell
        res = runner.invoke(app, ["cluster", "add-node", "xy-2", "--gpu", "a100-80g", "--count", "4", "--conf", str(conf)])
    assert res.exit_code == 0, res.output
    c = load_cluster("xy-2", conf)
    assert c.total_gpus == 6 and c.gpu_count("a100-80g") == 4
    assert "event not emitted" in res.stdout


def test_unknown_gpu_exits_2_and_changes_nothing(tmp_path, conf_root):
    conf = _conf(tmp_path, conf_root)
    before = (conf / "clusters" / "xy-2.yaml").read_text()
    res = runner.invoke(app, ["cluster", "add-node", "xy-2", "--gpu", "b200-192g", "--conf", str(conf)])
    assert res.exit_code == 2 and "b200-192g" in res.stderr and "a100-80g" in res.stderr
    assert (conf / "clusters" / "xy-2.yaml").read_text() == before


def test_the_event_carries_what_the_triggered_replan_needs(tmp_path):
    """Issue #25: the reprofile-on-hardware deployment reads the changed file, its catalog folder, the model
    and the search space from the event (prefect.yaml), so it plans the cluster that changed."""
    import yaml

    from memx.pipeline.events import add_node, event_payload

    conf = tmp_path / "conf"
    conf.mkdir()
    change = add_node("xy-2", "a100-80g", 4, conf)
    payload = event_payload(change, "llama-6l", "small")
    assert payload["path"] == str(conf / "clusters" / "xy-2.yaml") and payload["conf"] == str(conf.absolute())
    assert (payload["model"], payload["search"], payload["count"]) == ("llama-6l", "small", 4)
    assert load_cluster(payload["path"], payload["conf"]).total_gpus == 6
    deployments = yaml.safe_load((Path(__file__).parents[2] / "prefect.yaml").read_text())["deployments"]
    params = next(d for d in deployments if d["name"] == "reprofile-on-hardware")["triggers"][0]["parameters"]
    assert {k: v.split(".")[-1].strip(" }") for k, v in params.items()} == {
        "cluster": "path", "conf": "conf", "model": "model", "search": "search", "gpu": "gpu"}
