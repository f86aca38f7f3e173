"""Triton kernels (CUDA tensors on a GPU, CPU tensors under TRITON_INTERPRET=1); twins in backend.reference."""

from backend.kernels.cache_ops import copy_blocks, store_kv
from backend.kernels.decode import paged_decode_attention
from backend.kernels.prefill import paged_prefill_attention

__all__ = ["copy_blocks", "paged_decode_attention", "paged_prefill_attention", "store_kv"]
