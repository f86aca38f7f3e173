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
                        (one call per allocation; array operations only, see below)

Tables are freed tail first, so a chain's tail is evicted before its head; a block freed earlier
is evicted earlier (least recently used first).

Representation: ``cached[b]`` (bool) and ``hash_at[b]`` (int64) per block are the truth: block b holds
hash h exactly when ``cached[b] and hash_at[b] == h``. The dict ``_index`` (hash -> block) finds a
block by hash; an eviction only clears ``cached`` (no dict work per evicted block), leaving its entry
stale, so every lookup checks the entry against the arrays. When the dict holds more than four times
the live entries (plus 4,096) it is rebuilt from the arrays: amortised O(1) per eviction.

Invariants (``check_integrity``): ``block_of`` (live hash -> block) and ``hash_of`` (cached block ->
hash) are inverse bijections; an evicted block's hash is in neither; a cached block is either
referenced or free; every cached block's entry in ``_index`` is live.
Hit-rate counters are in tokens: ``query_tokens`` (prompt tokens looked up at first admission) and
``hit_tokens`` (those served from the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np

from sim.kv.block_pool import BlockPool

NO_BLOCKS = np.zeros(0, dtype=np.int64)   # an empty run of blocks (read-only)
_STALE_RATIO = 4      # the index is rebuilt when it holds more than 4x the live entries ...
_SPARE_STALE = 4096   # ... plus these


class PrefixCache:
    """hash -> block id for full blocks; installs itself as the pool's eviction hook."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.cached = np.zeros(pool.num_blocks, dtype=bool)        # block id -> holds a findable hash
        self.hash_at = np.zeros(pool.num_blocks, dtype=np.int64)   # block id -> that hash, where cached
        self._index: dict[int, int] = {}   # hash -> block id; live where the arrays agree (see above)
        self._num_cached = 0
        self._runs: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # key -> (blocks, their hashes): match
        self.query_tokens = 0
        self.hit_tokens = 0
        self.num_evicted = 0
        pool.on_evict = self._on_evict

    # ------------------------------------------------------------ views
    @property
    def hash_of(self) -> dict[int, int]:
        """Cached block id -> its hash (a new dict, block ids ascending)."""
        live = np.flatnonzero(self.cached)
        return dict(zip(live.tolist(), self.hash_at[live].tolist()))

    @property
    def block_of(self) -> dict[int, int]:
        """Findable hash -> its block id (a new dict)."""
        return {h: b for b, h in self.hash_of.items()}

    def is_cached(self, block_id: int) -> bool:
        return bool(self.cached[block_id])

    def _live(self, hashes: Sequence[int], found: list[int]) -> np.ndarray:
        """Whether each ``found[i]`` (an ``_index`` entry of ``hashes[i]``, or -1) is live."""
        blocks = np.array(found, dtype=np.int64)
        known = blocks >= 0
        blocks[~known] = 0
        return known & self.cached[blocks] & (self.hash_at[blocks] == np.array(hashes, dtype=np.int64))

    # ------------------------------------------------------------ lookups
    def match(self, hashes: Sequence[int], max_blocks: int, key: int | None = None) -> list[int]:
        """The blocks of the longest cached run ``hashes[0..k-1]`` (k <= max_blocks). No side effects on
        the cache. ``key``: see ``match_blocks``."""
        return self.match_blocks(hashes, max_blocks, key).tolist()

    def match_blocks(self, hashes: Sequence[int], max_blocks: int, key: int | None = None) -> np.ndarray:
        """``match`` as an int64 array (read-only: it may be the one remembered). ``key`` (a request id):
        remember the run, and start from the last run remembered under that key (for the same hash
        chain): its blocks still cached under the same hashes are checked in one numpy pass, and lookups
        begin at the first that is not (a waiting request matched again every step costs a few lookups,
        not one per block of its prompt)."""
        end = min(len(hashes), max_blocks)
        memo = self._runs.get(key) if key is not None else None
        start = 0
        head = NO_BLOCKS
        if memo is not None:
            blocks, known = memo
            head = blocks[:end]
            ok = self.cached[head] & (self.hash_at[head] == known[:len(head)])
            start = len(head) if ok.all() else int(ok.argmin())
            head = head[:start]
        found = self._lookup(hashes, start, end)
        if found:
            head = np.concatenate([head, np.array(found, dtype=np.int64)])
        if key is not None and (memo is None or len(head) != len(memo[0])):
            known = memo[1] if memo is not None and len(memo[1]) >= len(head) else np.array(
                hashes[:len(head)], dtype=np.int64)
            self._runs[key] = (head, known)
        return head

    def forget(self, key: int) -> None:
        """Drop the run ``match`` remembered under ``key``."""
        self._runs.pop(key, None)

    def _lookup(self, hashes: Sequence[int], start: int, end: int) -> list[int]:
        """The blocks of ``hashes[start:end]`` up to the first uncached one. Looks up slices of 8, 32, 128,
        ... hashes (C-speed lookups), so a miss costs about as many lookups as the run found before it."""
        get = self._index.get
        out: list[int] = []
        width = 8
        while start < end:
            part = hashes[start:min(end, start + width)]
            found = list(map(get, part, repeat(-1)))
            if found[0] < 0:   # (the usual miss: nothing to check)
                return out
            ok = self._live(part, found)
            if not ok.all():
                out += found[:int(ok.argmin())]
                return out
            out += found
            start += width
            width *= 4
        return out

    def find_each(self, hashes: np.ndarray) -> np.ndarray:
        """The block cached under each of ``hashes`` (an int64 array), -1 where none is (no side effects)."""
        if not len(hashes):
            return NO_BLOCKS
        listed = hashes.tolist()
        found = list(map(self._index.get, listed, repeat(-1)))
        blocks = np.array(found, dtype=np.int64)
        blocks[~self._live(listed, found)] = -1
        return blocks

    # ------------------------------------------------------------ changes
    def insert(self, block_id: int, h: int) -> None:
        """Make a newly filled block findable. A hash already cached keeps its block (the new one stays
        private); a block already cached keeps its hash."""
        self.insert_run([block_id], [h])

    def insert_run(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """``insert`` of each (block, hash) pair in order: the pairs whose hash and block are both uncached
        go in at once, unless a hash or block repeats among them (then one pair at a time)."""
        index = self._index
        if len(blocks) == 1:   # the usual case: a decode's block just filled
            b, h = blocks[0], hashes[0]
            other = index.get(h)
            if self.cached[b] or (other is not None and self.cached[other] and self.hash_at[other] == h):
                return
            index[h] = b
            self.cached[b] = True
            self.hash_at[b] = h
            self._num_cached += 1
            return
        arr = np.array(blocks, dtype=np.int64)
        fresh = ~self.cached[arr]
        if not index.keys().isdisjoint(hashes):
            fresh &= ~self._live(hashes, list(map(index.get, hashes, repeat(-1))))
        if fresh.all():
            new_blocks, new_hashes = blocks, hashes
        else:
            new_blocks = arr[fresh].tolist()
            new_hashes = [h for h, f in zip(hashes, fresh.tolist()) if f]
        n = len(new_blocks)
        if n > 1 and (len(set(new_hashes)) < n or len(set(new_blocks)) < n):
            for b, h in zip(blocks, hashes):   # a hash or block twice: the first pair takes it
                self.insert_run([b], [h])
            return
        index.update(zip(new_hashes, new_blocks))
        self.cached[new_blocks] = True
        self.hash_at[new_blocks] = new_hashes
        self._num_cached += n

    def _on_evict(self, blocks: np.ndarray | int) -> None:
        """The pool took ``blocks`` (an array, or one block id) from its free queue: forget the hashes of
        the cached ones."""
        if isinstance(blocks, int):
            if not self.cached[blocks]:
                return
            self.cached[blocks] = False
            gone = 1
        else:
            cached = blocks[self.cached[blocks]]
            gone = len(cached)
            if not gone:
                return
            self.cached[cached] = False
        self._num_cached -= gone
        self.num_evicted += gone
        if len(self._index) > _STALE_RATIO * self._num_cached + _SPARE_STALE:
            live = np.flatnonzero(self.cached)
            self._index = dict(zip(self.hash_at[live].tolist(), live.tolist()))

    # ------------------------------------------------------------ counters
    def record_lookup(self, query_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens

    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def check_integrity(self) -> None:
        live = np.flatnonzero(self.cached)
        hashes = self.hash_at[live]
        assert len(live) == self._num_cached, f"{len(live)} cached blocks counted as {self._num_cached}"
        assert len(np.unique(hashes)) == len(live), "two cached blocks hold one hash"
        for b, h in zip(live.tolist(), hashes.tolist()):
            assert self._index.get(h) == b, f"block {b}: hash {h} maps to {self._index.get(h)}"
        lost = (self.pool.refs[live] <= 0) & ~self.pool.are_free(live)
        assert not lost.any(), f"cached block {live[np.argmax(lost)]} neither referenced nor free"
