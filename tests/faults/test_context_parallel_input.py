"""Bad context-parallel input (issue #27), through `memx simulate plan` and the search YAML: exit 2, one line
naming every factor that does not divide, nothing written. Table-driven: (case id, changes, names the message
must hold)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from tests.support.bad_plans import assert_rejected

BASE = {"model": "llama2-7b", "cluster": "three-vendor-20", "global_batch": 48, "micro_batch": 1, "seq_len": 4096,
        "dp": 1, "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 8, "recompute": "selective"},
                            {"gpu": "vendor-b-32g", "tp": 4, "layers": 12, "recompute": "full"},
                            {"gpu": "vendor-c-32g", "tp": 4, "layers": 12, "recompute": "full"}]}

CASES = [
    ("seq-not-divisible-by-cp", {"context_parallel": 3}, ("'seq_len' (4096) is not divisible by context_parallel (3)",
                                                          "2 × context_parallel (6)")),
    ("seq-not-divisible-by-2cp", {"context_parallel": 2, "seq_len": 4098}, ("2 × context_parallel (4)",)),
    ("too-many-gpus", {"context_parallel": 4}, ("dp × cp × Σ tp", "16 × vendor-b-32g")),
    ("every-factor-at-once", {"context_parallel": 3, "dp": 2, "global_batch": 47},
     ("context_parallel (3)", "2 × context_parallel (6)", "global_batch", "dp × cp × Σ tp")),
    ("zero", {"context_parallel": 0}, ("'context_parallel'", "≥ 1")),
    ("not-an-integer", {"context_parallel": "2"}, ("'context_parallel'",)),
]


@pytest.mark.parametrize("changes,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_context_parallel_exits_2_naming_each_factor(changes, names, tmp_path):
    assert_rejected({**BASE, **changes}, names, tmp_path)


@pytest.mark.parametrize("value,names", [("[0]", ("context_parallel_options",)), ("[128]", ("context_parallel_options",)),
                                         ("[]", ("context_parallel_options",)), ('["two"]', ("context_parallel_options",))],
                         ids=["zero", "above-64", "empty", "not-an-integer"])
def test_bad_context_parallel_options_exit_2(value, names, tmp_path):
    from memx.domain.catalog import load_search

    src = load_search("default")
    path = tmp_path / "space.yaml"
    path.write_text(f"name: cp-bad\nglobal_batch: {src.global_batch}\ncontext_parallel_options: {value}\n")
    res = CliRunner().invoke(app, ["plan", "--model", "llama2-7b", "--cluster", "three-vendor-20", "--search", str(path),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert any(n in ln for ln in lines for n in names), res.output
    assert not (tmp_path / "out").exists()
