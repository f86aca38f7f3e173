"""Random paged-KV cases shared by the kernel tests: shuffled physical blocks, garbage in unused columns."""

from __future__ import annotations

import torch

GARBAGE = 1_000_000  # unused block-table entries point far outside the pool


def paged_case(total_lens: list[int], num_kv_heads: int, group: int, head_dim: int, dtype: torch.dtype,
               block_size: int = 16, device: str = "cpu", seed: int = 0, spare_blocks: int = 3):
    """Caches with every sequence's tokens in randomly ordered physical blocks.

    Returns (k_cache, v_cache, block_tables [S, W] int32, num_heads). The table is wider than any
    sequence needs and its unused entries hold out-of-range garbage; the pool has spare blocks.
    """
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in total_lens]
    num_blocks = sum(need) + spare_blocks
    width = max(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(GARBAGE, 2 * GARBAGE, (len(total_lens), width), generator=gen, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[used:used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k.to(device), v.to(device), tables.to(device), num_kv_heads * group


def gather_dense(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens of one sequence, one block at a time (the obvious way): [n, KVH, D]."""
    bs = cache.shape[1]
    blocks = [cache[int(table[j])] for j in range(-(-n // bs))]
    return torch.cat(blocks)[:n]
