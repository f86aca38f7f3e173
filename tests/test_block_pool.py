"""BlockPool: exact block ids, free-queue order, ref counts."""

import pytest

from sim.kv.block_pool import BlockPool


def test_allocates_in_id_order_then_reuses_freed_blocks_fifo():
    pool = BlockPool(11)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(2) == [3, 4]
    pool.free([1, 0])
    # the free queue is 5..10 then the freed blocks, in the order they were freed
    assert pool.free_order() == [5, 6, 7, 8, 9, 10, 1, 0]
    assert pool.allocate(7) == [5, 6, 7, 8, 9, 10, 1]
    assert pool.num_free == 1 and pool.num_used == 10
    pool.check_integrity({0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1})


def test_free_last_refs_queues_a_table_tail_first_like_free():
    import numpy as np

    pool = BlockPool(8)
    table = pool.allocate(5)                      # [0..4]
    pool.free_last_refs(np.array(table[::-1]))    # a request's table, tail first
    assert pool.free_order() == [5, 6, 7, 4, 3, 2, 1, 0]
    assert pool.ref_counts == [0] * 8
    pool.check_integrity({})
    assert pool.allocate(4) == [5, 6, 7, 4]       # the queue's order survives the bulk push


def test_ref_counts_share_and_release():
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.incref(a[0])
    assert pool.ref_counts == [2, 1, 0, 0]
    pool.free(a)
    assert pool.ref_counts == [1, 0, 0, 0]
    assert pool.free_order() == [2, 3, 1]
    pool.free([0])
    assert pool.free_order() == [2, 3, 1, 0]
    pool.check_integrity({})


def test_incref_revives_a_free_block_out_of_the_queue():
    pool = BlockPool(3)
    b = pool.allocate(1)[0]
    pool.free([b])
    pool.incref(b)
    assert pool.free_order() == [1, 2]
    assert pool.ref_counts[b] == 1


def test_errors():
    pool = BlockPool(2)
    with pytest.raises(MemoryError):
        pool.allocate(3)
    with pytest.raises(RuntimeError):
        pool.free([0])
    with pytest.raises(ValueError):
        BlockPool(0)


def test_integrity_catches_a_wrong_holder_count():
    pool = BlockPool(2)
    pool.allocate(1)
    with pytest.raises(AssertionError):
        pool.check_integrity({0: 2})


def test_holes_and_compaction_keep_the_order():
    pool = BlockPool(4)
    a = pool.allocate(4)
    for _ in range(5):   # the queue array (twice the pool) wraps: entries move to its start
        pool.free(a[::-1])
        pool.incref(a[1])    # a hole in the middle of the queue
        assert pool.free_order() == [a[3], a[2], a[0]]
        assert pool.allocate(2) == [a[3], a[2]]
        assert pool.allocate(1) == [a[0]]
        pool.check_integrity({b: 1 for b in a})


def test_integrity_catches_a_broken_queue():
    pool = BlockPool(3)
    pool.allocate(1)
    pool.refs[1] = 1          # referenced, yet still queued
    with pytest.raises(AssertionError):
        pool.check_integrity()
    pool = BlockPool(3)
    pool._queue.holes += 1    # a hole count that no longer matches the slots
    with pytest.raises(AssertionError):
        pool.check_integrity()
