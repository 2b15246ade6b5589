"""Bad precision input (issue #23), table-driven: an unknown precision in a search space, a GPU entry or a
plan file, and a precision a plan's GPU cannot run. Each raises InputError (exit 2) with one line naming the
file (where there is one), the field and the allowed values; the CLI writes nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml
from typer.testing import CliRunner

from memx.cli.app import app
from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.groups import any_plan_from_dict
from memx.planner.space import enumerate_layouts

CONF = Path(__file__).resolve().parents[2] / "conf"


def _with(kind: str, entry: str, folder: Path, name: str, **raw: object) -> Path:
    data = yaml.safe_load((CONF / kind / f"{entry}.yaml").read_text())
    data.update(raw)
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def _plan_file(folder: Path, precision: object) -> Path:
    plan = {"model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 16, "micro_batch": 1, "seq_len": 4096,
            "dp": 1, "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 32, "recompute": "none"}],
            "precision": precision}
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Path], object]
    names: tuple[str, ...]


CASES = [
    Case("search-unknown-precision", lambda d: load_search(_with("search", "small", d, "s.yaml", precision="fp4")),
         ("s.yaml", "precision", "auto", "bf16", "fp16", "fp8")),
    Case("gpu-unknown-precision", lambda d: load_gpu(_with("gpus", "a100-80g", d, "g.yaml", precisions=["fp4"])),
         ("g.yaml", "precisions", "bf16", "fp16", "fp8")),
    Case("gpu-fp8-without-peak", lambda d: load_gpu(_with("gpus", "a100-80g", d, "g.yaml", precisions=["fp8"])),
         ("g.yaml", "peak_tflops_fp8")),
    Case("plan-unknown-precision", lambda d: any_plan_from_dict(json.loads(_plan_file(d, "int8").read_text()),
                                                               str(d / "plan.json")),
         ("plan.json", "precision", "bf16, fp16, fp8")),
    Case("grouped-plan-unknown-precision", lambda d: any_plan_from_dict(
        {"model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 16, "seq_len": 4096, "precision": 16,
         "groups": [{"dp": 1, "micro_batch": 1, "micro_batches": 16,
                     "stages": [{"gpu": "a100-80g", "tp": 4, "layers": 32, "recompute": "none"}]}]}, "g.json"),
         ("g.json", "precision", "bf16, fp16, fp8")),
    Case("search-fp8-on-a100", lambda d: enumerate_layouts(
        load_cluster("a100-v100-16"), load_model("llama2-7b"), load_search(_with("search", "small", d, "s.yaml",
                                                                                 precision="fp8"))),
         ("precision", "a100-80g", "bf16, fp16")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_precision_names_file_field_and_allowed(case: Case, tmp_path: Path):
    with pytest.raises(InputError) as exc:
        case.run(tmp_path)
    message = str(exc.value)
    assert all(n in message for n in case.names), message
    assert exc.value.exit_code == 2


def test_cli_unknown_precision_exits_2_with_one_line_and_writes_nothing(tmp_path: Path):
    search = _with("search", "small", tmp_path, "s.yaml", precision="fp4")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plan", "--cluster", "a100-v100-16", "--search", str(search), "--out", str(out)])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "s.yaml" in lines[0] and "precision" in lines[0] and "fp8" in lines[0], result.output
    assert not out.exists()
