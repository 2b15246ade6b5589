"""A stage-signature row for tests (docs/architecture.md §Measurement records): LLaMA2-7B-shaped, one
stage of 8 layers on 2 A100s; keyword arguments override any column."""

from __future__ import annotations

import pandas as pd


def stage_row(**over) -> dict:
    base = dict(gpu="a100-80g", tp=2, layers=8, micro_batch=1, seq_len=4096, recompute="none",
                recompute_layers=pd.NA, first=False, last=False, inflight=2, hidden=4096, ffn_hidden=11008,
                heads=32, query_groups=32, vocab=32000, mlp="swiglu")
    base.update(over)
    return base
