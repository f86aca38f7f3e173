"""Prefix cache: full KV blocks findable by a hash of their content and of everything before them.

A full block's hash chains over its parent's (vLLM v1): two blocks with one hash hold the same tokens
at the same positions after the same prefix, so a request may reuse the longest run of cached blocks
that starts its prompt:

    request tokens:  [ b0 | b1 | b2 | b3 | b4 ..      hashes h0 -> h1 -> h2 -> h3 (full blocks only)
    cache map:         h0:7  h1:2  h2:9  (h3 unknown)
    match:             [7, 2, 9]  -> num_computed_tokens starts at 3 * block_size

Lifetime of a cached block (the pool's free queue is the LRU list):

    in use (ref > 0) --free--> free but findable --hit (incref)--> in use
                                     |
                        allocate pops it from the head: on_evict forgets its hash
                        (one call per allocation; a mask of cached blocks finds the few to forget)

Tables are freed tail first, so a chain's tail is evicted before its head; a block freed earlier
is evicted earlier (least recently used first).

Invariants (``check_integrity``): the map hash -> block and the map block -> hash are inverse
bijections; an evicted block's hash is in neither; a cached block is either referenced or free;
``cached[b]`` is True exactly for the blocks of ``hash_of``.
Hit-rate counters are in tokens: ``query_tokens`` (prompt tokens looked up at first admission) and
``hit_tokens`` (those served from the cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.kv.block_pool import BlockPool


class PrefixCache:
    """hash -> block id for full blocks; installs itself as the pool's eviction hook."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_of: dict[int, int] = {}   # hash -> block id
        self.hash_of: dict[int, int] = {}    # block id -> hash
        self.cached = np.zeros(pool.num_blocks, dtype=bool)   # block id -> in hash_of
        self.query_tokens = 0
        self.hit_tokens = 0
        self.num_evicted = 0
        pool.on_evict = self._on_evict

    def match(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """The blocks of the longest cached run ``hashes[0..k-1]`` (k <= max_blocks). No side effects."""
        found = list(map(self.block_of.get, hashes[:max_blocks]))   # C-speed lookups, then cut at a miss
        try:
            return found[:found.index(None)]
        except ValueError:
            return found

    def insert(self, block_id: int, h: int) -> None:
        """Make a newly filled block findable. A hash already cached keeps its block (the new one stays
        private); a block already cached keeps its hash."""
        if h in self.block_of or block_id in self.hash_of:
            return
        self.block_of[h] = block_id
        self.hash_of[block_id] = h
        self.cached[block_id] = True

    def _on_evict(self, blocks: np.ndarray) -> None:
        """The pool took ``blocks`` from its free queue: forget the hashes of the cached ones."""
        gone = blocks[self.cached[blocks]]
        if not len(gone):
            return
        self.cached[gone] = False
        for b in gone.tolist():
            del self.block_of[self.hash_of.pop(b)]
        self.num_evicted += len(gone)

    def record_lookup(self, query_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens

    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def is_cached(self, block_id: int) -> bool:
        return block_id in self.hash_of

    def check_integrity(self) -> None:
        assert len(self.block_of) == len(self.hash_of), "prefix cache maps differ in size"
        assert sorted(self.hash_of) == np.flatnonzero(self.cached).tolist(), "cached mask differs from hash_of"
        for b, h in self.hash_of.items():
            assert self.block_of.get(h) == b, f"block {b}: hash {h} maps to {self.block_of.get(h)}"
        cached = np.fromiter(self.hash_of, np.int64, len(self.hash_of))
        lost = (self.pool.refs[cached] <= 0) & ~self.pool.are_free(cached)
        assert not lost.any(), f"cached block {cached[np.argmax(lost)]} neither referenced nor free"
