"""report.html in a real browser: headless Chromium (Debian's package) loads it from disk with no
console errors and no failed loads, and its screenshot is not blank. Skipped where no browser is
installed; `make test-all` installs it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.image import imread

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search
from memx.report.html import write_report
from memx.report.table import to_json_obj

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 1200, 2000
# Chromium's stderr log (--enable-logging=stderr): page console messages are CONSOLE lines; failed
# loads are net::ERR_ codes.
PROBLEM = re.compile(r"CONSOLE.*(error|uncaught)|Uncaught|net::ERR_|Failed to load resource|Not allowed to load", re.I)


def browser() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed: make test-all installs it (apt-get install chromium)")
    return exe


def load(page: Path, shot: Path, profile: Path) -> str:
    """Open page headless, write a WIDTH×HEIGHT screenshot; returns Chromium's log."""
    cmd = [browser(), "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
           "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", page.resolve().as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0 and shot.is_file(), res.stderr[-3000:]
    return res.stderr


def problems(log: str) -> list[str]:
    return [line for line in log.splitlines() if PROBLEM.search(line)]


@pytest.fixture(scope="module")
def obj(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    return to_json_obj(search(cluster, model, load_search("small", conf_root), pred, top_k=5), "analytic")


def test_report_loads_cleanly_and_is_not_blank(obj, tmp_path):
    page = write_report(obj, tmp_path / "out")[0]
    log = load(page, tmp_path / "shot.png", tmp_path / "profile")
    assert problems(log) == [], log[-3000:]
    img = imread(tmp_path / "shot.png")
    assert img.shape[:2] == (HEIGHT, WIDTH)
    rgb = img[..., :3]
    assert float(rgb.var()) > 0.005  # text, tables and three figures, not an empty page
    assert float((rgb.mean(axis=2) < 0.5).mean()) > 0.002  # some dark pixels: text was drawn


def test_the_console_check_catches_errors(tmp_path):
    """A page with a script error and a missing image is caught: the check above is not vacuous."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p>x</p><img src="missing.png"><script>no_such_function();</script>'
                   "</body></html>", encoding="utf-8")
    log = load(bad, tmp_path / "bad.png", tmp_path / "profile")
    assert problems(log), log[-3000:]
