"""The prefix cache's and the block pool's bulk paths, against outcomes worked out by hand from the
one-at-a-time rules: a freed block joins the free queue's tail when its last reference goes, in the
order given; a hit on a free block takes it out of the queue; ``insert`` keeps the first block of a
hash and the first hash of a block; a remembered match is the same as a fresh one whatever happened to
the cache in between; an eviction leaves at most a bounded number of stale index entries behind.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.kv.block_pool import BlockPool
from sim.kv.prefix_cache import _SPARE_STALE, _STALE_RATIO, PrefixCache


def test_free_of_shared_blocks_queues_the_last_references_in_order():
    pool = BlockPool(6)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.incref_distinct(np.array([1, 3], dtype=np.int64))   # another table shares 1 and 3
    assert pool.ref_counts == [1, 2, 1, 2, 0, 0]
    pool.free([3, 2, 1, 0])                    # tail first: 2 and 0 lose their last reference
    assert pool.ref_counts == [0, 1, 0, 1, 0, 0]
    assert pool.free_order() == [4, 5, 2, 0]
    pool.free(np.array([3, 1], dtype=np.int64))
    assert pool.free_order() == [4, 5, 2, 0, 3, 1]
    pool.check_integrity()


def test_free_with_a_repeated_block_goes_one_at_a_time_and_over_freeing_raises():
    pool = BlockPool(4)
    pool.allocate(2)
    pool.incref(0)                             # block 0: two references
    pool.free([0, 1, 0])                       # 0 -> 1, 1 -> 0 (queued), 0 -> 0 (queued)
    assert pool.free_order() == [2, 3, 1, 0]
    pool.allocate(4)
    pool.free([2, 3])
    with pytest.raises(RuntimeError, match="block 3 freed more often"):
        pool.free([0, 3])                      # 3 has no reference left: nothing changes
    assert pool.ref_counts == [1, 1, 0, 0]
    pool.check_integrity()


def test_incref_distinct_revives_free_blocks_and_refuses_a_lost_one():
    pool = BlockPool(5)
    pool.allocate(3)
    pool.free([2, 1])                          # queue: 3, 4, 2, 1
    pool.incref_distinct(np.array([0, 1], dtype=np.int64))
    assert pool.ref_counts == [2, 1, 0, 0, 0]
    assert pool.free_order() == [3, 4, 2]
    assert pool.allocate(3) == [3, 4, 2]
    pool.free([3])
    pool.refs[3] = 0
    pool._queue.remove(3)                      # corrupt: no reference and not queued
    with pytest.raises(KeyError, match="block 3"):
        pool.incref_distinct(np.array([4, 3], dtype=np.int64))
    assert pool.ref_counts == [2, 1, 1, 0, 1]  # nothing changed


def test_insert_run_keeps_the_first_block_of_a_hash_and_the_first_hash_of_a_block():
    pool = BlockPool(8)
    cache = PrefixCache(pool)
    pool.allocate(8)
    cache.insert_run([0, 1], [100, 101])
    cache.insert_run([2, 1, 3, 4, 5], [100, 102, 103, 104, 103])
    # 2 keeps private (100 is block 0's), 1 keeps 101, 3 takes 103, 4 takes 104, 5 private (103 is 3's)
    assert cache.hash_of == {0: 100, 1: 101, 3: 103, 4: 104}
    assert cache.match([100, 101, 999], 3) == [0, 1]
    cache.check_integrity()


def test_a_remembered_match_follows_evictions_and_new_blocks_of_its_hashes():
    pool = BlockPool(6)
    cache = PrefixCache(pool)
    hashes = [10, 11, 12, 13]
    pool.allocate(3)
    cache.insert_run([0, 1, 2], hashes[:3])
    pool.free([2, 1, 0])                       # queue: 3, 4, 5, 2, 1, 0
    assert cache.match(hashes, 4, key=7) == [0, 1, 2]
    assert pool.allocate(5) == [3, 4, 5, 2, 1]   # evicts 2 and 1: only block 0 still holds its hash
    assert cache.match(hashes, 4, key=7) == [0]
    cache.insert_run([4, 3], [11, 12])         # the same content computed again, in other blocks
    assert cache.match(hashes, 4, key=7) == [0, 4, 3]
    assert cache.match(hashes, 4) == [0, 4, 3]
    cache.insert_run([5], [13])
    assert cache.match(hashes, 4, key=7) == [0, 4, 3, 5]
    assert cache.match(hashes, 3, key=7) == [0, 4, 3]   # never beyond max_blocks
    cache.forget(7)
    assert cache.match(hashes, 4, key=7) == [0, 4, 3, 5]
    cache.check_integrity()


def test_evictions_leave_a_bounded_index_and_every_live_hash_findable():
    pool = BlockPool(64)
    cache = PrefixCache(pool)
    next_hash = 1
    for _ in range(1_000):                     # 8,000 blocks cached, all but 64 evicted since
        blocks = pool.allocate(8)
        cache.insert_run(blocks, list(range(next_hash, next_hash + 8)))
        next_hash += 8
        pool.free(blocks[::-1])
        assert len(cache._index) <= _STALE_RATIO * int(cache.cached.sum()) + _SPARE_STALE + 8
    live = cache.hash_of
    assert len(live) == 64 and cache.num_evicted == 8_000 - 64
    assert cache.match(list(range(next_hash - 8, next_hash)), 8) == blocks   # the last run, still cached
    assert cache.match(list(range(1, 9)), 8) == []   # the first blocks' hashes are long gone
    cache.check_integrity()


def test_remembered_matches_equal_a_reference_over_random_histories():
    """20,000 random operations on 12 blocks and 10 hashes (allocations that evict, runs inserted, bulk
    frees, hits); after each, every key's remembered match equals the longest cached run of its chain
    in a plain dict model of the cache."""
    rng = np.random.default_rng(11)
    pool = BlockPool(12)
    cache = PrefixCache(pool)
    model: dict[int, int] = {}                 # hash -> block, kept by the rules of insert and eviction
    held: list[int] = []                       # one entry per reference handed out
    chains = {0: [0, 1, 2, 3, 4], 1: [5, 6, 7, 8, 9], 2: [0, 1, 7, 8, 9]}
    for _ in range(20_000):
        op = rng.integers(4)
        if op == 0 and pool.num_free:
            got = pool.allocate(int(rng.integers(1, min(3, pool.num_free) + 1)))
            model = {h: b for h, b in model.items() if b not in got}
            held += got
        elif op == 1 and held:
            blocks = [held[i] for i in rng.integers(0, len(held), int(rng.integers(1, 4)))]
            hashes = rng.integers(0, 10, len(blocks)).tolist()
            cache.insert_run(blocks, hashes)
            for b, h in zip(blocks, hashes):
                if h not in model and b not in model.values():
                    model[h] = b
        elif op == 2 and held:
            picks = sorted(set(rng.integers(0, len(held), int(rng.integers(1, 4))).tolist()), reverse=True)
            pool.free([held.pop(i) for i in picks])
        elif op == 3:
            key = int(rng.integers(3))
            run = cache.match(chains[key], 5, key=key)
            if run:
                pool.incref_distinct(np.array(run, dtype=np.int64))
                held += run
        for key, chain in chains.items():
            limit = int(rng.integers(6))
            expect = []
            for h in chain[:limit]:
                if h not in model:
                    break
                expect.append(model[h])
            assert cache.match(chain, limit, key=key) == expect
    cache.check_integrity()
