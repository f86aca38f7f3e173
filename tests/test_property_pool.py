"""Property tests (hypothesis stateful) for the block pool and the prefix cache, each against a small
reference model written here from the documented behaviour:

- pool: a free queue (allocate pops the head, free appends at the tail in the order given, incref of a
  free block takes it out); ref counts; every block taken from the queue is reported to ``on_evict``;
- prefix cache: hash -> block for inserted blocks, first insert wins; a block taken from the free queue
  loses its hash (evicted hashes are gone); ``match`` returns the longest cached run of a hash chain.

Invariants after every rule: free + used = total; each ref count equals the references handed out;
no block is both free and referenced; the free order equals the model's; the cache equals the model's.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.kv.block_pool import BlockPool
from sim.kv.prefix_cache import PrefixCache

N = 10
SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(N)
        self.evicted: list[int] = []
        # the hook gets the blocks of each allocation: an array, or the block id of a one-block allocation
        self.pool.on_evict = lambda blocks: self.evicted.extend([blocks] if isinstance(blocks, int) else blocks.tolist())
        self.refs = [0] * N
        self.free_q = list(range(N))     # the reference free queue, head first
        self.handles: list[int] = []     # one entry per reference handed out

    # ------------------------------------------------------------ rules
    @rule(n=st.integers(0, 4))
    def allocate(self, n: int) -> None:
        if n > len(self.free_q):
            with pytest.raises(MemoryError):
                self.pool.allocate(n)
            return
        got = self.pool.allocate(n)
        expect, self.free_q = self.free_q[:n], self.free_q[n:]
        assert got == expect
        assert self.evicted == expect  # each block taken from the queue is reported, in order
        self.evicted.clear()
        for b in got:
            self.refs[b] = 1
        self.handles += got

    @rule(b=st.integers(0, N - 1))
    def incref(self, b: int) -> None:
        self.pool.incref(b)
        if self.refs[b] == 0:
            self.free_q.remove(b)
        self.refs[b] += 1
        self.handles.append(b)
        assert self.evicted == []  # reviving a free block is not an eviction

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def free_some(self, data) -> None:
        order = data.draw(st.permutations(range(len(self.handles))))
        k = data.draw(st.integers(1, len(self.handles)))
        picked = sorted(order[:k])
        blocks = [self.handles[i] for i in order[:k]]
        for i in reversed(picked):
            del self.handles[i]
        self.pool.free(blocks)
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_q.append(b)

    @rule(b=st.integers(0, N - 1))
    def free_unheld_is_refused(self, b: int) -> None:
        if self.refs[b] == 0:
            with pytest.raises(RuntimeError):
                self.pool.free([b])

    # ------------------------------------------------------------ invariants
    @invariant()
    def matches_the_model(self) -> None:
        pool = self.pool
        assert pool.ref_counts == self.refs
        assert pool.free_order() == self.free_q
        assert pool.num_free + pool.num_used == N
        assert pool.num_used == sum(1 for r in self.refs if r)
        assert not {b for b in pool.free_order() if pool.ref_counts[b] > 0}, "a block is free and referenced"
        pool.check_integrity(Counter(self.handles))


class PrefixCacheMachine(RuleBasedStateMachine):
    """A pool with a prefix cache; hashes come from a small range so collisions and re-inserts happen."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(N)
        self.cache = PrefixCache(self.pool)
        self.model: dict[int, int] = {}    # hash -> block
        self.handles: list[int] = []
        self.gone: set[int] = set()        # hashes evicted and not re-inserted since

    def _forget(self, blocks: list[int]) -> None:
        for h, b in list(self.model.items()):
            if b in blocks:
                del self.model[h]
                self.gone.add(h)

    @rule(n=st.integers(1, 4))
    def allocate(self, n: int) -> None:
        if n > self.pool.num_free:
            return
        got = self.pool.allocate(n)
        self._forget(got)
        self.handles += got

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), h=st.integers(0, 15))
    def insert(self, data, h: int) -> None:
        b = data.draw(st.sampled_from(self.handles))
        self.cache.insert(b, h)
        if h not in self.model and b not in self.model.values():
            self.model[h] = b
            self.gone.discard(h)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def free_one(self, data) -> None:
        i = data.draw(st.integers(0, len(self.handles) - 1))
        self.pool.free([self.handles.pop(i)])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def hit(self, data) -> None:
        h = data.draw(st.sampled_from(sorted(self.model)))
        assert self.cache.match([h], 1) == [self.model[h]]
        self.pool.incref(self.model[h])   # a hit revives a free cached block or shares a used one
        self.handles.append(self.model[h])

    @rule(chain=st.lists(st.integers(0, 15), max_size=6), limit=st.integers(0, 6))
    def match_is_the_longest_cached_run(self, chain: list[int], limit: int) -> None:
        expect = []
        for h in chain[:limit]:
            if h not in self.model:
                break
            expect.append(self.model[h])
        assert self.cache.match(chain, limit) == expect

    @invariant()
    def matches_the_model(self) -> None:
        cache, pool = self.cache, self.pool
        assert cache.block_of == self.model
        assert cache.hash_of == {b: h for h, b in self.model.items()}
        assert not (self.gone & set(cache.block_of)), "an evicted hash is still findable"
        for b in cache.hash_of:
            assert pool.ref_counts[b] > 0 or pool.is_free(b)
        assert pool.num_free + pool.num_used == N
        cache.check_integrity()
        pool.check_integrity(Counter(self.handles))


PoolMachine.TestCase.settings = SETTINGS
PrefixCacheMachine.TestCase.settings = SETTINGS
TestPool = PoolMachine.TestCase
TestPrefixCache = PrefixCacheMachine.TestCase
