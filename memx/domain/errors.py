"""Errors with the exit codes the CLI maps them to (README: exit codes).

| exit | error | meaning |
|---|---|---|
| 1 | MemxError | anything else that went wrong |
| 2 | InputError (SpecError) | bad input: names the file, field and allowed values; nothing written |
| 3 | InfeasibleError | no feasible plan |
| 4 | CheckFailed | `memx plan --check`: worse than the baseline |
| 5 | NothingUsable | every imported row was rejected, or no profiled point was measured |
| 6 | NotLaunchable | `memx plan --format megatron|flagscale`: that launcher cannot start the plan |
"""

from __future__ import annotations

from typing import Mapping, Sequence


class MemxError(Exception):
    exit_code = 1


class InputError(MemxError):
    """Bad input: unknown name, invalid YAML field, inconsistent plan. Exit code 2."""

    exit_code = 2


class SpecError(InputError, ValueError):
    """A spec built with invalid fields (`memx.domain.validation`); every problem is named at once.

    `problems` holds (field, what is wrong, value) triples. One problem gives a one-line message,
    several give one line each under a header. A `ValueError` too, so pydantic reports it (with the
    file) when a catalog YAML is validated against the spec type at the edge."""

    def __init__(self, spec: str, problems: list[tuple[str, str, object]]):
        self.spec = spec
        self.problems = tuple(problems)
        lines = [f"field '{field}': {what}; got {short_repr(value)}" for field, what, value in self.problems]
        super().__init__(f"invalid {spec}: {lines[0]}" if len(lines) == 1
                         else f"invalid {spec}\n" + "\n".join(f"  {line}" for line in lines))

    def __reduce__(self):  # picklable across processes (Dask, Prefect)
        return (type(self), (self.spec, list(self.problems)))


class InfeasibleError(MemxError):
    """No feasible plan; the message says why. Exit code 3."""

    exit_code = 3


class CheckFailed(MemxError):
    """`memx plan --check`: the plan got worse than the baseline. Exit code 4."""

    exit_code = 4


class NothingUsable(MemxError):
    """Nothing usable came out of an import or a profile: every imported row was rejected, or no
    profiled point was measured (every one failed or ran out of memory). Exit code 5.

    `counts` maps each reason (class) to how many rows/points it hit; `examples` are the first few
    rows, each a line naming the row and why. Nothing is written for a rejected import."""

    exit_code = 5

    def __init__(self, what: str, counts: Mapping[str, int], examples: Sequence[str] = ()):
        self.what = what
        self.counts = dict(counts)
        self.examples = tuple(examples)
        lines = [f"nothing usable: {what}"]
        lines += [f"  {n} × {reason}" for reason, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        lines += [f"  e.g. {example}" for example in self.examples]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # picklable across processes (Dask, Prefect)
        return (type(self), (self.what, self.counts, list(self.examples)))


def short_repr(value: object, limit: int = 80) -> str:
    """repr of a value, cut to `limit` characters (a hostile value must not flood the message)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


class NotLaunchable(MemxError):
    """`memx plan --format megatron|flagscale`: the launcher cannot start the plan; the message says why and
    what to do instead (docs/megatron.md, docs/flagscale.md). Exit code 6."""

    exit_code = 6
