"""`memx cluster add-node`: the catalog changes atomically and bad input exits 2."""

import shutil

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
