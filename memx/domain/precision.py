"""Training precision (issue #23): what a plan computes in, and what each precision costs in bytes.

`PRECISIONS` in order of preference for `precision: auto` (the search field, memx.domain.specs.SearchSpace):
fp8 is not chosen by auto — it changes the numerics (Transformer Engine's delayed scaling) and is an
opt-in; auto takes bf16 where every GPU of the plan has it, else fp16 (V100, T4 have no bf16 units), so a
mixed V100 + A100 plan trains in fp16.

Bytes per parameter (weights + gradients + Adam state) follow Megatron-LM's own table (Megatron Core
developer guide, "Distributed Optimizer", theoretical bytes per parameter, d = data-parallel size):

| precision | params / grads          | plain | distributed optimizer |
|-----------|-------------------------|-------|-----------------------|
| fp16      | fp16 params, fp16 grads | 20    | 4 + 16/d              |
| bf16      | bf16 params, fp32 grads | 18    | 6 + 12/d              |
| fp8       | bf16 params, fp32 grads | 18    | 6 + 12/d              |

fp16: mixed precision keeps fp32 master weights and scales the loss to keep small gradients
representable (Micikevicius et al. 2018, "Mixed Precision Training", ICLR, §3.1–3.2); Megatron's
Float16OptimizerWithFloat16Params copies the fp16 grads into fp32 main grads at the step (the 20 B
row; the ZeRO paper's 16 B/param, Rajbhandari et al. 2020 §3.1, leaves out that fp32 grad copy), and
the data-parallel all-reduce moves the fp16 grads (2 B/param; Megatron forces fp32 grad all-reduce only
for bf16: arguments.py `accumulate_allreduce_grads_in_fp32`). bf16 and fp8: Megatron reduces fp32 main
grads (4 B/param). fp8 (Transformer Engine, Micikevicius et al. 2022 "FP8 Formats for Deep Learning";
TE docs "Using FP8 with Transformer Engine"): only the GEMMs run in fp8 — weights, master weights,
gradients and optimizer state stay bf16/fp32 — so its static bytes are bf16's; activations are kept in
bf16 here (TE keeps some GEMM inputs in fp8: we do not credit it, the safe side for memory).
Activations and TP/pipeline messages are 2 B per element in all three (fp16 / bf16 tensors).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from memx.domain.errors import InputError

Precision = Literal["bf16", "fp16", "fp8"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
SEARCH_PRECISIONS: tuple[str, ...] = ("auto", *PRECISIONS)
DEFAULT_PRECISION = "bf16"  # what plan files and stage signatures meant before issue #23
AUTO_ORDER = ("bf16", "fp16")  # auto's preference; fp8 only when asked for

# (plain, replicated with the distributed optimizer, sharded over dp) bytes per parameter (table above)
STATIC_BYTES: dict[str, tuple[float, float, float]] = {
    "fp16": (20.0, 4.0, 16.0),
    "bf16": (18.0, 6.0, 12.0),
    "fp8": (18.0, 6.0, 12.0),
}
GRAD_BYTES: dict[str, float] = {"fp16": 2.0, "bf16": 4.0, "fp8": 4.0}  # what data parallelism reduces
PARAM_BYTES: dict[str, float] = {"fp16": 2.0, "bf16": 2.0, "fp8": 2.0}  # what the distributed optimizer all-gathers


def check_precision(value: object, where: str, field: str = "precision", allowed: tuple[str, ...] = PRECISIONS) -> str:
    """`value` as a precision name; InputError naming `where`, the field and the allowed values."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{where}: field '{field}' must be one of {', '.join(allowed)}, got {value!r}")
    return value


def resolve_precision(requested: str, gpus: Iterable[object], where: str = "search space") -> str:
    """The precision a plan on `gpus` (GpuType-like: `name`, `precisions`) trains in.

    auto: the first of bf16, fp16 every GPU supports; a named precision must be supported by every GPU,
    else InputError (exit 2) naming the GPU and the precisions it has."""
    gpus = list(gpus)
    check_precision(requested, where, allowed=SEARCH_PRECISIONS)
    if requested == "auto":
        for p in AUTO_ORDER:
            if all(p in g.precisions for g in gpus):
                return p
        lacking = "; ".join(f"{g.name} has {', '.join(g.precisions)}" for g in gpus)
        raise InputError(f"{where}: field 'precision': no precision of {', '.join(AUTO_ORDER)} that every GPU "
                         f"supports ({lacking}); name one explicitly")
    for g in gpus:
        if requested not in g.precisions:
            raise InputError(f"{where}: field 'precision' is {requested}, which GPU {g.name} cannot run; it has "
                             f"{', '.join(g.precisions)}")
    return requested


# Megatron-LM launch flags per precision (for memx.report.megatron; docs/planner.md §Precision). bf16:
# `--bf16` (Megatron then all-reduces fp32 main grads). fp16: `--fp16` with dynamic loss scaling — Megatron's
# DynamicGradScaler when no `--loss-scale` is given; the values are Megatron-LM's argument defaults
# (initial 2^32, floor 1, window 1000, hysteresis 2), following Micikevicius et al. 2018 §3.2. fp8: Transformer
# Engine on top of bf16, `--fp8-format hybrid` (e4m3 forward, e5m2 gradients) with Megatron's recipe defaults
# (TE docs "Using FP8 with Transformer Engine"). Every flag is in tests/fixtures/megatron_arguments.json, which
# memx.report.megatron's output is checked against.
MEGATRON_FLAGS: dict[str, tuple[str, ...]] = {
    "bf16": ("--bf16",),
    "fp16": ("--fp16", "--initial-loss-scale", "4294967296", "--min-loss-scale", "1.0", "--loss-scale-window",
             "1000", "--hysteresis", "2"),
    "fp8": ("--bf16", "--fp8-format", "hybrid"),
}
