"""The kept sets as they travel between the coordinator and a pool's workers (issue #26, session 6;
memx.planner.distributed).

Pickled as they are, a Keeper's few hundred kept plans (memx.planner.candidates.Cand, a dataclass with three small
arrays each) cost the deep case's coordinator ≈ 0.1 s a task — the largest part of its CPU. Here they travel as
columns: each distinct plan once (the sets share most of theirs), its floats in one float64 array (a Python float
round-trips exactly), its split, levels, stage times and peaks in flat arrays of their own dtypes, every set as
indices. `Shipped(keeper)` is what is sent; `.keeper` what arrives (the same plans, field for field). The columns
are built once per Shipped, so the same snapshot sent with many tasks costs one packing.

A task sends back only what is new (`found`): the kept plans whose key the snapshot it started from did not hold,
with the fastest times and the widest plan. `fold` merges them into the coordinator's keeper, which is exact: every
kept set is the same function of the plans offered, and its merge the set of the union (Keeper.merge) — the plans
of the snapshot are already among the coordinator's (its keeper only grows from the one that was copied), so
leaving them out changes no union; when nothing is new nothing is merged.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from memx.planner.candidates import Cand, Keeper

LISTS = ("by_time", "phi", "front", "safe_phi", "safe_margin", "safe_front")  # Keeper's kept sets
DERIVED = ("_front_index",)  # rebuilt where needed (Keeper._dominated builds it on the first query)
FLOATS = ("time_ms", "max_mib", "var_mib2", "score", "margin", "margin_high")
ARRAYS = ("level", "stage_ms", "stage_mib")


class Shipped:
    """A keeper on its way (module docstring): pickles as columns, `.keeper` on arrival."""

    def __init__(self, keeper: Keeper):
        self.keeper = keeper
        self._state: dict | None = None

    def __getstate__(self) -> dict:
        if self._state is None:
            self._state = _pack(self.keeper)
        return self._state

    def __setstate__(self, state: dict) -> None:
        self.keeper, self._state = _unpack(state), None


def found(keeper: Keeper, start: Keeper) -> Keeper | None:
    """What `keeper` (a task's, grown from the snapshot `start`) holds that `start` did not: its sets without the
    plans `start` held, its widest plan when new, its fastest times; None when nothing is new. Only for `fold`
    (its thresholds are not rebuilt)."""
    known = {c.key for name in LISTS for c in getattr(start, name)}
    if start.widest is not None:
        known.add(start.widest.key)
    out = copy.copy(keeper)
    fresh = keeper.fastest_ms < start.fastest_ms or keeper.fastest_safe_ms < start.fastest_safe_ms
    for name in LISTS:
        new = [c for c in getattr(keeper, name) if c.key not in known]
        setattr(out, name, new)
        fresh |= bool(new)
    out.widest = keeper.widest if keeper.widest is not None and keeper.widest.key not in known else None
    for name in DERIVED:
        setattr(out, name, None)
    return out if fresh or out.widest is not None else None


def fold(keeper: Keeper, new: Keeper | None) -> bool:
    """Merge a task's new plans (`found`) into the coordinator's keeper (exact: module docstring); whether any."""
    if new is None:
        return False
    keeper.merge(new)
    return True


def _pack(keeper: Keeper) -> dict:
    index: dict[int, int] = {}
    cands: list[Cand] = []
    for c in [c for name in LISTS for c in getattr(keeper, name)] + ([keeper.widest] if keeper.widest else []):
        if id(c) not in index:
            index[id(c)] = len(cands)
            cands.append(c)
    state = {k: v for k, v in keeper.__dict__.items() if k not in LISTS and k not in DERIVED and k != "widest"}
    state["_lists"] = {name: np.array([index[id(c)] for c in getattr(keeper, name)], dtype=np.int64) for name in LISTS}
    state["_widest"] = -1 if keeper.widest is None else index[id(keeper.widest)]
    state["_floats"] = np.array([[getattr(c, f) for f in FLOATS] for c in cands], dtype=np.float64).reshape(-1, len(FLOATS))
    state["_layout"] = np.array([c.layout for c in cands], dtype=np.int64)
    state["_pp"] = np.array([len(c.split) for c in cands], dtype=np.int64)
    state["_split"] = np.array([x for c in cands for x in c.split], dtype=np.int64)
    state["_arrays"] = {f: _flat([getattr(c, f) for c in cands], state["_pp"]) for f in ARRAYS}
    return state


def _flat(arrays: list[np.ndarray], pp: np.ndarray) -> np.ndarray | list[np.ndarray]:
    """One flat array when every array is 1-D, of one dtype and as long as its split (as the keeper's are), else
    the arrays themselves."""
    if arrays and all(a.ndim == 1 and a.dtype == arrays[0].dtype and len(a) == n for a, n in zip(arrays, pp.tolist())):
        return np.concatenate(arrays)
    return arrays


def _unpack(state: dict) -> Keeper:
    state = dict(state)
    lists, widest = state.pop("_lists"), state.pop("_widest")
    floats, layout, pp, split = state.pop("_floats"), state.pop("_layout"), state.pop("_pp"), state.pop("_split")
    arrays = state.pop("_arrays")
    ends = np.cumsum(pp)
    starts = ends - pp
    cols = {f: floats[:, i].tolist() for i, f in enumerate(FLOATS)}
    split_l = split.tolist()
    cands = []
    for i, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist())):
        parts = {f: _part(arrays[f], i, lo, hi) for f in ARRAYS}
        cands.append(Cand(**{f: cols[f][i] for f in FLOATS}, layout=int(layout[i]), split=tuple(split_l[lo:hi]),
                          **parts))
    keeper = Keeper.__new__(Keeper)
    keeper.__dict__.update(state)
    for name in LISTS:
        setattr(keeper, name, [cands[j] for j in lists[name].tolist()])
    keeper.widest = cands[widest] if widest >= 0 else None
    for name in DERIVED:
        setattr(keeper, name, None)
    return keeper


def _part(flat: Any, i: int, lo: int, hi: int) -> np.ndarray:
    return flat[lo:hi].copy() if isinstance(flat, np.ndarray) else flat[i]
