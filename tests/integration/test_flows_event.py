"""The event → flow path with a real Prefect server: `memx cluster add-node` emits
memx.cluster.changed, the reprofile-on-hardware deployment's trigger fires, a served runner runs the
pipeline, and the new plan lands in the store. Slow (a served runner, a whole small pipeline)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from memx.pipeline.store import store_from_uri

pytestmark = pytest.mark.slow

SERVE = textwrap.dedent('''
    import sys
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect import serve
    from flows.reprofile import reprofile_on_hardware_flow
    conf, store = sys.argv[1], sys.argv[2]
    trigger = DeploymentEventTrigger(
        expect={"memx.cluster.changed"}, match={"prefect.resource.id": "memx.cluster.*"},
        parameters={"cluster": "{{ event.payload.cluster }}", "gpu": "{{ event.payload.gpu }}",
                    "conf": conf, "model": "llama-6l", "search": "small", "store": store})
    dep = reprofile_on_hardware_flow.to_deployment(name="reprofile-on-hardware", triggers=[trigger])
    serve(dep, limit=1)
''')


def test_add_node_event_triggers_replanning(prefect_api, conf_root, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.settings import PREFECT_API_URL
    from typer.testing import CliRunner

    from memx.cli.app import app

    conf, store = tmp_path / "conf", str(tmp_path / "artifacts")
    shutil.copytree(conf_root, conf)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "MEMX_HOME": str(tmp_path / "home")}
    runner = subprocess.Popen([sys.executable, "-c", SERVE, str(conf), store], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    try:
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not client.read_deployments(
                    deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["reprofile-on-hardware"]))):
                time.sleep(1)
            time.sleep(8)  # the triggers service loads the deployment's automation
            res = CliRunner().invoke(app, ["cluster", "add-node", "three-vendor-20", "--gpu", "a100-80g", "--count", "4",
                                           "--conf", str(conf)])
            assert res.exit_code == 0 and "emitted memx.cluster.changed" in res.stdout, res.output
            runs = []
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                runs = [r for r in client.read_flow_runs() if r.state and r.state.is_final()
                        and r.name and r.flow_id]
                runs = [r for r in runs if r.deployment_id is not None]
                if runs:
                    break
                time.sleep(2)
        assert runs and runs[0].state.is_completed(), [r.state for r in runs]
        stored = {r.step for r in store_from_uri(store).list_versions()}
        assert stored == {"profile", "augment", "train", "search"}
    finally:
        runner.terminate()
        runner.wait(timeout=30)
