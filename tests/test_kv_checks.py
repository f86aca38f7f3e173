"""The swap space's and prefix cache's integrity checks read only the blocks they hold (vectorised over
the live ref counts) and still catch every kind of corruption they name."""

from __future__ import annotations

import numpy as np
import pytest

from sim.kv.block_pool import BlockPool
from sim.kv.prefix_cache import PrefixCache
from sim.kv.swap import SwapSpace


def test_swap_check_passes_then_catches_a_wrong_ref_count_a_free_block_and_a_lost_block():
    swap = SwapSpace(1_000_000)   # a large swap space: the check must not scan it
    swap.store(7, [3, 4, 5])
    swap.store(9, [6])
    swap.check_integrity()
    swap.pool.refs[swap.tables[7][1]] = 2
    with pytest.raises(AssertionError, match="ref count 2"):
        swap.check_integrity()
    swap.pool.refs[swap.tables[7][1]] = 1
    swap.tables[9] = [999_999]   # a table pointing at a block that is still free
    with pytest.raises(AssertionError):
        swap.check_integrity()
    swap.tables[9] = []          # a block allocated but held by nobody
    with pytest.raises(AssertionError, match="4 CPU blocks in use, 3 held"):
        swap.check_integrity()


def test_pool_are_free_agrees_with_is_free_one_by_one():
    pool = BlockPool(64)
    taken = pool.allocate(20)
    pool.free(taken[5:12])
    pool.allocate(3)
    blocks = np.arange(64, dtype=np.int64)
    assert pool.are_free(blocks).tolist() == [pool.is_free(int(b)) for b in blocks]


def test_prefix_cache_check_catches_a_cached_block_neither_referenced_nor_free():
    pool = BlockPool(16)
    cache = PrefixCache(pool)
    b = pool.allocate(1)[0]
    cache.insert(b, 1234)
    cache.check_integrity()
    pool.refs[b] = 0   # dropped without going back to the free queue
    with pytest.raises(AssertionError, match=f"cached block {b} neither referenced nor free"):
        cache.check_integrity()
