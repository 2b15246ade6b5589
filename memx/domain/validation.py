"""Field constraints of the spec dataclasses, checked once when a spec is built.

A spec field carries its constraints in its annotation (`Annotated[float, Gt(0), Le(1e5)]`,
`Literal[...]`, `Annotated[tuple[...], MinLen(1)]`: the `annotated_types` vocabulary, plus `Matches`
for names). Pydantic reads the same annotations when a catalog YAML is validated at the edge
(`memx.domain.catalog`; it ignores `Matches`, which `__post_init__` then reports); `check_spec`
enforces them on every construction (`__post_init__`), then runs the spec's cross-field checks, and
raises one `SpecError` naming every offending field. A `float` or `int` field never holds NaN or ±inf.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
import types
import typing
from typing import Annotated, Any, Callable, Literal, Union

import annotated_types as at

from memx.domain.errors import SpecError

Problem = tuple[str, str, Any]  # (field, what is wrong, the value)

_BOUNDS = ((at.Gt, "gt", operator.gt, ">"), (at.Ge, "ge", operator.ge, "≥"),
           (at.Lt, "lt", operator.lt, "<"), (at.Le, "le", operator.le, "≤"))


@dataclasses.dataclass(frozen=True)
class Matches:
    """A text constraint: the whole value matches `pattern`; `what` says the rule in words."""

    pattern: str
    what: str

    def __call__(self, value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None


def _flat(meta: tuple[Any, ...]) -> list[Any]:
    """Constraint objects, with grouped ones (`Interval`) expanded."""
    out: list[Any] = []
    for m in meta:
        out.extend(_flat(tuple(m)) if isinstance(m, at.GroupedMetadata) else [m])
    return out


def _meta_problems(m: Any, value: Any) -> list[str]:
    for kind, attr, ok, sign in _BOUNDS:
        if isinstance(m, kind):
            bound = getattr(m, attr)
            return [] if ok(value, bound) else [f"must be {sign} {bound}"]
    if isinstance(m, at.MinLen) and len(value) < m.min_length:
        return [f"must hold at least {m.min_length} item(s)"]
    if isinstance(m, at.MaxLen) and len(value) > m.max_length:
        return [f"must hold at most {m.max_length} {'character' if isinstance(value, str) else 'item'}(s)"]
    if isinstance(m, Matches) and not m(value):
        return [m.what]
    return []


def _not_finite(hint: Any, value: Any) -> bool:
    return hint in (float, int) and isinstance(value, float) and not math.isfinite(value)


def value_problems(hint: Any, value: Any) -> list[str]:
    """What is wrong with `value` under the constraints of annotation `hint` ([] if nothing)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _not_finite(hint, value):
        return ["must be a finite number"]
    if origin is Annotated:
        inner = value_problems(args[0], value)
        return inner or [p for m in _flat(args[1:]) for p in _meta_problems(m, value)]
    if origin is Literal:
        return [] if value in args else [f"allowed: {', '.join(map(str, args))}"]
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        rest = [a for a in args if a is not type(None)]
        return value_problems(rest[0], value) if len(rest) == 1 else []
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and isinstance(value, tuple):
        return [f"item {i} {p}" for i, v in enumerate(value) for p in value_problems(args[0], v)]
    return []


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def field_problems(spec: Any) -> list[Problem]:
    """Every field of dataclass `spec` that breaks the constraints of its annotation."""
    return [(name, "; ".join(found), getattr(spec, name)) for name, hint in _hints(type(spec)).items()
            if (found := value_problems(hint, getattr(spec, name)))]


def check_spec(spec: Any, cross: Callable[[], list[Problem]] | None = None) -> None:
    """Field constraints, then (when they hold) the spec's cross-field checks: one SpecError naming all."""
    problems = field_problems(spec)
    if not problems and cross is not None:
        problems = cross()
    if problems:
        raise SpecError(type(spec).__name__, problems)
