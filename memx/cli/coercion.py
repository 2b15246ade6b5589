"""Command-line values of the common kinds converted without pydantic (issue #26: a CLI that starts instantly).

typer 0.29 converts every parameter value — given or default — through a pydantic TypeAdapter built on
first use (`typer.core._TyperParameter.get_runtime_param`, `typer._adapters.build_leaf_adapter`): the
first one of a process imports pydantic's schema machinery and builds ≈ 20 adapters, ≈ 0.15–0.2 CPU s of
every `memx plan` (docs/benchmarks.md §Issue #26: plan CPU (session 4)). `install(command)` gives each
parameter of a command (and of its sub-commands) a `QuickParam`: a value whose conversion is certain —
a str for a str parameter, a bool for a flag, an int / float within the parameter's bounds (a Python int,
a float, or plain decimal digits), an enum member or a name typer's own choice matcher accepts
(`typer._param_types.coerce_cli_choice`), a path through typer's own path checks
(`typer._param_types.coerce_cli_path`) — gives the value typer's adapter gives (tests/unit/test_cli_coercion.py
compares the two on a table of values). Anything else (another annotation, a parser, a file, a list, a
value that would be refused or rounded) goes to typer's own adapter, so every error message and exit code
is typer's. `None` never reaches a converter (typer's `RuntimeParam.coerce` returns it first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from typer._coercion import RuntimeParam, build_runtime_param
from typer._param_types import coerce_cli_choice, coerce_cli_path

SLOW = object()  # "not certain here": typer's adapter converts the value
_DIGITS = re.compile(r"(0|[1-9][0-9]*)\Z")  # a plain decimal int: the same int for int() and pydantic
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?\Z")  # a plain decimal: both parse it correctly rounded


@dataclass(frozen=True)
class QuickParam(RuntimeParam):
    """typer's RuntimeParam with the common values converted here (module docstring); typer's own otherwise."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            out = quick_value(self.annotation, self.parameter_info, value, param, ctx)
        except Exception:  # noqa: BLE001 - refused here: typer's adapter refuses it with typer's message
            out = SLOW
        if out is not SLOW:
            return out
        real = build_runtime_param(param.type_descriptor)
        param._runtime_param = real
        return real._coerce_value(value, param=param, ctx=ctx)


def quick_value(annotation: Any, info: Any, value: Any, param: Any = None, ctx: Any = None) -> Any:
    """typer's conversion of `value` for a parameter of this annotation and ParameterInfo, or SLOW."""
    if getattr(info, "parser", None) is not None:
        return SLOW
    if annotation is str:
        return value if type(value) is str else SLOW
    if annotation is bool:
        return value if type(value) is bool else SLOW
    if annotation is int or annotation is float:
        return _number(annotation, info, value)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return coerce_cli_choice(value, choices=list(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
    if annotation is Path and getattr(info, "path_type", None) is None:
        if type(value) is str and value:
            value = Path(value)
        return coerce_cli_path(value, info, path_type=Path, param=param, ctx=ctx) if isinstance(value, Path) else SLOW
    return SLOW


def _number(kind: type, info: Any, value: Any) -> Any:
    if info.clamp:
        return SLOW
    if type(value) is str and (_DIGITS if kind is int else _DECIMAL).match(value):
        value = kind(value)
    if type(value) is not kind:
        return SLOW
    if (info.min is not None and not value >= info.min) or (info.max is not None and not value <= info.max):
        return SLOW  # out of range (or nan): typer's adapter words the error
    return value


def install(command: Any) -> None:
    """QuickParam on every typer parameter of `command` and its sub-commands not yet converted."""
    for p in getattr(command, "params", ()):
        install_param(p)
    for sub in getattr(command, "commands", {}).values():
        install(sub)


def install_param(p: Any) -> None:
    """QuickParam on one typer parameter (none on a file parameter, or one whose converter typer built)."""
    d = getattr(p, "type_descriptor", None)
    if d is not None and getattr(p, "_runtime_param", False) is None and d.file_annotation is None:
        p._runtime_param = QuickParam(parameter_info=d.parameter_info, annotation=d.annotation)

