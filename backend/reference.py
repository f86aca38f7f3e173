"""Plain-torch versions of every backend kernel: the test oracle and the CPU execution path.

Each function has the signature of its Triton twin in ``backend.kernels``. Cache layout, per layer::

    k_cache, v_cache : [num_blocks, block_size, num_kv_heads, head_dim]
    slot s           : block s // block_size, offset s % block_size
    block_tables[i]  : physical block of sequence i's logical block j at column j;
                       columns past ceil(len / block_size) are unused and may hold garbage.

Scores and the softmax are computed in fp32; the output has q's dtype. Positions beyond a
sequence's length are masked (K and V zeroed too, so garbage or NaN in unused slots cannot leak).
"""

from __future__ import annotations

import torch


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather each sequence's tokens: ([S, T, KVH, D] with T = table width x block size, valid [S, T])."""
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    width = block_tables.shape[1]
    pos = torch.arange(width * block_size, device=cache.device)
    valid = pos[None, :] < lens[:, None].to(pos.dtype)                     # [S, T]
    used = (torch.arange(width, device=cache.device)[None, :] * block_size) < lens[:, None].to(pos.dtype)
    table = torch.where(used, block_tables.long(), 0).clamp_(0, num_blocks - 1)
    tokens = cache[table].flatten(1, 2)                                        # [S, T, KVH, D]
    tokens = torch.where(valid[:, :, None, None], tokens, torch.zeros((), dtype=cache.dtype, device=cache.device))
    return tokens, valid


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence over its paged context (the token itself already stored).

    q [S, H, D]; context_lens [S] int32 >= 1 (a length of 0 gives a zero output); returns [S, H, D].
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    k, valid = _gather(k_cache, block_tables, context_lens)
    v, _ = _gather(v_cache, block_tables, context_lens)
    qg = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,stkd->skgt", qg, k.float()) * scale                 # [S, KVH, G, T]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
    out = torch.einsum("skgt,stkd->skgd", probs, v.float())
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """New tokens attend causally to their cached context plus themselves (prefill, chunked, prefix hit).

    q [N, H, D] packs the new tokens of all sequences; sequence i owns rows
    cu_seqlens_q[i] : cu_seqlens_q[i + 1] ([S + 1] int32, starting at 0). context_lens [S] int32 counts
    the tokens cached *before* this step; the new tokens' K/V are already stored at positions
    context_len .. context_len + n_new - 1 of the sequence. New token r (position context_len + r)
    sees positions 0 .. context_len + r. Returns [N, H, D].
    """
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    for i in range(len(ctx)):
        start, end = cu[i], cu[i + 1]
        n_new = end - start
        if n_new == 0:
            continue
        total = torch.tensor([ctx[i] + n_new], device=q.device)
        k, _ = _gather(k_cache, block_tables[i:i + 1], total)
        v, _ = _gather(v_cache, block_tables[i:i + 1], total)
        k = k[0, : ctx[i] + n_new].float().repeat_interleave(group, dim=1)            # [T, H, D]
        v = v[0, : ctx[i] + n_new].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,thd->hnt", q[start:end].float(), k) * scale
        qpos = ctx[i] + torch.arange(n_new, device=q.device)
        kpos = torch.arange(ctx[i] + n_new, device=q.device)
        scores = scores.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[start:end] = torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write key/value [N, KVH, D] of N tokens into their slots (slot_mapping [N] int64; < 0 skips)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """For each cache and each (src, dst) row of block_mapping [P, 2] int64: cache[dst] = cache[src].

    Sources and destinations must be disjoint sets (copy-on-write targets are fresh blocks).
    """
    if block_mapping.numel() == 0:
        return
    src, dst = block_mapping[:, 0].long(), block_mapping[:, 1].long()
    for cache in caches:
        cache[dst] = cache[src]
