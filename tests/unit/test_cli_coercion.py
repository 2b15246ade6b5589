"""memx.cli.coercion: the values converted without pydantic give exactly what typer's own adapter gives.

Every parameter of `memx plan` (str, int with a minimum, float, enum, path, optional bool) and `memx inspect`
(a path argument) is tried with the values a user types (and the defaults typer passes), each through
typer's adapter (`typer._coercion.build_runtime_param`) and through `QuickParam`: the same value and type,
or the same BadParameter message.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from memx.cli.app import app
from memx.cli.coercion import SLOW, QuickParam, quick_value

VALUES = {
    str: ["a", "", "three-vendor-20", " x ", "é"],
    int: [10, 1, 0, -1, "3", "0", "-1", "010", "abc", "1_000", " 3", "+3", "３", 3.0, True, "99999999999999999999"],
    float: [0.05, 0.0, -0.1, "0.05", "5", "1e-3", "nan", "inf", "-0.1", ".5", "5.", "0.1000000000000000055511151231257827",
            0, 2, float("nan")],
    bool: [True, False, "true", "false", "", 1],
    Path: ["x.yaml", "", ".", "/tmp", "/nonexistent/f", Path("a"), "~"],
}


def _outcome(rp, value, p, ctx):
    try:
        out = rp.coerce(value, param=p, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.format_message()
    return type(out), out


def _is_quick(ann, info, v, p, ctx) -> bool:
    try:
        return quick_value(ann, info, v, p, ctx) is not SLOW
    except ValueError:
        return False


def _params():
    """plan's parameters (every kind a command here has) and inspect's (a path argument, optional str)."""
    root = typer.main.get_command(app)
    return [(cmd, p) for cmd in (root.commands["plan"], root.commands["inspect"]) for p in cmd.params]


def test_every_plan_parameter_kind_is_covered():
    plan = typer.main.get_command(app).commands["plan"]
    kinds = {p.type_descriptor.annotation for p in plan.params}
    assert {str, int, float, bool, Path} <= kinds and any(isinstance(k, type) and k.__mro__[1:2] == (str,) for k in kinds)


def test_quick_conversion_equals_typers_adapter():
    checked = quick = 0
    for cmd, p in _params():
        d = p.type_descriptor
        if d.file_annotation is not None:
            continue
        ctx = Context(cmd)
        ann = d.annotation
        values = VALUES.get(ann, [])
        if isinstance(ann, type) and issubclass(ann, __import__("enum").Enum):
            values = [*list(ann), *[m.value for m in ann], *[str(m.value).upper() for m in ann], "nope"]
        typers = build_runtime_param(d)  # one adapter per parameter (building it is the slow part)
        for v in [*values, p.default]:
            real = _outcome(typers, v, p, ctx)
            mine = _outcome(QuickParam(parameter_info=d.parameter_info, annotation=ann), v, p, ctx)
            assert mine == real or (real[1] != real[1] and mine[1] != mine[1]), (cmd.name, p.name, v, mine, real)
            checked += 1
            quick += v is not None and mine[0] != "error" and _is_quick(ann, d.parameter_info, v, p, ctx)
    assert checked > 100 and quick > 50  # the table is exercised, and much of it by the quick path


def test_an_int_with_a_minimum():
    plan = typer.main.get_command(app).commands["plan"]
    info = next(p for p in plan.params if p.name == "top").type_descriptor.parameter_info  # --top: min 1
    for value, expected in [("3", 3), ("0", SLOW), ("010", SLOW), ("abc", SLOW), (5, 5), (0, SLOW)]:
        assert quick_value(int, info, value) is expected if expected is SLOW else quick_value(int, info, value) == expected


@pytest.mark.parametrize("args", [["plan", "--help"], ["plan", "--top", "0"], ["plan", "--format", "nope"],
                                  ["plan", "--conf", "a", "--conf", "b"], ["rank", "--help"]],
                         ids=lambda a: " ".join(a))
def test_one_command_mounted_alone_answers_as_the_whole_tree(args, tmp_path, monkeypatch):
    """`memx plan …` mounts only plan on the same root group (memx.cli.app.main): the same output and exit code
    as the whole command tree, for help and for bad input."""
    from typer.testing import CliRunner

    from memx.cli.app import build_app, full_app

    monkeypatch.setenv("MEMX_HOME", str(tmp_path))
    runner = CliRunner()
    alone, whole = runner.invoke(build_app(args[0]), args), runner.invoke(full_app(), args)
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert whole.exit_code in (0, 2) and whole.output
