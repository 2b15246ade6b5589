"""The recomputation vocabulary shared by plans and search spaces (docs/architecture.md §Recompute).

Its own module so that `memx.domain.specs` (search spaces) and `memx.domain.plan` (stages) both use it
without importing each other; `memx.domain.plan` re-exports both names.
"""

from __future__ import annotations

from enum import StrEnum


class Recompute(StrEnum):
    """Activation recomputation of a stage (docs/architecture.md §Plan JSON; Korthikanti et al. 2022).

    A `StrEnum`: members compare equal to their JSON strings. `full` with `recompute_layers = N` is
    Megatron-LM's block method (the first N layers of the stage recompute)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


PLAN_RECOMPUTE = tuple(r.value for r in Recompute)
# A search-level option only (conf/search `recompute_levels`), never a stage's `recompute`: search
# Recompute.FULL with every block size recompute_layers = 1 .. layers − 1 (Megatron's block method).
SEARCH_BLOCK = "block"
