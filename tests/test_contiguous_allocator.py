"""The contiguous baselines: first fit with coalescing, region sizes, and the five-way breakdown."""

import pytest
from test_sched_util import simulate

from sim.kv.contiguous import ContiguousKVManager, ExtentAllocator
from sim.request import Request


def test_first_fit_and_coalescing():
    a = ExtentAllocator(10)
    assert [a.allocate(3), a.allocate(4), a.allocate(2)] == [0, 3, 7]   # free: 9
    a.free(3, 4)                                                       # free: 3..6, 9
    assert a.num_free == 5 and a.largest_free() == 4
    assert a.allocate(5) is None                                       # 5 free, but not in one piece
    assert a.allocate(1) == 3                                          # first fit; free: 4..6, 9
    a.free(0, 3)                                                       # 0..2 and 4..6 stay apart (3 is used)
    assert a.starts == [0, 4, 9]
    a.free(3, 1)                                                       # 0..6 merge both ways
    assert a.starts == [0, 9] and a.lengths == {0: 7, 9: 1}
    a.check_integrity([(7, 2)])
    with pytest.raises(AssertionError):
        a.free(2, 2)                                                   # already free


@pytest.mark.parametrize("mode, region, internal", [
    ("contiguous-max", 32, 24),      # the model's max length (32); the request holds at most 5 + 4 - 1 = 8
    ("contiguous-pow2", 16, 8),      # next power of two of 5 + 4 = 9
    ("contiguous-oracle", 8, 0),     # exactly the KV it will hold
])
def test_region_sizes_and_breakdown(mode, region, internal):
    m = ContiguousKVManager(num_blocks=64, block_size=1, mode=mode, max_model_len=32)
    r = Request(0, 0.0, 5, 4)
    assert m.allocate_slots(r, 5)
    assert m.block_tables[0] == list(range(region))
    assert m.memory_slots() == (0, 8, internal, 0, 64 - region)
    m.note_computed(5)
    r.num_computed_tokens = 5
    assert m.memory_slots() == (5, 3, internal, 0, 64 - region)
    m.check_integrity()
    m.free(r)
    assert m.memory_slots() == (0, 0, 0, 0, 64)


def test_external_fragmentation_is_free_space_outside_the_largest_extent():
    # 26 slots, oracle regions of 8: [0..7] [8..15] [16..23], free [24..25]; freeing the middle one leaves
    # free extents of 8 and 2: the largest (8) is "free", the other 2 are external fragmentation.
    m = ContiguousKVManager(num_blocks=26, block_size=1, mode="contiguous-oracle", max_model_len=64)
    reqs = [Request(i, 0.0, 5, 4) for i in range(3)]
    for r in reqs:
        assert m.allocate_slots(r, 5)
    assert m.memory_slots() == (0, 24, 0, 0, 2)
    m.free(reqs[1])
    assert m.memory_slots() == (0, 16, 0, 2, 8)
    big = Request(3, 0.0, 6, 4)      # needs 9 contiguous slots: 10 are free, but not in one piece
    assert not m.can_allocate(big, 6) and not m.allocate_slots(big, 6)
    m.check_integrity()


def test_regions_round_up_to_blocks_and_count_as_internal_fragmentation():
    m = ContiguousKVManager(num_blocks=8, block_size=4, mode="contiguous-oracle", max_model_len=64)
    r = Request(0, 0.0, 5, 4)      # 8 slots of KV -> 2 blocks
    assert m.allocate_slots(r, 5) and m.block_tables[0] == [0, 1]
    r2 = Request(1, 0.0, 6, 4)     # 9 slots -> 3 blocks, 3 slots never filled
    assert m.allocate_slots(r2, 6) and m.block_tables[1] == [2, 3, 4]
    assert m.memory_slots() == (0, 17, 3, 0, 12)


def test_continuous_batching_over_contiguous_regions():
    # 20 slots, Max regions of 16: only one request at a time, the second waits for the first to end.
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3)]
    _, ex = simulate(reqs, 20, 1, allocator="contiguous-max", max_model_len=16)
    assert [[rid for rid, _, _ in p] for p in ex.plans] == [[0], [0], [0], [1], [1], [1]]
    assert ex.tables[3] == {1: list(range(16))}
    # oracle regions (6 slots each) fit both at once
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3)]
    _, ex = simulate(reqs, 20, 1, allocator="contiguous-oracle", max_model_len=16)
    assert ex.tables[0] == {0: list(range(6)), 1: list(range(6, 12))}
