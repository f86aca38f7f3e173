"""Paged prefill / extend attention: new tokens attend causally to their cached context and themselves.

One kernel covers a plain prefill (context 0), a chunk of a chunked prefill, and a prefix-cache hit
(context = the cached prefix). The new tokens' K/V must already be stored in the cache (store_kv),
so every key, old or new, is read through the block table::

    sequence i:   | context_lens[i] cached tokens | n_new = cu[i+1] - cu[i] new tokens |
    q rows:                                        cu[i] ...................... cu[i+1]-1
    new token r (position context_lens[i] + r) sees keys at positions 0 .. context_lens[i] + r

Grid: (sequence, query head, tile of BLOCK_M new tokens). Tiles past a sequence's new tokens exit.
The key loop stops at the last position the tile's final row can see; only the tiles that cross
the diagonal are masked. Scores use an online softmax in base 2 with fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.kernels.softmax import online_softmax_step, qk_scores

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, lens_ptr, out_ptr,
    scale_log2,
    stride_qn, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_on, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    tile_m = tl.program_id(2)
    q_start = tl.load(cu_ptr + seq).to(tl.int64)
    n_new = (tl.load(cu_ptr + seq + 1) - tl.load(cu_ptr + seq)).to(tl.int32)
    if tile_m * BLOCK_M >= n_new:
        return
    ctx = tl.load(lens_ptr + seq)
    kvh = head // GROUP

    r = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # new-token index
    d = tl.arange(0, BLOCK_D)
    r_mask = r < n_new
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + (q_start + r.to(tl.int64))[:, None] * stride_qn + head * stride_qh + d[None, :],
                mask=r_mask[:, None] & d_mask[None, :], other=0.0).to(k_ptr.dtype.element_ty)
    q_pos = ctx + r                                                             # absolute positions
    last = ctx + tl.minimum(tile_m * BLOCK_M + BLOCK_M, n_new)                 # keys [0, last)
    diag = ctx + tile_m * BLOCK_M                                               # keys below: no mask

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_off = tl.arange(0, BLOCK_N)
    for tile in range(0, last, BLOCK_N):
        tok = tile + n_off
        t_mask = tok < last
        blk = tl.load(bt_ptr + seq * stride_bts + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = (tok % BLOCK_SIZE).to(tl.int64)
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + blk[:, None] * stride_kb + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        s = qk_scores(q, k, IEEE) * scale_log2
        if tile + BLOCK_N > diag:
            s = tl.where(t_mask[None, :] & (tok[None, :] <= q_pos[:, None]), s, float("-inf"))
        v = tl.load(v_ptr + blk[:, None] * stride_vb + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v, IEEE)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + r.to(tl.int64))[:, None] * stride_on + head * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                            scale: float, *, max_new_tokens: int | None = None) -> torch.Tensor:
    """q [N, H, D] packed new tokens; cu_seqlens_q [S + 1] int32; context_lens [S] int32 (cached before).

    Caches [B, block_size, KVH, D] already hold the new tokens' K/V; block_tables [S, W] int32.
    Returns out [N, H, D]. Pass ``max_new_tokens`` to avoid a device-to-host read of cu_seqlens_q.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1
    out = torch.empty_like(q)
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_new_tokens is None:
        max_new_tokens = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    block_d = triton.next_power_of_2(head_dim)
    block_m = 64 if q.device.type == "cuda" else 16
    block_n = 64 if q.device.type == "cuda" and head_dim <= 128 else 32 if q.device.type == "cuda" else 16
    ieee = q.dtype == torch.float32 or k_cache.dtype == torch.float32
    grid = (num_seqs, num_heads, triton.cdiv(max(1, max_new_tokens), block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, IEEE=ieee,
        num_warps=4 if head_dim <= 64 else 8, num_stages=2,
    )
    return out
