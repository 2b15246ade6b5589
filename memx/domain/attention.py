"""Which GPUs run fused (FlashAttention-2) attention: what Megatron-LM's `--use-flash-attn` and Transformer
Engine's context-parallel attention need (TE's backend filter, transformer_engine/pytorch/attention/
dot_product_attention/utils.py get_attention_backend: 'Disabling UnfusedDotProductAttention as it does not
support context parallelism'; its flash and fused backends need sm80+)."""

from __future__ import annotations

from memx.domain.specs import GpuType

# NVIDIA families with FlashAttention-2 kernels: Ampere, Ada, Hopper, Blackwell (sm80+; Dao 2023, README)
FLASH_ATTENTION_FAMILIES = frozenset({
    "a10", "a16", "a30", "a40", "a100", "a800", "a6000", "rtx3090", "rtx4090", "l4", "l20", "l40", "l40s",
    "h100", "h800", "h20", "h200", "gh200", "b100", "b200", "gb200",
})


def has_flash_attention(gpu: GpuType) -> bool:
    return gpu.vendor == "nvidia" and gpu.name.split("-")[0] in FLASH_ATTENTION_FAMILIES
