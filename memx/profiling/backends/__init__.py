"""Profiling backends: how one stage point becomes a stage_runs row.

| name | what |
|---|---|
| simulated | the virtual cluster (memx.simulator), seeded per point |
| command | a user command per point (real cluster: Megatron-LM launcher), JSON or Megatron logs on stdout |
| torch | a LLaMA/GPT decoder stage really run with PyTorch on the local device |
| records | imported measurements (CSV / Parquet / JSONL, Sailor profiles, Megatron log folders) |

A measuring backend has `name` and `measure(point) -> row` (a dict with STAGE_RUN_COLUMNS); it never
raises for a failed point: the row says `status` oom/failed and why.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from memx.domain.errors import InputError
from memx.domain.records import BACKENDS

__all__ = ["BACKENDS", "Backend", "check_backend"]


class Backend(Protocol):
    name: str

    def measure(self, point: Mapping[str, Any]) -> dict[str, Any]: ...


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    return name
