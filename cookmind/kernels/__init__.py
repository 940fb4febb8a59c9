"""Attention kernels: FlashAttention-2 as a tiled PyTorch reference and as Triton kernels.

Both are autograd Functions called as ``Kernel.apply(q, k, v, is_causal)`` with q (..., H, T, D)
and k, v (..., Hkv, T, D): any leading dims, as F.scaled_dot_product_attention takes them. Importing this package
never imports Triton; the Triton kernels are
compiled on the first CUDA call.
"""

from .flash_attention_pytorch import FlashAttentionPytorch
from .flash_attention_triton import FlashAttentionTriton

__all__ = ["FlashAttentionPytorch", "FlashAttentionTriton"]
