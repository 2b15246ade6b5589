"""`torch` backend: really run one pipeline stage of a LLaMA/GPT decoder with PyTorch on this device.

One TP rank's shard of each layer (heads/tp, query groups/tp, ffn/tp; embedding and output layer
split over the vocabulary), RMSNorm + SwiGLU (LLaMA) or LayerNorm + GeLU (GPT), causal
scaled-dot-product attention with grouped K/V heads; the embedding on first stages, the output layer
and loss on last stages. Recomputation via torch.utils.checkpoint: full (every layer), block N (the
first N layers), selective (the attention core only). `inflight` micro batches are run forward and
held before their backward passes. TP collectives are not run (one device): time excludes them.

- time_ms: median over `repeats` of (forward+backward of `inflight` micro batches) / inflight, after
  `warmup` iterations (one Adam step is taken in warm-up so the optimizer state is resident).
- peak_mem_mib: CUDA: torch.cuda.max_memory_allocated. CPU: bytes resident before the pass (weights,
  gradients, Adam state, inputs) + the peak of the running sum of the allocations and frees that
  torch.profiler (profile_memory=True) attributes to operators — the allocator's view on CPU.
- static_mem_mib: weights + gradients + Adam state of the shard (fp32 on CPU, as measured).

torch is imported lazily; shapes are scaled down on CPU (`scale_model`) so a small model profiles in
seconds. Rows record the shapes actually run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping

from memx.domain.plan import Recompute
from memx.domain.records import failed_row, ok_row
from memx.domain.specs import ModelArch

MIB = 1024.0 * 1024.0
CPU_MAX_HIDDEN = 128  # our choice: keeps a scaled-down model's whole profile under 2 minutes on 2 CPU cores


def scale_model(model: ModelArch, factor: int) -> ModelArch:
    """Shrink widths, vocabulary and sequence by `factor`, keeping heads and query groups (so every
    tp that divides them still does)."""
    if factor <= 1:
        return model
    head_dim = max(2, model.head_dim // factor)
    return dataclasses.replace(model, name=f"{model.name}-div{factor}", hidden=model.heads * head_dim,
                               ffn_hidden=max(8, model.ffn_hidden // factor), vocab=max(64, model.vocab // factor),
                               seq_len=max(32, model.seq_len // factor))


def auto_scale(model: ModelArch, device: str) -> int:
    """1 on CUDA; on CPU the smallest power of two that brings hidden to ≤ CPU_MAX_HIDDEN."""
    factor = 1
    while device == "cpu" and model.hidden // factor > CPU_MAX_HIDDEN:
        factor *= 2
    return factor


def _modules(torch, p: Mapping[str, Any], dtype):
    nn, F = torch.nn, torch.nn.functional
    h, heads, groups = p["hidden"], p["heads"] // p["tp"], p["query_groups"] // p["tp"]
    hd, ffn, swiglu = p["hidden"] // p["heads"], p["ffn_hidden"] // p["tp"], p["mlp"] == "swiglu"

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(h, dtype=dtype))
            self.b = None if swiglu else nn.Parameter(torch.zeros(h, dtype=dtype))

        def forward(self, x):
            if swiglu:  # RMSNorm (LLaMA)
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w
            return F.layer_norm(x, (h,), self.w, self.b)

    class Layer(nn.Module):
        def __init__(self, selective: bool):
            super().__init__()
            self.n1, self.n2, self.selective = Norm(), Norm(), selective
            self.qkv = nn.Linear(h, (heads + 2 * groups) * hd, bias=not swiglu, dtype=dtype)
            self.out = nn.Linear(heads * hd, h, bias=not swiglu, dtype=dtype)
            self.up = nn.Linear(h, ffn * (2 if swiglu else 1), bias=not swiglu, dtype=dtype)
            self.down = nn.Linear(ffn, h, bias=not swiglu, dtype=dtype)

        def core(self, q, k, v):
            k = k.repeat_interleave(heads // groups, dim=1)
            v = v.repeat_interleave(heads // groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([heads * hd, groups * hd, groups * hd], dim=-1)
            q, k, v = (t.view(b, s, -1, hd).transpose(1, 2) for t in (q, k, v))
            if self.selective:
                a = torch.utils.checkpoint.checkpoint(self.core, q, k, v, use_reentrant=False)
            else:
                a = self.core(q, k, v)
            x = x + self.out(a.transpose(1, 2).reshape(b, s, heads * hd))
            u = self.up(self.n2(x))
            if swiglu:
                g, u = u.chunk(2, dim=-1)
                u = F.silu(g) * u
            else:
                u = F.gelu(u)
            return x + self.down(u)

    return Norm, Layer


def _build(torch, p: Mapping[str, Any], dtype, device):
    nn = torch.nn
    _, Layer = _modules(torch, p, dtype)
    vocab = max(1, p["vocab"] // p["tp"])
    m = nn.Module()
    m.layers = nn.ModuleList(Layer(p["recompute"] == Recompute.SELECTIVE) for _ in range(p["layers"]))
    m.emb = nn.Embedding(vocab, p["hidden"], dtype=dtype) if p["first"] else None
    m.head = nn.Linear(p["hidden"], vocab, bias=False, dtype=dtype) if p["last"] else None
    return m.to(device)


def _forward(torch, m, p, x, tokens):
    n_ckpt = 0
    if p["recompute"] == Recompute.FULL:
        n_ckpt = p["layers"] if p.get("recompute_layers") is None else int(p["recompute_layers"])
    h = m.emb(tokens) if m.emb is not None else x
    for i, layer in enumerate(m.layers):
        h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False) if i < n_ckpt else layer(h)
    if m.head is not None:
        logits = m.head(h).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), tokens.view(-1) % logits.shape[-1])
    return h.float().pow(2).mean()


@dataclass(frozen=True, kw_only=True)
class TorchBackend:
    seed: int = 0
    repeats: int = 3
    warmup: int = 1
    device: str | None = None  # None: cuda when available, else cpu
    name: str = "torch"

    def measure(self, point: Mapping[str, Any]) -> dict[str, Any]:
        import torch  # optional dependency, imported only here

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return self._measure(torch, dict(point), device)
        except torch.OutOfMemoryError as exc:
            return failed_row(point, status="oom", reason=f"out of memory: {str(exc)[:120]}", backend=self.name)

    def _measure(self, torch, p: dict[str, Any], device: str) -> dict[str, Any]:
        torch.manual_seed(self.seed)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        m = _build(torch, p, dtype, device)
        b, s = p["micro_batch"], p["seq_len"]
        tokens = torch.randint(0, p["vocab"], (b, s), device=device)
        make_x = lambda: torch.randn(b, s, p["hidden"], dtype=dtype, device=device, requires_grad=True)  # noqa: E731
        params = [q for q in m.parameters()]
        opt = torch.optim.Adam(params, lr=1e-6) if params else None

        def step() -> None:
            losses = [_forward(torch, m, p, make_x(), tokens) for _ in range(p["inflight"])]
            for loss in losses:
                loss.backward()

        for _ in range(self.warmup):
            step()
            if opt is not None:
                opt.step()
        static = sum(t.numel() * t.element_size() for q in params for t in (q, q.grad) if t is not None)
        if opt is not None:
            static += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                          if torch.is_tensor(t))
        times = []
        for _ in range(self.repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3 / p["inflight"])
        peak, how = self._peak(torch, step, device, static)
        return ok_row(p, time_ms=statistics.median(times), peak_mem_mib=peak / MIB, static_mem_mib=static / MIB,
                      backend=self.name, reason=f"torch on {device} ({dtype}); memory: {how}; no TP collectives")

    @staticmethod
    def _peak(torch, step, device: str, static: float) -> tuple[float, str]:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            step()
            return float(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
        running = top = 0
        for e in events:
            running += e.self_cpu_memory_usage
            top = max(top, running)
        return static + float(top), "resident state + peak of torch.profiler CPU allocations"
