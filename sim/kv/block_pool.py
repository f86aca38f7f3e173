"""Physical KV blocks: reference counts and an O(1) free queue.

    block id:    0    1    2    3    4    5    6    7
    ref count:   2    1    0    1    0    0    3    0
    free queue:  head -> 2 -> 5 -> 4 -> 7 <- tail      (allocate pops the head, free appends at the tail)

Invariants (``check_integrity``):
- a block is in the free queue exactly when its ref count is 0;
- free + used = total;
- the queue's head is the never-used range ``fresh .. num_blocks-1`` (kept as a counter, so a pool of
  millions of CPU swap blocks costs nothing to create), followed by freed blocks in the order freed;
- the free queue is also the eviction order for cached blocks: a freed block that the prefix cache
  still knows stays in the queue, findable by hash, until ``allocate`` takes it from the head, at which
  point ``on_evict(block_id)`` lets the cache forget it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable


class BlockPool:
    """Fixed-size physical blocks ``0 .. num_blocks-1``; initially allocated in increasing id order."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts: list[int] = [0] * num_blocks
        self._fresh = 0                                   # blocks >= _fresh were never allocated
        self._free: OrderedDict[int, None] = OrderedDict()  # freed blocks, oldest first
        self.on_evict: Callable[[int], None] | None = None  # set by the prefix cache

    # ------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        return self.num_blocks - self._fresh + len(self._free)

    @property
    def num_used(self) -> int:
        return self._fresh - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_blocks - self._fresh + len(self._free)

    def is_free(self, block_id: int) -> bool:
        return block_id >= self._fresh or block_id in self._free

    def free_order(self) -> list[int]:
        """The free queue, head (next to be allocated or evicted) first."""
        return list(range(self._fresh, self.num_blocks)) + list(self._free)

    # ------------------------------------------------------------ changes
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, each with ref count 1."""
        if n == 1:  # the common case: a request's next block
            if self._fresh < self.num_blocks:
                b = self._fresh
                self._fresh = b + 1
            elif self._free:
                b = self._free.popitem(last=False)[0]
            else:
                raise MemoryError("asked for 1 block, 0 free")
            self.ref_counts[b] = 1
            if self.on_evict is not None:
                self.on_evict(b)
            return [b]
        if n > self.num_free:
            raise MemoryError(f"asked for {n} blocks, {self.num_free} free")
        refs = self.ref_counts
        take_fresh = min(n, self.num_blocks - self._fresh)
        out = list(range(self._fresh, self._fresh + take_fresh))
        self._fresh += take_fresh
        evict = self.on_evict
        for b in out:
            refs[b] = 1
            if evict is not None:
                evict(b)
        popitem = self._free.popitem
        for _ in range(n - take_fresh):
            b, _ = popitem(last=False)
            refs[b] = 1
            if evict is not None:
                evict(b)
            out.append(b)
        return out

    def incref(self, block_id: int) -> None:
        """Share a block (fork, or a prefix-cache hit); a free cached block leaves the free queue."""
        if self.ref_counts[block_id] == 0:
            if block_id >= self._fresh:  # rare: make the never-used range explicit, then take it out
                queue = OrderedDict.fromkeys(range(self._fresh, self.num_blocks))
                queue.update(self._free)
                self._free, self._fresh = queue, self.num_blocks
            del self._free[block_id]
        self.ref_counts[block_id] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; blocks reaching 0 go to the tail of the free queue, in order."""
        refs = self.ref_counts
        blocks = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
        if len(blocks) > 1 and list(map(refs.__getitem__, blocks)).count(1) == len(blocks):
            gone = dict.fromkeys(blocks)
            if len(gone) == len(blocks):   # distinct blocks, each losing its last reference: in bulk
                for b in blocks:
                    refs[b] = 0
                self._free.update(gone)
                return
        for b in blocks:
            r = refs[b] - 1
            if r < 0:
                raise RuntimeError(f"block {b} freed more often than allocated")
            refs[b] = r
            if r == 0:
                self._free[b] = None

    # ------------------------------------------------------------ invariants
    def check_integrity(self, holders: dict[int, int] | None = None) -> None:
        """Assert the pool's invariants; ``holders`` maps block id -> number of block tables holding it."""
        for b, r in enumerate(self.ref_counts):
            assert r >= 0, f"block {b}: negative ref count {r}"
            free = self.is_free(b)
            assert (r == 0) == free, f"block {b}: ref count {r} but {'in' if free else 'not in'} free queue"
        assert all(b < self._fresh for b in self._free), "a never-used block is in the freed queue"
        assert self.num_free + sum(1 for r in self.ref_counts if r > 0) == self.num_blocks, "free + used != total"
        if holders is not None:
            for b, r in enumerate(self.ref_counts):
                assert r == holders.get(b, 0), f"block {b}: ref count {r} but held by {holders.get(b, 0)} tables"
