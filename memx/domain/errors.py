"""Errors with the exit codes the CLI maps them to (README: exit codes)."""

from __future__ import annotations


class MemxError(Exception):
    exit_code = 1


class InputError(MemxError):
    """Bad input: unknown name, invalid YAML field, inconsistent plan. Exit code 2."""

    exit_code = 2


class InfeasibleError(MemxError):
    """No feasible plan; the message says why. Exit code 3."""

    exit_code = 3


class CheckFailed(MemxError):
    """`memx plan --check`: the plan got worse than the baseline. Exit code 4."""

    exit_code = 4
