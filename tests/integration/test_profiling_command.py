"""The command backend on real small scripts: JSON, Megatron logs, OOM, hang, crash, garbage, missing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError, NothingUsable
from memx.profiling import profile
from memx.profiling.backends.command import CommandBackend, check_template
from memx.profiling.design import point

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "profiling"
PY = sys.executable


@pytest.fixture(scope="module")
def model(conf_root):
    return load_model("llama-6l", conf_root)


def _pt(model, **kw):
    base = dict(tp=2, layers=4, micro_batch=2, seq_len=2048, source="test")
    return point("a100-80g", model, **{**base, **kw})


def test_json_output_and_placeholders(model):
    be = CommandBackend(argv=(PY, str(FIX / "json_ok.py"), "--tp={tp}", "{layers}", "{recompute_args}"),
                        model_name=model.name, timeout_s=20)
    row = be.measure(_pt(model, recompute="full", recompute_layers=2))
    assert row["status"] == "ok" and row["time_ms"] == pytest.approx(1.5 * 4 * 2 / 2)
    assert row["peak_mem_mib"] == pytest.approx(100 + 50 * 4 / 2) and row["static_mem_mib"] == 100.0
    assert row["backend"] == "command" and row["source"] == "test"
    args = be.expand(be.job(_pt(model, recompute="full", recompute_layers=2)))
    assert args[2:] == ["--tp=2", "4", "--recompute-granularity", "full", "--recompute-method", "block",
                        "--recompute-num-layers", "2"]


def test_megatron_logs_and_oom(model):
    be = CommandBackend(argv=(PY, str(FIX / "megatron_like.py"), "8"), model_name=model.name, timeout_s=20)
    ok = be.measure(_pt(model, layers=4))
    assert ok["status"] == "ok" and ok["time_ms"] == pytest.approx(400.0 / 8)  # median / micro_batches (8)
    assert ok["peak_mem_mib"] == pytest.approx(6000.0)
    oom = be.measure(_pt(model, layers=9))
    assert oom["status"] == "oom" and "out of memory" in oom["reason"] and oom["time_ms"] is None


def test_hang_times_out_quickly(model):
    be = CommandBackend(argv=(PY, str(FIX / "hang.py")), model_name=model.name, timeout_s=0.5, retries=3)
    t0 = time.monotonic()
    row = be.measure(_pt(model))
    assert time.monotonic() - t0 < 5  # no retries of a timeout
    assert row["status"] == "failed" and row["reason"].startswith("timeout after 0.5")


def test_crash_is_retried_a_bounded_number_of_times(model, tmp_path):
    count = tmp_path / "attempts"
    be = CommandBackend(argv=(PY, str(FIX / "crash.py"), str(count)), model_name=model.name, timeout_s=20, retries=2)
    row = be.measure(_pt(model))
    assert row["status"] == "failed" and "exit code 3" in row["reason"] and "NCCL" in row["reason"]
    assert count.read_text() == "3"  # first try + 2 retries


def test_transient_failure_succeeds_on_retry(model, tmp_path):
    be = CommandBackend(argv=(PY, str(FIX / "flaky.py"), str(tmp_path)), model_name=model.name, timeout_s=20, retries=1)
    assert be.measure(_pt(model))["status"] == "ok"


def test_garbage_missing_and_not_executable(model, tmp_path):
    garbage = CommandBackend(argv=(PY, str(FIX / "garbage.py")), model_name=model.name).measure(_pt(model))
    assert garbage["status"] == "failed" and "unparseable output" in garbage["reason"]
    missing = CommandBackend(argv=("/nonexistent/profiler",), model_name=model.name).measure(_pt(model))
    assert missing["status"] == "failed" and "command not found" in missing["reason"]
    script = tmp_path / "noexec.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    noexec = CommandBackend(argv=(str(script),), model_name=model.name).measure(_pt(model))
    assert noexec["status"] == "failed" and "not executable" in noexec["reason"]


def test_unknown_placeholder_is_bad_input():
    with pytest.raises(InputError, match="unknown placeholder.*'pp'"):
        check_template(["prog", "--pp={pp}"])


def test_profile_where_every_point_fails_is_nothing_usable(conf_root, tmp_path):
    """Every point fails: each is still measured and kept (failed, with why), then NothingUsable (exit 5)
    summarises the reasons; the 3-point grid is not run (it would fail the same way)."""
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    with pytest.raises(NothingUsable) as e:
        profile(c, m, s, backend="command", command=[PY, str(FIX / "garbage.py")], jobs=4, timeout_s=20,
                out_dir=tmp_path)
    runs = pd.read_parquet(tmp_path / "stage_runs.parquet")
    assert e.value.exit_code == 5 and e.value.counts == {"failed: unparseable output": len(runs)}
    assert (runs.status == "failed").all() and runs.time_ms.isna().all()  # failures are never numbers
    assert "measured none of" in str(e.value) and "unparseable output" in str(e.value)
    assert len(e.value.examples) == 3 and not (tmp_path / "sensitivity.md").exists()


@pytest.mark.slow
def test_profile_with_megatron_like_command_in_parallel(conf_root, tmp_path):
    c, m, s = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)
    r = profile(c, m, s, backend="command", command=[PY, str(FIX / "megatron_like.py"), "4"], jobs=4,
                out_dir=tmp_path)
    assert r.failed == 0 and r.oom > 0 and (r.stage_runs[r.stage_runs.status == "ok"].layers <= 4).all()


def test_shipped_megatron_template_is_valid_and_expands(model, conf_root):
    import yaml

    tpl = yaml.safe_load((conf_root / "backends" / "megatron.yaml").read_text())
    check_template(tpl["command"])
    be = CommandBackend(argv=tuple(tpl["command"]), model_name=model.name)
    args = be.expand(be.job(_pt(model, tp=4, layers=3, recompute="selective")))
    joined = " ".join(args)
    assert "--nproc-per-node 4" in joined and "--num-layers 3" in joined
    assert "--recompute-granularity selective" in joined and "--global-batch-size 16" in joined


def test_implausible_numbers_fail_the_point(model):
    """A 6e9 MiB peak on an 80 GiB GPU, or an infinite time, is not a measurement."""
    for output, column in (('{"time_ms": 5.0, "peak_mem_mib": 6e9}', "peak_mem_mib"),
                           ('{"time_ms": 1e300, "peak_mem_mib": 100}', "time_ms")):
        program = f"print({output!r})".replace("{", "{{").replace("}", "}}")  # braces are placeholders
        be = CommandBackend(argv=(PY, "-c", program), model_name=model.name, timeout_s=20,
                            gpu_memory_mib={"a100-80g": 80 * 1024.0})
        row = be.measure(_pt(model))
        assert row["status"] == "failed" and f"column '{column}'" in row["reason"] and row["time_ms"] is None
