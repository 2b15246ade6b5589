"""Parse what a profiling command prints: one JSON object line, or Megatron-LM log lines.

Megatron-LM (training.py) prints per log interval
    `... elapsed time per iteration (ms): 1234.5 | ...`
— a whole iteration: `micro_batches` forward+backward passes plus the optimizer step — and a memory
report `memory (MB) | allocated: A | max allocated: Y | reserved: R | max reserved: M` (bytes / 2^20,
so the "MB" are MiB; the allocator's view, below what the device shows). An out-of-memory error is
recognised by the real messages of PyTorch, CUDA, HIP, XLA and their libraries (`OOM_PATTERNS`), not
by the words "out of memory" (a log line "0 out of memory events" is not an OOM).

Conversions (approximations, docs/profiling.md):
- time per micro batch = median iteration time (first interval dropped as warm-up when there are
  ≥ 3) / micro_batches — it includes 1/m of the optimizer step;
- peak_mem_mib = the largest `max allocated` over ranks and intervals;
- static_mem_mib = the smallest `allocated` reported after an iteration (activations are freed by
  then: weights, gradients and optimizer state remain).

`memx ingest megatron LOGDIR` recovers the point of each log from a header line
`memx-point: {json}` (the command backend's launcher prints one), else from Megatron's argument dump
(`  num_layers ....... 4`), with gpu and model fields given on the command line.

A malformed value (`1.600.0` as a time, `"micro_batches": "eight"` in the header, a header that is
not JSON) raises `InputError` naming the source (file), the line and the field.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

from memx.domain.errors import InputError, short_repr

ITER_FIELD = "elapsed time per iteration (ms)"
ITER_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9][0-9.eE+-]*)")
MEM_RE = re.compile(r"allocated:\s*([0-9][0-9.eE+-]*)\s*\|\s*max allocated:\s*([0-9][0-9.eE+-]*)")
HEADER_RE = re.compile(r"memx-point:\s*(\{.*\})")
ARG_RE = re.compile(r"^\s*([a-z_]+) \.{2,}\s*(\S+)\s*$", re.MULTILINE)
# Header fields that must be integers (the stage_runs integer columns, and micro batches per iteration).
HEADER_INT_FIELDS = ("tp", "layers", "micro_batch", "seq_len", "recompute_layers", "inflight", "hidden",
                     "ffn_hidden", "heads", "query_groups", "vocab", "micro_batches")
# The messages that mean a device allocation failed, as the frameworks print them (not the words):
OOM_PATTERNS = tuple(re.compile(p) for p in (
    r"\b(?:CUDA|HIP|XPU|NPU|MTIA) out of memory\. Tried\b",  # PyTorch caching allocator (c10), all versions
    r"(?:Error|Exception): (?:CUDA|HIP|XPU|NPU|MTIA) out of memory\b",  # the same, as an exception line
    r"(?:^|\s)(?:torch\.(?:cuda\.)?)?OutOfMemoryError: ",  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    r"\bMPS backend out of memory \(",  # PyTorch on Apple MPS
    r"\b(?:CUDA|HIP) error: out of memory\b",  # C10_CUDA_CHECK / HIP check of a runtime call
    r"\b(?:cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|hipErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED)\b",  # runtime/library codes
    r"\bRESOURCE_EXHAUSTED: Out of memory\b",  # XLA (JAX, torch_xla) allocator
    r"\bRan out of memory in memory space \w+",  # XLA TPU compiler
    r"\bOOM when allocating tensor\b",  # TensorFlow ResourceExhaustedError
    r"\bCuda failure (?:\d+ )?'out of memory'",  # NCCL
    r"\bAllocation failed for size::\d+",  # Habana Gaudi PT_DEVMEM
))


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


def line_of(text: str, pos: int) -> int:
    """1-based line number of character `pos` of `text`."""
    return text.count("\n", 0, pos) + 1


def _float_at(text: str, m: re.Match[str], group: int, field: str, source: str) -> float:
    """The number in `m.group(group)`; InputError naming source, line and field when it is not one."""
    raw = m.group(group)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{source}: line {line_of(text, m.start(group))}, field '{field}': "
                         f"not a finite number; got {short_repr(raw)}")
    return value


def parse_megatron(text: str, *, micro_batches: int, source: str = "output") -> Parsed | None:
    """Megatron-LM log lines → per-micro-batch time and memory; None when the text has neither."""
    iters = [_float_at(text, m, 1, ITER_FIELD, source) for m in ITER_RE.finditer(text)]
    if not iters:
        return None
    steady = iters[1:] if len(iters) >= 3 else iters
    time_ms = statistics.median(steady) / max(1, micro_batches)
    mems = [(_float_at(text, m, 1, "allocated", source), _float_at(text, m, 2, "max allocated", source))
            for m in MEM_RE.finditer(text)]
    peak = max(m for _, m in mems) if mems else None
    static = min(a for a, _ in mems) if mems else None
    return Parsed(status="ok", time_ms=time_ms, peak_mem_mib=peak, static_mem_mib=static,
                  reason="" if mems else "time only: no Megatron memory report in the output")


def oom_line(text: str) -> str | None:
    """The first line of `text` carrying a real out-of-memory message (`OOM_PATTERNS`), or None."""
    for line in text.splitlines():
        if any(p.search(line) for p in OOM_PATTERNS):
            return line
    return None


def parse_output(stdout: str, stderr: str = "", *, micro_batches: int, source: str = "") -> Parsed:
    """JSON line first, then Megatron logs; an OOM message wins over numbers.

    `source` names the output in errors (a file; default "stdout" / "stderr")."""
    line = oom_line(stdout) or oom_line(stderr)
    if line is not None:
        return Parsed(status="oom", reason=f"out of memory: {line.strip()[:160]}")
    for parsed in (parse_json_line(stdout),
                   parse_megatron(stdout, micro_batches=micro_batches, source=source or "stdout"),
                   parse_megatron(stderr, micro_batches=micro_batches, source=source or "stderr")):
        if parsed is not None:
            return parsed
    head = stdout.strip().splitlines()[0][:80] if stdout.strip() else "(empty)"
    return Parsed(status="failed", reason=f"unparseable output: no JSON time_ms line or Megatron iteration time; "
                                          f"stdout starts {head!r}")


def _is_integer(value: Any) -> bool:
    return not isinstance(value, bool) and (isinstance(value, int) or
                                            (isinstance(value, float) and math.isfinite(value) and value.is_integer()))


def point_from_header(text: str, *, source: str = "output") -> dict[str, Any] | None:
    """The point of a `memx-point: {json}` header line; None when there is none.

    InputError (source, line, field) when the header is not a JSON object or an integer field is not
    an integer; whether the numbers are plausible is left to the records validation."""
    m = HEADER_RE.search(text)
    if not m:
        return None
    where = f"{source}: line {line_of(text, m.start(1))}"
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}, field 'memx-point': not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{where}, field 'memx-point': must be a JSON object; got {short_repr(obj)}")
    for name in HEADER_INT_FIELDS:
        if obj.get(name) is not None and not _is_integer(obj[name]):
            raise InputError(f"{where}, field '{name}': must be an integer; got {short_repr(obj[name])}")
    return obj


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
    if args.get("untie_embeddings_and_output_weights") in ("True", "False"):  # Megatron-LM arguments.py: tied by default
        point["tied_embeddings"] = args["untie_embeddings_and_output_weights"] == "False"
    gb, mb, dp = num("global_batch_size"), num("micro_batch_size"), num("data_parallel_size") or 1
    if gb and mb:
        point["micro_batches"] = gb // (mb * dp)
    pp = num("pipeline_model_parallel_size")
    if pp is not None and pp != 1:
        point["_problem"] = f"pipeline_model_parallel_size is {pp}: only single-stage runs (1) map to a stage row"
    return {k: v for k, v in point.items() if v is not None}
