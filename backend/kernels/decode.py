"""Paged decode attention (flash decoding): one query token per sequence over its paged KV.

Grid of stage 1: (sequence, KV head, split). A program owns the G = heads / kv_heads query heads
that share one KV head (GQA/MQA: K/V are read once for the whole group; G is padded to 16 rows so
tl.dot applies) and one contiguous slice of the context. It walks its slice BLOCK_N tokens at a
time; a tile spans BLOCK_N / block_size cache blocks, found through the block table::

    tokens   0 .. 15 | 16 .. 31 | 32 .. 47 | ...      (block_size 16, BLOCK_N 64: 4 blocks a tile)
    table    [  7    ,   2      ,   9      , ... ]    physical block ids, any order
    split    |<------- split 0 ------->|<-- split 1 ...

Each split keeps a running max / sum (online softmax, base 2) and writes its partial output and
log-sum-exp; stage 2 merges the splits. With a single split, stage 1 writes the output directly.
The number of splits is chosen from the table width (an upper bound of the context, so no host
sync) and the batch, so that a few small sequences with long contexts still fill every SM.
Offsets are int64: caches larger than 2**31 elements are addressed correctly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.kernels.softmax import online_softmax_step, qk_scores

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["tune_bucket", "num_splits", "split_len"])
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_os, stride_oh,
    num_heads, split_len, num_splits, tune_bucket,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kvh * GROUP + g                                                     # [BLOCK_G]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(k_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    n_off = tl.arange(0, BLOCK_N)
    for tile in range(start, end, BLOCK_N):
        tok = tile + n_off
        t_mask = tok < end
        blk = tl.load(bt_ptr + seq * stride_bts + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = (tok % BLOCK_SIZE).to(tl.int64)
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + blk[:, None] * stride_kb + slot[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.where(t_mask[None, :], qk_scores(q, k, IEEE) * scale_log2, float("-inf"))  # [BLOCK_G, BLOCK_N]
        v = tl.load(v_ptr + blk[:, None] * stride_vb + slot[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, s, v, IEEE)

    o_mask = g_mask[:, None] & d_mask[None, :]
    if SINGLE:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # partial buffers: out [S, H, num_splits, BLOCK_D], lse [S, H, num_splits], contiguous fp32
        row = (seq * num_heads + heads) * num_splits + split                    # [BLOCK_G]
        part = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(part_out_ptr + row[:, None] * BLOCK_D + d[None, :], part, mask=o_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


# On a GPU the tile size, warps and pipeline depth are tuned per (shape, size bucket of the launch);
# split lengths are multiples of 128, so every candidate tile divides them.
_TUNE_CONFIGS = [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
                 for bn, w, st in ((32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2))]
_decode_split_tuned = triton.autotune(configs=_TUNE_CONFIGS,
                                      key=["GROUP", "HEAD_DIM", "BLOCK_SIZE", "SINGLE", "tune_bucket"])(
    _decode_split_kernel)
SPLIT_MULTIPLE = 128


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, stride_os, stride_oh, num_heads, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    sp = tl.arange(0, BLOCK_SPLITS)
    d = tl.arange(0, BLOCK_D)
    row = (seq * num_heads + head) * num_splits
    lse = tl.load(part_lse_ptr + row + sp, mask=sp < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)                                                        # empty splits weigh 0
    parts = tl.load(part_out_ptr + (row + sp)[:, None] * BLOCK_D + d[None, :],
                    mask=(sp < num_splits)[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


def decode_split_plan(num_seqs: int, num_kv_heads: int, head_dim: int, block_size: int, table_width: int,
                      device: torch.device, num_splits: int | None = None,
                      block_n: int | None = None) -> tuple[int, int, int]:
    """(splits, split_len, block_n): about 8 programs per SM (a small tail wave), each split >= 4 tiles.

    Depends only on shapes (the table width bounds the context), so it needs no host sync.
    """
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32
        if block_size <= 128:
            block_n = max(block_n, triton.next_power_of_2(block_size))
    max_len = max(1, table_width * block_size)
    most = max(1, triton.cdiv(max_len, 4 * block_n))
    if num_splits is None:
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            want = triton.cdiv(8 * sms, max(1, num_seqs * num_kv_heads))
        else:
            want = 4
        num_splits = max(1, min(want, most, 64))
    step = max(block_n, SPLIT_MULTIPLE)
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), step) * step
    return triton.cdiv(max_len, split_len), split_len, block_n


def decode_tune_bucket(num_seqs: int, num_splits: int) -> int:
    """The autotuning bucket: sequences (log2) and whether the launch splits."""
    return num_seqs.bit_length() * 2 + (num_splits > 1)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           *, num_splits: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """q [S, H, D]; caches [B, block_size, KVH, D]; block_tables [S, W] int32; context_lens [S] int32.

    Returns out [S, H, D] (q's dtype). ``num_splits`` / ``block_n`` override the heuristics (tests);
    on CUDA without ``block_n`` the tile is autotuned.
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    block_n_arg = block_n
    splits, split_len, block_n = decode_split_plan(num_seqs, num_kv_heads, head_dim, block_size,
                                                   block_tables.shape[1], q.device, num_splits, block_n)
    if splits > 1:
        part_out = torch.empty(num_seqs, num_heads, splits, block_d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    ieee = q.dtype == torch.float32 or k_cache.dtype == torch.float32
    tuned = q.device.type == "cuda" and block_n_arg is None
    kernel = _decode_split_tuned if tuned else _decode_split_kernel
    meta = {} if tuned else {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}
    kernel[(num_seqs, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        num_heads, split_len, splits, decode_tune_bucket(num_seqs, splits),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, SINGLE=splits == 1, IEEE=ieee, **meta,
    )
    if splits > 1:
        _decode_merge_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1), num_heads, splits,
            HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_SPLITS=max(2, triton.next_power_of_2(splits)), num_warps=4,
        )
    return out
