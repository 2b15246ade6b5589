"""Bad mixture-of-experts input (issue #27): exit 2, one line naming every factor, nothing written.
Table-driven: (case id, command builder, names the message must hold). Plans go through `memx simulate plan`,
models and search spaces through `memx plan` with a catalog folder of copies (tmp_path)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memx.cli.app import app

PLAN = {"model": "mixtral-8x7b", "cluster": "h100-mi300x-32", "global_batch": 64, "micro_batch": 1, "seq_len": 4096,
        "dp": 4, "distributed_optimizer": True, "sequence_parallel": True,
        "stages": [{"gpu": "h100-80g", "tp": 4, "layers": 16}, {"gpu": "mi300x-192g", "tp": 4, "layers": 16}]}
MODEL = ("name: tiny-moe\nlayers: 4\nhidden: 1024\nffn_hidden: 2048\nheads: 8\nquery_groups: 8\nvocab: 1000\n"
         "seq_len: 512\nnum_experts: 4\n")


def _plan(tmp_path, **changes):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, **changes}))
    return ["simulate", "plan", str(path)], "plan.json"


def _model(tmp_path, extra, dense=False):
    path = tmp_path / "tiny-moe.yaml"
    path.write_text((MODEL.replace("num_experts: 4\n", "") if dense else MODEL) + extra)
    return ["plan", "--model", str(path), "--search", "small", "--cluster", "three-vendor-20"], "tiny-moe.yaml"


def _search(tmp_path, model, options):
    path = tmp_path / "ep.yaml"
    path.write_text(f"name: ep\nglobal_batch: 16\nexpert_parallel_options: {options}\n")
    return ["plan", "--model", model, "--search", str(path), "--cluster", "three-vendor-20"], "ep.yaml"


CASES = [
    ("ep-does-not-divide-experts", lambda t: _plan(t, expert_parallel=3, dp=6, global_batch=48,
                                                   stages=[dict(s, tp=2) for s in PLAN["stages"]]),
     ("expert_parallel' (3)", "num_experts (8)")),
    ("ep-does-not-divide-dp", lambda t: _plan(t, expert_parallel=8), ("does not divide dp (4)",)),
    ("ep-does-not-divide-dp-times-cp", lambda t: _plan(t, expert_parallel=8, dp=2, global_batch=32, context_parallel=2),
     ("does not divide dp × context_parallel (2 × 2)",)),
    ("every-factor-at-once", lambda t: _plan(t, expert_parallel=3, sequence_parallel=False),
     ("num_experts (8)", "dp (4)", "'sequence_parallel'")),
    ("ep-zero", lambda t: _plan(t, expert_parallel=0), ("'expert_parallel'", "≥ 1")),
    ("top-k-above-experts", lambda t: _model(t, "moe_router_topk: 5\n"), ("moe_router_topk", "'num_experts' (4)")),
    ("moe-size-on-dense-model", lambda t: _model(t, "moe_shared_expert_ffn_hidden: 512\n", dense=True),
     ("moe_shared_expert_ffn_hidden", "needs 'num_experts'")),
    ("dense-layers-not-below-layers", lambda t: _model(t, "moe_first_dense_layers: 4\n"),
     ("moe_first_dense_layers", "below 'layers' (4)")),
    ("search-ep-does-not-divide-experts", lambda t: _search(t, "mixtral-8x7b", "[1, 3, 6]"),
     ("expert_parallel_options", "[3, 6]", "num_experts (8)")),
    ("search-ep-on-dense-model", lambda t: _search(t, "llama2-7b", "[1, 2]"),
     ("expert_parallel_options", "mixture-of-experts")),
]


@pytest.mark.parametrize("build,names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_moe_input_exits_2_naming_each_factor(build, names, tmp_path):
    args, file_name = build(tmp_path)
    before = sorted(tmp_path.iterdir())
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert file_name in lines[0] or "search 'ep'" in lines[0], lines[0]
    assert sorted(tmp_path.iterdir()) == before
