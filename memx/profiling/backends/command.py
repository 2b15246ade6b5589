"""`command` backend: run a user command per point (docs/architecture.md §Command backend).

The command is an argument list (never a shell). Each point is passed as JSON on stdin (the
stage_runs input columns, `model` and `micro_batches`) and through `{placeholders}` in arguments:
any point field ({tp} {layers} {micro_batch} {seq_len} {recompute} {recompute_layers} {first}
{last} {inflight} {hidden} {ffn_hidden} {heads} {query_groups} {vocab} {mlp} {gpu}), plus {model},
{micro_batches}, {global_batch} (= micro_batches × micro_batch), {nproc} (= tp) and {point_json}.
An argument that is exactly `{recompute_args}` expands to Megatron's recompute flags (none: nothing;
selective; full uniform over 1 layer; block: the first N layers).

Per point: a timeout, retries for transient failures (a non-zero exit without an OOM message), and
output parsed by memx.profiling.megatron_logs (an OOM is a real out-of-memory message, not the
words). Each launch runs in its own process group, killed when the point ends or times out, on
SIGTERM / Ctrl-C / exit of memx, and by a watchdog when memx is killed (memx.profiling.backends.launches).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from subprocess import PIPE
from typing import Any, Mapping

from memx.domain.errors import InputError
from memx.domain.plan import Recompute
from memx.domain.moe_records import MOE_COLUMNS, is_moe_row, moe_fields
from memx.domain.records import SIGNATURE_COLUMNS, failed_row, measurement_problems, ok_row
from memx.profiling.backends.launches import LAUNCHES, communicate
from memx.profiling.megatron_logs import Parsed, parse_output

EXTRA_FIELDS = ("model", "micro_batches", "global_batch", "nproc", "point_json", "recompute_args")
# micro batches per profiling iteration: enough to amortise the optimizer step over (our choice);
# at least `inflight`, so a launcher can hold that many micro batches.
MICRO_BATCHES = 8


def recompute_args(point: Mapping[str, Any]) -> list[str]:
    """Megatron-LM recompute flags for a point."""
    rc, n = point["recompute"], point.get("recompute_layers")
    if rc == Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]
    if rc == Recompute.FULL and n is not None and n < point["layers"]:
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n)]
    if rc == Recompute.FULL:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return []


def check_template(argv: list[str]) -> None:
    """Unknown {placeholders} are bad input: name them and the allowed ones."""
    if not argv:
        raise InputError("--command: empty command; give a program and its arguments")
    allowed = set(SIGNATURE_COLUMNS) | set(EXTRA_FIELDS) | set(MOE_COLUMNS)
    for arg in argv:
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(arg) if f is not None}
        except ValueError as exc:
            raise InputError(f"--command: argument {arg!r}: {exc} (write {{{{ and }}}} for literal braces)") from exc
        unknown = names - allowed
        if unknown:
            raise InputError(f"--command: unknown placeholder(s) {sorted(unknown)} in {arg!r}; "
                             f"allowed: {', '.join(sorted(allowed))}")


@dataclass(frozen=True, kw_only=True)
class CommandBackend:
    argv: tuple[str, ...]
    model_name: str
    timeout_s: float = 600.0
    retries: int = 1
    name: str = "command"
    gpu_memory_mib: Mapping[str, float] = field(default_factory=dict)
    """Device memory per GPU name, MiB: a reported peak above it is implausible (the point fails)."""

    def job(self, point: Mapping[str, Any]) -> dict[str, Any]:
        job = {c: point.get(c) for c in SIGNATURE_COLUMNS}
        if is_moe_row(point):  # a MoE stage (issue #27): its expert fields and ep, for the command to run them
            job.update(moe_fields(point))
        job["model"] = self.model_name
        job["micro_batches"] = max(MICRO_BATCHES, int(point["inflight"]))
        return job

    def expand(self, job: Mapping[str, Any]) -> list[str]:
        fields = {**job, "global_batch": job["micro_batches"] * job["micro_batch"], "nproc": job["tp"],
                  "point_json": json.dumps(job)}
        out: list[str] = []
        for arg in self.argv:
            if arg == "{recompute_args}":
                out.extend(recompute_args(job))
            else:
                out.append(arg.format_map({**fields, "recompute_args": " ".join(recompute_args(job))}))
        return out

    def _run_once(self, args: list[str], stdin: str) -> tuple[int | None, str, str, str]:
        """(exit code or None, stdout, stderr, failure reason)."""
        try:
            proc = LAUNCHES.start(args, stdin=PIPE, stdout=PIPE, stderr=PIPE, text=True, errors="replace")
        except FileNotFoundError:
            return None, "", "", f"command not found: {args[0]}"
        except PermissionError:
            return None, "", "", f"command not executable: {args[0]}"
        except OSError as exc:
            return None, "", "", f"command could not start: {args[0]}: {exc}"
        code, out, err = communicate(proc, stdin, self.timeout_s)
        return code, out, err, "" if code is not None else f"timeout after {self.timeout_s:g} s"

    def measure(self, point: Mapping[str, Any]) -> dict[str, Any]:
        job = self.job(point)
        args, stdin = self.expand(job), json.dumps(job) + "\n"
        reason = ""
        for _ in range(max(0, self.retries) + 1):
            code, out, err, reason = self._run_once(args, stdin)
            if code is None:  # not started or timed out: not transient, no retry
                return failed_row(point, status="failed", reason=reason, backend=self.name)
            parsed = _parse(out, err, job["micro_batches"])
            if parsed.status == "oom":
                return failed_row(point, status="oom", reason=parsed.reason, backend=self.name)
            if code == 0:
                if parsed.status != "ok":
                    return failed_row(point, status="failed", reason=parsed.reason, backend=self.name)
                return self._checked(ok_row(point, time_ms=parsed.time_ms, peak_mem_mib=parsed.peak_mem_mib,
                                            static_mem_mib=parsed.static_mem_mib, backend=self.name,
                                            reason=parsed.reason))
            last = (err.strip().splitlines() or [""])[-1][:160]
            reason = f"exit code {code}" + (f": {last}" if last else "")
        return failed_row(point, status="failed", reason=f"{reason} (after {self.retries} retries)",
                          backend=self.name)


    def _checked(self, row: dict[str, Any]) -> dict[str, Any]:
        """An ok row whose numbers are plausible (finite, within bounds, peak ≤ the GPU's memory), else failed."""
        problems = measurement_problems(row, self.gpu_memory_mib)
        if not problems:
            return row
        why = "; ".join(f"column '{c}': {p}" for c, p in problems)
        return failed_row(row, status="failed", reason=f"implausible output: {why}"[:300], backend=self.name)


def _parse(out: str, err: str, micro_batches: int) -> Parsed:
    """The launch's output; a malformed number in it makes the point failed, with the line and field."""
    try:
        return parse_output(out, err, micro_batches=micro_batches)
    except InputError as exc:
        return Parsed(status="failed", reason=str(exc)[:300])
