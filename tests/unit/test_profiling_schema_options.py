"""The stage_runs columns of issue #14 (distributed_optimizer, dp, sequence_parallel: signature) and
issue #16 (phase, micro_batches, forward_ms, backward_ms: what was measured)."""

from __future__ import annotations

import pandas as pd
import pytest

from memx.domain.records import (MOE_COLUMNS, SIGNATURE_COLUMNS, STAGE_RUN_COLUMNS, signature_key, stage_run_row,
                                 stage_runs_frame, validate_stage_runs)
from memx.planner.signatures import signature_frame
from memx.planner.tables import stage_contexts
from memx.simulator import measure_stages
from memx.domain.catalog import load_model

BASE = {"gpu": "a100-80g", "tp": 2, "layers": 2, "micro_batch": 1, "seq_len": 8, "recompute": "none",
        "recompute_layers": None, "first": False, "last": False, "inflight": 1, "hidden": 8, "ffn_hidden": 8,
        "heads": 2, "query_groups": 2, "vocab": 10, "mlp": "gelu", "time_ms": 2.0}


def test_options_are_signature_columns_appended_with_defaults():
    assert SIGNATURE_COLUMNS[-4:] == ("distributed_optimizer", "dp", "sequence_parallel", "tied_embeddings")
    measured = STAGE_RUN_COLUMNS[:len(STAGE_RUN_COLUMNS) - len(MOE_COLUMNS)]  # issue #27's MoE columns come last
    assert measured[-4:] == ("phase", "micro_batches", "forward_ms", "backward_ms")
    assert STAGE_RUN_COLUMNS[-len(MOE_COLUMNS):] == MOE_COLUMNS
    assert "phase" not in SIGNATURE_COLUMNS
    old = stage_runs_frame([{k: v for k, v in BASE.items()}])  # an older row: no option, no phase
    assert (bool(old.distributed_optimizer[0]), int(old.dp[0]), bool(old.sequence_parallel[0]), old.phase[0],
            bool(old.tied_embeddings[0])) == (False, 1, False, "forward_backward", False)
    assert old.micro_batches.dtype == "Int64" and old.forward_ms.dtype == "float64"


def test_key_changes_only_with_an_option_in_effect():
    k = signature_key(BASE)
    assert k == signature_key({**BASE, "distributed_optimizer": False, "dp": 1, "sequence_parallel": False})
    assert k == signature_key({**BASE, "dp": 8})  # dp is 1 without the distributed optimizer (canonical)
    assert signature_key({**BASE, "tp": 1, "sequence_parallel": True}) == signature_key({**BASE, "tp": 1})  # no-op
    do8, do4 = (signature_key({**BASE, "distributed_optimizer": True, "dp": d}) for d in (8, 4))
    assert len({k, do8, do4, signature_key({**BASE, "sequence_parallel": True})}) == 4
    assert k == signature_key({**BASE, "phase": "forward", "micro_batches": 3})  # phase is no signature column


def test_validation_reasons_per_row():
    rows = [
        BASE,                                                                   # 0 ok, defaults
        {**BASE, "distributed_optimizer": True, "dp": 8, "sequence_parallel": "true"},  # 1 ok (CSV text bool)
        {**BASE, "phase": "iteration", "micro_batches": 4},                    # 2 ok
        {**BASE, "phase": "iteration"},                                         # 3 micro_batches missing
        {**BASE, "phase": "backward"},                                          # 4 unknown phase
        {**BASE, "phase": "forward", "forward_ms": 2.0, "backward_ms": 1.0},    # 5 backward on forward row
        {**BASE, "forward_ms": 0.5, "backward_ms": 1.0},                        # 6 0.5 + 1.0 ≠ 2.0
        {**BASE, "distributed_optimizer": True, "dp": 0},                       # 7 dp < 1
        {**BASE, "micro_batches": 3},                                           # 8 only iteration rows
        {**BASE, "forward_ms": -1.0},                                           # 9 negative
        {**BASE, "forward_ms": 0.7, "backward_ms": 1.3},                        # 10 ok
    ]
    df, rejects = validate_stage_runs(pd.DataFrame(rows))
    assert {(r.row, r.column) for r in rejects} == {(3, "micro_batches"), (4, "phase"), (5, "backward_ms"),
                                                    (6, "time_ms"), (7, "dp"), (8, "micro_batches"),
                                                    (9, "forward_ms")}
    assert "allowed: forward, forward_backward, iteration" in next(r.reason for r in rejects if r.row == 4)
    assert len(df) == 4 and list(df.phase) == ["forward_backward", "forward_backward", "iteration", "forward_backward"]
    assert list(df.dp) == [1, 8, 1, 1] and list(df.sequence_parallel) == [False, True, False, False]
    assert df.micro_batches.tolist()[2] == 4 and df.forward_ms.tolist()[3] == 0.7


def test_simulator_measures_and_records_options():
    row = {k: v for k, v in BASE.items() if k != "time_ms"} | {"hidden": 1024, "ffn_hidden": 4096, "heads": 16,
                                                                "query_groups": 16, "vocab": 32000, "seq_len": 1024}
    df = measure_stages([row, {**row, "distributed_optimizer": True, "dp": 8}, {**row, "sequence_parallel": True}],
                        seed=0)
    assert list(df.distributed_optimizer) == [False, True, False] and list(df.dp) == [1, 8, 1]
    plain, do, sp = df.static_mem_mib.tolist()
    assert do < plain and sp == pytest.approx(plain)  # DO shards states; SP moves activations only
    assert df.peak_mem_mib[2] < df.peak_mem_mib[0]
    assert (df.phase == "forward_backward").all()


def test_signature_frame_carries_the_options():
    import numpy as np

    ctx = stage_contexts(["a100-80g", "a100-80g"], [2, 1], micro_batch=1, micro_batches=4,
                         distributed_optimizer=True, dp=8, sequence_parallel=True)
    sig = signature_frame(list(ctx), np.array([4, 4]), np.array([-2, -2]), np.array([0, 1]),
                          load_model("llama2-7b"), 4096)
    # the records' columns plus the plan's precision (a predictor input, not a records column; issue #23)
    assert list(sig.columns) == [*SIGNATURE_COLUMNS, "precision"] and set(sig.precision) == {"bf16"}
    assert list(sig.dp) == [8, 8] and list(sig.sequence_parallel) == [True, False]  # SP off at tp 1
    assert signature_key(stage_run_row(sig.iloc[0].to_dict(), status="ok", backend="simulated")) \
        == signature_key(sig.iloc[0].to_dict())
