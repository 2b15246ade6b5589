"""Runner: resume by signature, Ctrl-C keeps what was measured, failed rows are retried."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.profiling import profile
from memx.profiling.backends.simulated import SimulatedBackend
from memx.profiling.design import point
from memx.domain.records import failed_row
from memx.profiling.runner import run_points


@dataclass
class Counting:
    """A real simulated backend that counts calls and can be interrupted (Ctrl-C) after n points."""

    inner: SimulatedBackend
    stop_after: int | None = None
    calls: list = field(default_factory=list)
    name: str = "simulated"

    def measure(self, p):
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise KeyboardInterrupt
        self.calls.append(p)
        return self.inner.measure(p)


@pytest.fixture(scope="module")
def setup(conf_root):
    c, m = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root)
    pts = [point("vendor-y-64g", m, tp=1, layers=n, micro_batch=1, seq_len=512, source="t") for n in range(1, 7)]
    return c, m, pts


def test_ctrl_c_keeps_partial_results_and_resume_finishes(setup, tmp_path):
    c, _, pts = setup
    out = tmp_path / "stage_runs.parquet"
    be = Counting(SimulatedBackend(cluster=c), stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        run_points(pts, be, out_path=out)
    partial = pd.read_parquet(out)
    assert len(partial) == 4 and (partial.status == "ok").all()
    be2 = Counting(SimulatedBackend(cluster=c))
    full = run_points(pts, be2, out_path=out)
    assert len(be2.calls) == 2 and len(full) == 6  # only the missing points were measured
    assert sorted(full.layers) == [1, 2, 3, 4, 5, 6]


def test_failed_rows_are_retried_and_replaced(setup, tmp_path):
    c, _, pts = setup
    out = tmp_path / "stage_runs.parquet"
    first = run_points(pts[:1], Counting(SimulatedBackend(cluster=c)), out_path=out)
    assert len(first) == 1
    failed = pd.DataFrame([failed_row(pts[1], status="failed", reason="timeout after 1 s", backend="simulated")])
    run_points(pts[1:2], Counting(SimulatedBackend(cluster=c)), existing=pd.concat([first, failed]), out_path=out)
    again = pd.read_parquet(out)
    assert list(again.status) == ["ok", "ok"]


def test_profile_resumes_from_out_dir(conf_root, tmp_path):
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    r1 = profile(c, m, s, out_dir=tmp_path, progress=True)
    assert r1.path.is_file() and (tmp_path / "sensitivity.md").is_file() and (tmp_path / "sensitivity.parquet").is_file()
    r2 = profile(c, m, s, out_dir=tmp_path)
    assert r2.stage_runs.measured_at.equals(r1.stage_runs.measured_at)  # nothing measured again
    assert len(r2.stage_runs) == len(r1.stage_runs) == r1.runs
