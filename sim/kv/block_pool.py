"""Physical KV blocks: reference counts and an O(1) free queue.

    block id:    0    1    2    3    4    5    6    7
    ref count:   2    1    0    1    0    0    3    0
    free queue:  head -> 2 -> 5 -> 4 -> 7 <- tail      (allocate pops the head, free appends at the tail)

Invariants (``check_integrity``):
- a block is in the free queue exactly when its ref count is 0;
- free + used = total;
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
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.on_evict: Callable[[int], None] | None = None  # set by the prefix cache

    # ------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def is_free(self, block_id: int) -> bool:
        return block_id in self._free

    def free_order(self) -> list[int]:
        """The free queue, head (next to be allocated or evicted) first."""
        return list(self._free)

    # ------------------------------------------------------------ changes
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, each with ref count 1."""
        if n > len(self._free):
            raise MemoryError(f"asked for {n} blocks, {len(self._free)} free")
        out = []
        refs = self.ref_counts
        popitem = self._free.popitem
        evict = self.on_evict
        for _ in range(n):
            b, _ = popitem(last=False)
            refs[b] = 1
            if evict is not None:
                evict(b)
            out.append(b)
        return out

    def incref(self, block_id: int) -> None:
        """Share a block (fork, or a prefix-cache hit); a free cached block leaves the free queue."""
        if self.ref_counts[block_id] == 0:
            del self._free[block_id]
        self.ref_counts[block_id] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; blocks reaching 0 go to the tail of the free queue, in order."""
        refs = self.ref_counts
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
        free = self._free
        for b, r in enumerate(self.ref_counts):
            assert r >= 0, f"block {b}: negative ref count {r}"
            assert (r == 0) == (b in free), f"block {b}: ref count {r} but {'in' if b in free else 'not in'} free queue"
        assert len(free) + sum(1 for r in self.ref_counts if r > 0) == self.num_blocks, "free + used != total"
        if holders is not None:
            for b, r in enumerate(self.ref_counts):
                assert r == holders.get(b, 0), f"block {b}: ref count {r} but held by {holders.get(b, 0)} tables"
