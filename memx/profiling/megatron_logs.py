"""Parse what a profiling command prints: one JSON object line, or Megatron-LM log lines.

Megatron-LM (training.py) prints per log interval
    `... elapsed time per iteration (ms): 1234.5 | ...`
— a whole iteration: `micro_batches` forward+backward passes plus the optimizer step — and a memory
report `memory (MB) | allocated: A | max allocated: Y | reserved: R | max reserved: M` (bytes / 2^20,
so the "MB" are MiB; the allocator's view, below what the device shows). An out-of-memory error
prints `CUDA out of memory` / `OutOfMemoryError`.

Conversions (approximations, docs/profiling.md):
- time per micro batch = median iteration time (first interval dropped as warm-up when there are
  ≥ 3) / micro_batches — it includes 1/m of the optimizer step;
- peak_mem_mib = the largest `max allocated` over ranks and intervals;
- static_mem_mib = the smallest `allocated` reported after an iteration (activations are freed by
  then: weights, gradients and optimizer state remain).

`memx ingest megatron LOGDIR` recovers the point of each log from a header line
`memx-point: {json}` (the command backend's launcher prints one), else from Megatron's argument dump
(`  num_layers ....... 4`), with gpu and model fields given on the command line.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from typing import Any

ITER_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+(?:[eE][+-]?\d+)?)")
MEM_RE = re.compile(r"allocated:\s*([0-9.]+)\s*\|\s*max allocated:\s*([0-9.]+)")
OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory", re.IGNORECASE)
HEADER_RE = re.compile(r"memx-point:\s*(\{.*\})")
ARG_RE = re.compile(r"^\s*([a-z_]+) \.{2,}\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """What one run's output says: status ok (numbers), oom, or failed (reason, no numbers)."""

    status: str
    reason: str = ""
    time_ms: float | None = None
    peak_mem_mib: float | None = None
    static_mem_mib: float | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v == v and v >= 0 and v != float("inf") else None


def parse_json_line(text: str) -> Parsed | None:
    """The last stdout line that is a JSON object with `time_ms`; None when there is none."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or "time_ms" not in obj:
            continue
        t = _number(obj.get("time_ms"))
        if t is None:
            return Parsed(status="failed", reason=f"JSON output: 'time_ms' is not a number ≥ 0: {obj.get('time_ms')!r}")
        peak = _number(obj.get("peak_mem_mib"))
        if obj.get("peak_mem_mib") is not None and peak is None:
            return Parsed(status="failed", reason=f"JSON output: 'peak_mem_mib' is not a number: {obj.get('peak_mem_mib')!r}")
        return Parsed(status="ok", time_ms=t, peak_mem_mib=peak, static_mem_mib=_number(obj.get("static_mem_mib")))
    return None


def parse_megatron(text: str, *, micro_batches: int) -> Parsed | None:
    """Megatron-LM log lines → per-micro-batch time and memory; None when the text has neither."""
    iters = [float(x) for x in ITER_RE.findall(text)]
    if not iters:
        return None
    steady = iters[1:] if len(iters) >= 3 else iters
    time_ms = statistics.median(steady) / max(1, micro_batches)
    mems = [(float(a), float(m)) for a, m in MEM_RE.findall(text)]
    peak = max(m for _, m in mems) if mems else None
    static = min(a for a, _ in mems) if mems else None
    return Parsed(status="ok", time_ms=time_ms, peak_mem_mib=peak, static_mem_mib=static,
                  reason="" if mems else "time only: no Megatron memory report in the output")


def parse_output(stdout: str, stderr: str = "", *, micro_batches: int) -> Parsed:
    """JSON line first, then Megatron logs; an OOM message wins over numbers."""
    if OOM_RE.search(stdout) or OOM_RE.search(stderr):
        line = next((ln for ln in (stdout + "\n" + stderr).splitlines() if OOM_RE.search(ln)), "")
        return Parsed(status="oom", reason=f"out of memory: {line.strip()[:160]}")
    for parsed in (parse_json_line(stdout), parse_megatron(stdout, micro_batches=micro_batches),
                   parse_megatron(stderr, micro_batches=micro_batches)):
        if parsed is not None:
            return parsed
    head = stdout.strip().splitlines()[0][:80] if stdout.strip() else "(empty)"
    return Parsed(status="failed", reason=f"unparseable output: no JSON time_ms line or Megatron iteration time; "
                                          f"stdout starts {head!r}")


def point_from_header(text: str) -> dict[str, Any] | None:
    m = HEADER_RE.search(text)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def megatron_args(text: str) -> dict[str, str]:
    """Megatron's `arguments` dump: name → value (strings)."""
    return {k: v for k, v in ARG_RE.findall(text)}


def point_from_args(args: dict[str, str]) -> dict[str, Any]:
    """Stage point of a Megatron run with pipeline size 1: the one stage holds embedding and output."""
    def num(name: str) -> int | None:
        v = args.get(name)
        return int(v) if v is not None and v.isdigit() else None

    granularity = args.get("recompute_granularity", "None")
    method, n_rc = args.get("recompute_method", "None"), num("recompute_num_layers")
    layers = num("num_layers")
    recompute = granularity if granularity in ("selective", "full") else "none"
    rl = n_rc if recompute == "full" and method == "block" and n_rc is not None and layers and n_rc < layers else None
    point = {"tp": num("tensor_model_parallel_size"), "layers": layers, "micro_batch": num("micro_batch_size"),
             "seq_len": num("seq_length"), "recompute": recompute, "recompute_layers": rl,
             "hidden": num("hidden_size"), "ffn_hidden": num("ffn_hidden_size"),
             "heads": num("num_attention_heads"), "query_groups": num("num_query_groups"),
             "first": True, "last": True, "inflight": 1}
    if args.get("swiglu") in ("True", "False"):
        point["mlp"] = "swiglu" if args["swiglu"] == "True" else "gelu"
    gb, mb, dp = num("global_batch_size"), num("micro_batch_size"), num("data_parallel_size") or 1
    if gb and mb:
        point["micro_batches"] = gb // (mb * dp)
    pp = num("pipeline_model_parallel_size")
    if pp is not None and pp != 1:
        point["_problem"] = f"pipeline_model_parallel_size is {pp}: only single-stage runs (1) map to a stage row"
    return {k: v for k, v in point.items() if v is not None}
