"""KV store (new K/V into their slots) and block copy (copy-on-write pairs), in Triton.

store_kv: one program per token; slot = block * block_size + offset, a negative slot is padding.
copy_blocks: one program per (pair, chunk of the block); every cache of the list is copied with the
same pairs (one launch per cache tensor). Offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_ptr, v_ptr, slot_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h < NUM_KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(key_ptr + tok * stride_kn + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vn + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(k_ptr + blk * stride_cb + off * stride_ct + h[:, None] * stride_ch + d[None, :],
             k.to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + blk * stride_db + off * stride_dt + h[:, None] * stride_dh + d[None, :],
             v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_blocks_kernel(cache_ptr, map_ptr, block_numel, BLOCK: tl.constexpr):
    pair = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    src = tl.load(map_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(map_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < block_numel
    x = tl.load(cache_ptr + src * block_numel + offs, mask=mask)
    tl.store(cache_ptr + dst * block_numel + offs, x, mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value [N, KVH, D]; caches [B, block_size, KVH, D]; slot_mapping [N] int64 (< 0: skip)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=max(2, triton.next_power_of_2(num_kv_heads)), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1], num_warps=4,
    )


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """For each contiguous cache [B, ...] and (src, dst) row of block_mapping [P, 2] int64: cache[dst] = cache[src]."""
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    mapping = block_mapping.to(torch.int64).contiguous()
    for cache in caches:
        assert cache.is_contiguous()
        block_numel = cache[0].numel()
        chunk = min(4096, triton.next_power_of_2(block_numel))
        _copy_blocks_kernel[(num_pairs, triton.cdiv(block_numel, chunk))](cache, mapping, block_numel, BLOCK=chunk)
