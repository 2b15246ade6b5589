"""Model variants the search may train (issue #14, opt-in): other attention heads, query groups or sequence
lengths than the job's, as the paper's deployment space searched them (SearchSpace.heads_options,
query_groups_options, seq_len_options).

A variant is a `dataclasses.replace` of the ModelArch: heads must divide hidden (head_dim = hidden / heads,
Megatron-LM's `kv_channels` default) and query_groups must divide heads (GQA, Ainslie et al. 2023), and some
tp option must divide both (Megatron-LM splits heads and groups over the TP ranks). Combinations that break a
rule are skipped; when none is left, an InputError names the fields and the allowed values. Without options
there is one variant — the job as given — and the search is exactly the one without this module. The search
treats a variant like a layout option (memx.planner.search), so the kept sets, the medians and the pick are
exact over the union of the variants' plans.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memx.domain.errors import InputError
from memx.domain.specs import ModelArch, SearchSpace

MAX_LISTED = 12  # allowed values quoted in an error message


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One model the search trains: `model` (heads, query_groups, seq_len as searched) at `seq_len` tokens."""

    model: ModelArch
    seq_len: int


def _tp_ok(heads: int, groups: int, space: SearchSpace) -> bool:
    return any(heads % t == 0 and groups % t == 0 for t in space.tp_options)


def _valid(model: ModelArch, heads: int, groups: int, space: SearchSpace) -> bool:
    return model.hidden % heads == 0 and heads % groups == 0 and _tp_ok(heads, groups, space)


def _groups_for(model: ModelArch, heads: int, space: SearchSpace) -> tuple[int, ...]:
    """The query groups tried with `heads`: the listed ones, else the model's (multi-head attention stays
    multi-head: groups = heads)."""
    if space.query_groups_options:
        return space.query_groups_options
    return (heads,) if model.query_groups == model.heads else (model.query_groups,)


def model_variants(model: ModelArch, space: SearchSpace) -> list[Variant]:
    """Every valid (heads, query_groups, seq_len) the space lists, in sorted order; [the job as given] when it
    lists none. InputError (exit 2) when it lists some and no combination is valid."""
    seq = space.seq_len or model.seq_len
    if not (space.heads_options or space.query_groups_options or space.seq_len_options):
        return [Variant(model=model, seq_len=seq)]
    pairs = [(h, g) for h in space.heads_options or (model.heads,) for g in _groups_for(model, h, space)
             if _valid(model, h, g, space)]
    if not pairs:
        raise InputError(_no_valid(model, space))
    out = []
    for s in space.seq_len_options or (seq,):
        for h, g in pairs:
            same = (h, g, s) == (model.heads, model.query_groups, model.seq_len)
            out.append(Variant(model=model if same else dataclasses.replace(model, heads=h, query_groups=g, seq_len=s),
                               seq_len=s))
    return out


def _no_valid(model: ModelArch, space: SearchSpace) -> str:
    heads = [h for h in range(1, min(model.hidden, 4096) + 1) if model.hidden % h == 0 and _tp_ok(h, h, space)]
    field = "heads_options" if space.heads_options else "query_groups_options"
    listed = list(space.heads_options or space.query_groups_options)
    return (f"search '{space.name}': field '{field}' {listed}: no (heads, query_groups) combination fits model "
            f"{model.name} (heads must divide hidden {model.hidden}, query_groups must divide heads, and a "
            f"'tp_options' value {list(space.tp_options)} must divide both); allowed heads: "
            f"{heads[:MAX_LISTED]}{' …' if len(heads) > MAX_LISTED else ''}, query_groups: divisors of the heads")


def job_changes(model: ModelArch, trained: ModelArch) -> dict[str, tuple[int, int]]:
    """{field: (the job's value, the plan's)} for heads, query_groups and seq_len that differ."""
    return {f: (getattr(model, f), getattr(trained, f)) for f in ("heads", "query_groups", "seq_len")
            if getattr(model, f) != getattr(trained, f)}
