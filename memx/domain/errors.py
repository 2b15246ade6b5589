"""Errors with the exit codes the CLI maps them to (README: exit codes)."""

from __future__ import annotations


class MemxError(Exception):
    exit_code = 1


class InputError(MemxError):
    """Bad input: unknown name, invalid YAML field, inconsistent plan. Exit code 2."""

    exit_code = 2


class SpecError(InputError, ValueError):
    """A spec built with invalid fields (`memx.domain.validation`); every problem is named at once.

    `problems` holds (field, what is wrong, value) triples. A `ValueError` too, so pydantic reports it
    (with the file) when a catalog YAML is validated against the spec type at the edge."""

    def __init__(self, spec: str, problems: list[tuple[str, str, object]]):
        self.spec = spec
        self.problems = tuple(problems)
        lines = [f"  field '{field}': {what}; got {value!r}" for field, what, value in self.problems]
        super().__init__(f"invalid {spec}\n" + "\n".join(lines))

    def __reduce__(self):  # picklable across processes (Dask, Prefect)
        return (type(self), (self.spec, list(self.problems)))


class InfeasibleError(MemxError):
    """No feasible plan; the message says why. Exit code 3."""

    exit_code = 3


class CheckFailed(MemxError):
    """`memx plan --check`: the plan got worse than the baseline. Exit code 4."""

    exit_code = 4
