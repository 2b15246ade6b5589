"""Bad input at the command line (issue #25): each case runs one `memx` command in process (typer's
CliRunner) on a fresh $MEMX_HOME and asserts exit code, exactly one `error:` line naming the field, no
traceback, and that nothing was written — not under $MEMX_HOME (no mlflow.db, no empty .lock), not beside
the inputs. Library-level cases: tests/faults/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.home import TELEMETRY_OFF, memx_home

from test_bad_input import CSV_HEADER, CSV_ROW, log

runner = CliRunner()
XY = ["--cluster", "xy-2", "--model", "llama-6l", "--search", "small"]
PLAN = {"model": "llama-6l", "cluster": "xy-2", "global_batch": 16, "micro_batch": 1, "seq_len": 2048, "dp": 1,
        "stages": [{"gpu": "vendor-y-64g", "tp": 1, "layers": 3}, {"gpu": "vendor-x-32g", "tp": 1, "layers": 3}]}
SIG = {"gpu": "a100-80g", "tp": 1, "layers": 2, "micro_batch": 1, "seq_len": 4096, "recompute": "none", "first": False,
       "last": False, "inflight": 1, "hidden": 4096, "ffn_hidden": 11008, "heads": 32, "query_groups": 32,
       "vocab": 32000, "mlp": "swiglu"}


@dataclass(frozen=True)
class Case:
    id: str
    args: list[str]  # {d}: the input folder
    code: int
    needle: str
    setup: Callable[[Path], None] = lambda d: None
    stdin: str | None = None


def plan_file(name: str, **change) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = json.loads(json.dumps(PLAN))
        for key, value in change.items():
            if key.startswith("stage0_"):
                p["stages"][0][key.removeprefix("stage0_")] = value
            else:
                p[key] = value
        (d / name).write_text(json.dumps({"plan": p}))
    return setup


def files(content: dict[str, str | bytes]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for name, body in content.items():
            path = d / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return setup


def records_csv(*rows: dict) -> str:
    return "\n".join([CSV_HEADER] + [",".join(str({**CSV_ROW, **r}[c]) for c in CSV_HEADER.split(",")) for r in rows])


def measured(change: Callable[[pd.DataFrame], None]) -> Callable[[Path], None]:
    """config_runs of four simulated plans (tests/fixtures would go stale with the simulator), then `change`."""
    def setup(d: Path) -> None:
        from memx.domain.catalog import load_cluster, load_model, load_search
        from memx.simulator.sample import sample_plans

        df = sample_plans(load_cluster("xy-2"), load_model("llama-6l"), load_search("small"), n=4, seed=0)
        change(df)
        df.to_parquet(d / "m.parquet")
    return setup


def _peaks(df: pd.DataFrame, fn) -> None:
    df["peak_mem_mib"] = [None if v is None else fn(list(v)) for v in df["peak_mem_mib"]]


EVAL = ["evaluate", *XY, "--measured", "{d}/m.parquet", "--predictor", "analytic"]
CASES = [
    # tracebacks before #25
    Case("check-binary-baseline", ["plan", *XY, "--check", "{d}/b.json"], 2, "not a UTF-8", files({"b.json": b"\xff\xfe\x00"})),
    Case("sample-out-under-a-file", ["simulate", "sample", *XY, "--n", "2", "--seed", "0", "--out", "{d}/f/x.parquet"],
         2, "is not a folder", files({"f": "x"})),
    Case("ingest-out-under-a-file", ["ingest", "megatron", "{d}/logs", "--model", "llama2-7b", "--gpu", "a100-80g",
                                     "--out", "{d}/f/x.parquet"], 2, "is not a folder",
         files({"f": "x", "logs/run0.log": log()})),
    Case("evaluate-peaks-wrong-length", EVAL, 2, "has 3 value(s); the plan has 2 GPUs",
         measured(lambda df: _peaks(df, lambda v: v + [1000.0]))),
    Case("stage-seq-len-1e308", ["simulate", "stage"], 2, "'seq_len' must be an integer in 1..1,048,576",
         stdin=json.dumps({**SIG, "seq_len": 1e308})),
    # accepted with exit 0 before #25
    Case("check-layers-sum-5", ["plan", *XY, "--check", "{d}/b.json"], 2, "sum to 5", plan_file("b.json", stage0_layers=2)),
    Case("check-tp-3-of-32-heads", ["plan", *XY, "--check", "{d}/b.json"], 2, "tp (3) must divide heads",
         plan_file("b.json", stage0_tp=3)),
    Case("check-dp-1e30", ["plan", *XY, "--check", "{d}/b.json"], 2, "exceeds 65536", plan_file("b.json", dp=10**30)),
    Case("records-one-type-all-rejected", ["profile", *XY, "--backend", "records", "--records", "{d}/r.csv",
                                           "--no-progress"], 5, "records for vendor-x-32g: all 2 row(s) rejected",
         files({"r.csv": records_csv(*[{"gpu": "vendor-x-32g", "time_ms": -1, "layers": n} for n in (1, 2)],
                                 *[{"gpu": "vendor-y-64g", "layers": n} for n in (1, 2)])})),
    Case("records-one-type-all-failed", ["profile", *XY, "--backend", "records", "--records", "{d}/r.csv",
                                         "--no-progress"], 5, "measured none of 2 point(s)",
         files({"r.csv": records_csv(*[{"gpu": "vendor-x-32g", "time_ms": "", "peak_mem_mib": "", "layers": n}
                                   for n in (1, 2)], *[{"gpu": "vendor-y-64g", "layers": n} for n in (1, 2)])
               .replace("\n", ",failed\n").replace("peak_mem_mib,failed", "peak_mem_mib,status") + ",ok"})),
    Case("evaluate-zero-times", EVAL, 2, "'iteration_time_ms' is 0.0",
         measured(lambda df: df.__setitem__("iteration_time_ms", 0.0))),
    Case("evaluate-times-in-seconds", EVAL, 2, "look like seconds",
         measured(lambda df: df.__setitem__("iteration_time_ms", df["iteration_time_ms"] / 1000))),
    Case("evaluate-peaks-in-gib", EVAL, 2, "look like GiB", measured(lambda df: _peaks(df, lambda v: [x / 1024 for x in v]))),
    Case("evaluate-nan-peaks", EVAL, 2, "'peak_mem_mib'", measured(lambda df: _peaks(df, lambda v: [float("nan")] * len(v)))),
    Case("evaluate-negative-peaks", EVAL, 2, "holds -5.0", measured(lambda df: _peaks(df, lambda v: [-5.0] * len(v)))),
    Case("stage-1e12-layers", ["simulate", "stage"], 2, "'layers' must be an integer in 0..1,024",
         stdin=json.dumps({**SIG, "layers": 10**12})),
    # files written on bad input before #25
    Case("add-node-count-1e20", ["cluster", "add-node", "xy-2", "--gpu", "a100-80g", "--count", "99999999999999999999",
                                 "--conf", "{d}/conf"], 2, "--count must be in 1..1024", files({"conf/keep": ""})),
    Case("evaluate-registered-empty-home", ["evaluate", *XY, "--measured", "{d}/m.parquet"], 2,
         "no registered predictor", measured(lambda df: None)),
    # several lines instead of one before #25
    Case("usage-bad-int", ["plan", "--top", "x"], 2, "Invalid value for '--top'"),
    Case("usage-unknown-option", ["plan", "--topp", "3"], 2, "No such option: --topp"),
    Case("usage-missing-option", ["simulate", "sample", "--cluster", "xy-2"], 2, "Missing option"),
    # paper cuts
    Case("conf-given-twice", ["plan", *XY, "--conf", "{d}", "--conf", "{d}/other"], 2, "--conf given 2 times"),
    Case("search-unknown-field", ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", "{d}/s.yaml"], 2,
         "unknown field; allowed: name, global_batch", files({"s.yaml": "name: s\nglobal_batch: 16\nbogus: 3\n"})),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_with_one_line_and_writes_nothing(case: Case, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    case.setup(d)
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    res = runner.invoke(app, [a.replace("{d}", str(d)) for a in case.args], input=case.stdin)
    assert res.exit_code == case.code, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and case.needle in errors[0], res.stderr
    assert "Traceback" not in res.output and "╭" not in res.stderr, res.output
    if case.code == 2:  # NothingUsable (5) is a summary with a line per reason
        assert res.stderr.strip().splitlines()[-1] == errors[0]
    home = memx_home()
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before  # inputs untouched, nothing added


def test_a_valid_baseline_that_no_longer_fits_is_not_bad_input(tmp_path):
    """The other side of check-*: a plan of the model whose GPUs the cluster lacks now is reported, exit 0."""
    p = json.loads(json.dumps(PLAN))
    p["dp"], p["micro_batch"] = 4, 1  # 8 GPUs: xy-2 has 2
    (tmp_path / "b.json").write_text(json.dumps({"plan": p}))
    res = runner.invoke(app, ["plan", *XY, "--check", str(tmp_path / "b.json"), "--min-margin", "0"])
    assert res.exit_code == 0, res.output
    assert "baseline-infeasible" in res.stderr and "Baseline no longer valid" in res.stderr


def test_every_command_runs_with_telemetry_off(monkeypatch):
    for key in TELEMETRY_OFF:
        monkeypatch.delenv(key, raising=False)
    assert runner.invoke(app, ["catalog", "search"]).exit_code == 0
    assert {k: os.environ.get(k) for k in TELEMETRY_OFF} == TELEMETRY_OFF


def test_at_least_twenty_cli_cases():
    assert len(CASES) >= 20 and len({c.id for c in CASES}) == len(CASES)


def test_paper_cuts_inspect_uses_the_plans_own_specs_and_the_tp_warning_names_what_remains(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"plan": PLAN}))
    res = runner.invoke(app, ["inspect", str(tmp_path / "p.json")])  # no --cluster/--model: the plan's
    assert res.exit_code == 0 and "llama-6l on xy-2" in res.stdout, res.output
    model = tmp_path / "m28.yaml"
    model.write_text("name: m28\nlayers: 4\nhidden: 3584\nffn_hidden: 9728\nheads: 28\nquery_groups: 4\n"
                     "vocab: 32000\nseq_len: 2048\n")
    search = tmp_path / "s.yaml"
    search.write_text("name: s\nglobal_batch: 16\ntp_options: [1, 2, 4, 8]\n")
    res = runner.invoke(app, ["plan", "--cluster", "xy-2", "--model", str(model), "--search", str(search)])
    assert "tp 8 ruled out" in res.stderr and "keeps tp 1, 2, 4" in res.stderr, res.stderr


@pytest.mark.parametrize("cut", ["ends-early", "mid-line"])
def test_a_truncated_megatron_log_is_ingested_with_a_warning(tmp_path, cut, caplog):
    text = log().replace("10/ 20", "20/ 20")
    if cut == "ends-early":
        text = text.replace("20/ 20", "7/ 20")
    else:
        text = text.rstrip("\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "run0.log").write_text(text)
    args = ["ingest", "megatron", str(tmp_path / "logs"), "--model", "llama2-7b", "--gpu", "a100-80g", "--out",
            str(tmp_path / "x.parquet")]
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "truncated?" in caplog.text and "run0.log" in caplog.text, res.output
    caplog.clear()
    (tmp_path / "logs" / "run0.log").write_text(log().replace("10/ 20", "20/ 20"))
    assert runner.invoke(app, args).exit_code == 0 and "truncated" not in caplog.text  # a whole log: no warning


def test_the_batch_warning_never_has_blank_values(capsys):
    import dataclasses

    from memx.cli.plan import warn_batch
    from memx.domain.catalog import load_cluster, load_search

    space = dataclasses.replace(load_search("small"), global_batch=7, micro_batch_options=(2, 4))
    warn_batch(load_cluster("three-vendor-20"), space)
    line = capsys.readouterr().err
    assert "keeps micro batch none and dp none" in line and "  " not in line.split("rules out")[1], line
