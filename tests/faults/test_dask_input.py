"""`memx plan --dask ADDR` with an address nothing can use (issue #26): exit 2, one `error:` line naming
--dask and what is allowed, no traceback. Only loopback addresses; the connection timeout is shortened."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from memx.planner import distributed

runner = CliRunner()
XY = ["plan", "--predictor", "analytic", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small", "--no-progress"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("spec, needle", [
    ("local:0", "at least one worker"),
    ("local:x", "expected 'local', 'local:N' or a scheduler address"),
    ("http://127.0.0.1:8786", "expected 'local', 'local:N' or a scheduler address"),
    ("tcp://127.0.0.1:8786/extra", "expected 'local', 'local:N' or a scheduler address"),
    ("closed", "no Dask scheduler answered at tcp://127.0.0.1:"),
])
def test_unusable_dask_address_exits_2_with_one_line(spec, needle, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(distributed, "CONNECT_S", 0.5)
    if spec == "closed":
        spec = f"127.0.0.1:{_closed_port()}"
    r = runner.invoke(app, [*XY, "--dask", spec])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--dask" in errors[0] and needle in errors[0], r.output
    assert "Traceback" not in r.output
