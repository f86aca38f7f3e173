"""Prefix caching on a tiny pool (11 blocks of 16 tokens): exact block ids, ref counts, eviction order.

Every expectation below is worked out by hand from the rules: allocation pops the free queue's head
(initially 0, 1, 2, ...), a freed table goes to the tail in reverse (tail block first), only full
blocks are cached, and a hit reuses the longest cached run, leaving at least one token to compute.
"""

from __future__ import annotations

from sim.kv.manager import KVCacheManager
from sim.request import Request


def mk(req_id: int, prompt: int, output: int = 8, group: int = -1, plen: int = 0) -> Request:
    return Request(req_id, 0.0, prompt, output, prefix_group=group, prefix_len=plen)


def compute(m: KVCacheManager, req: Request, n: int) -> None:
    """What the scheduler's update does after a step that computed ``n`` tokens of ``req``."""
    req.num_computed_tokens += n
    if req.num_computed_tokens >= req.num_tokens:
        req.num_generated += 1
    m.note_computed(n)
    m.check_integrity()


def admit(m: KVCacheManager, req: Request) -> list[int]:
    cached = m.match_prefix(req)
    num_new = req.num_tokens - len(cached) * m.block_size
    assert m.allocate_slots(req, num_new, cached)
    compute(m, req, num_new)
    return cached


def test_shared_prefix_blocks_are_reused_with_ref_counts():
    m = KVCacheManager(11, 16, prefix_caching=True)
    a = mk(0, 40, group=0, plen=32)             # blocks: [0 full][1 full][2: 8 tokens]
    assert admit(m, a) == []
    assert m.block_tables[0] == [0, 1, 2]
    b = mk(1, 40, group=0, plen=32)             # same 32-token prefix: blocks 0 and 1 hit
    assert admit(m, b) == [0, 1]
    assert b.num_computed_tokens == 41 - 1 and b.num_cached_tokens == 32
    assert m.block_tables[1] == [0, 1, 3]
    assert m.pool.ref_counts[:4] == [2, 2, 1, 1]
    c = mk(2, 40)                               # no prefix group: nothing shared
    assert admit(m, c) == []
    assert m.block_tables[2] == [4, 5, 6]
    # hit rate in prompt tokens, over first admissions: 32 / (40 + 40 + 40)
    assert m.prefix_cache_hit_rate() == 32 / 120


def test_eviction_order_is_lru_and_tail_of_chain_first():
    m = KVCacheManager(11, 16, prefix_caching=True)
    a = mk(0, 40, group=0, plen=32)
    b = mk(1, 40, group=0, plen=32)
    admit(m, a)
    admit(m, b)
    m.free(a)   # [0, 1, 2] tail first: 2 -> free; 1, 0 still held by b
    m.free(b)   # [0, 1, 3] tail first: 3, 1, 0
    assert m.pool.free_order() == [4, 5, 6, 7, 8, 9, 10, 2, 3, 1, 0]
    assert m.pool.ref_counts == [0] * 11
    cache = m.prefix_cache
    assert sorted(cache.hash_of) == [0, 1]       # only full blocks are findable (2 and 3 were partial)
    m.check_integrity()
    # a 144-token stranger takes 9 blocks from the head: 4..10, then 2 and 3 (uncached, no eviction)
    c = mk(2, 144)
    admit(m, c)
    assert m.block_tables[2] == [4, 5, 6, 7, 8, 9, 10, 2, 3]
    assert cache.num_evicted == 0                # its 9 full blocks are cached too
    assert sorted(cache.hash_of) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # the next block evicts 1 (the chain's tail, freed first) before 0
    d = mk(3, 10)
    admit(m, d)
    assert m.block_tables[3] == [1]
    assert cache.num_evicted == 1 and 1 not in cache.hash_of and 0 in cache.hash_of
    # a request of the group now hits block 0 only; the revived block leaves the free queue
    e = mk(4, 40, group=0, plen=32)
    assert m.match_prefix(e) == [0]
    assert not m.allocate_slots(e, 24, [0])      # needs 2 fresh blocks, none is free besides block 0
    assert m.pool.ref_counts[0] == 0 and m.pool.is_free(0)
    m.check_integrity()


def test_evicted_hash_is_forgotten_and_never_referenced():
    m = KVCacheManager(2, 16, prefix_caching=True)
    a = mk(0, 17, group=0, plen=16)
    admit(m, a)                                  # [0 full, cached][1: 1 token]
    old = m.prefix_cache.hash_of[0]
    m.free(a)
    assert m.pool.free_order() == [1, 0]
    b = mk(1, 32)                                # a stranger needing both blocks evicts block 0
    admit(m, b)
    assert m.prefix_cache.num_evicted == 1 and old not in m.prefix_cache.block_of
    assert m.block_tables[1] == [1, 0]           # b's own two full blocks are now the cached ones
    assert m.match_prefix(mk(2, 17, group=0, plen=16)) == []
    m.check_integrity()


def test_preempted_request_hits_its_own_blocks_including_generated_tokens():
    m = KVCacheManager(11, 16, prefix_caching=True)
    a = mk(0, 30, output=20)
    admit(m, a)                                  # 30 prompt tokens in [0, 1]; first token sampled
    for _ in range(10):                          # ten decode steps: 10 more tokens of KV (40 in all)
        assert m.allocate_slots(a, 1)
        compute(m, a, 1)
    assert a.num_computed_tokens == 40 and a.num_tokens == 41
    assert m.block_tables[0] == [0, 1, 2]
    m.free(a)                                    # preempted by recompute
    a.num_computed_tokens = 0
    m.check_integrity()
    # it comes back: blocks 0 and 1 (tokens 0..31, two of them generated) are still cached
    assert m.match_prefix(a) == [0, 1]
    assert m.allocate_slots(a, 41 - 32, [0, 1])
    assert a.num_computed_tokens == 32 and m.block_tables[0] == [0, 1, 3]   # free queue: 3..10, 2, 1, 0
    assert a.num_cached_tokens == 0              # the hit-rate counters count first admissions only
    compute(m, a, 9)


def test_at_least_one_token_is_computed():
    m = KVCacheManager(11, 16, prefix_caching=True)
    a = mk(0, 20, output=20)
    admit(m, a)
    while a.num_computed_tokens < 31:            # decode until 32 tokens exist and 31 have KV
        assert m.allocate_slots(a, 1)
        compute(m, a, 1)
    assert m.allocate_slots(a, 1)                # token 31's slot fills block 1: both blocks cached
    compute(m, a, 1)
    assert sorted(m.prefix_cache.hash_of) == [0, 1]
    m.free(a)
    a.num_computed_tokens = 0
    a.num_generated -= 1                         # as if preempted when 32 tokens existed
    assert a.num_tokens == 32
    assert m.match_prefix(a) == [0]              # block 1 is cached, but its last token must be computed
    b = mk(1, 32, group=0, plen=31)
    assert m.match_prefix(b) == []               # a different request shares nothing
