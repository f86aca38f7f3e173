"""Physical KV blocks: reference counts and a free queue whose operations cost per call, not per block.

    block id:    0    1    2    3    4    5    6    7
    ref count:   2    1    0    1    0    0    3    0
    free queue:  head -> 2 -> 5 -> 4 -> 7 <- tail      (allocate pops the head, free appends at the tail)

Invariants (``check_integrity``):
- a block is in the free queue exactly when its ref count is 0;
- free + used = total;
- the queue starts as ``0 .. num_blocks-1`` in order; freed blocks join its tail in the order freed;
- the free queue is also the eviction order for cached blocks: a freed block that the prefix cache
  still knows stays in the queue, findable by hash, until ``allocate`` takes it from the head, at which
  point ``on_evict(blocks)`` (every block taken by that call, in order: an int64 array, or the block id
  where the call took one) lets the cache forget it.

Ref counts live in a numpy array (``refs``) and the queue in numpy slices (sim/kv/free_queue.py), so a
bulk ``allocate``/``free`` is a handful of array operations whatever its length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from sim.kv.free_queue import FreeQueue
from sim.native import native

if TYPE_CHECKING:
    from sim.sched.decode_lane import DecodeLane


class BlockPool:
    """Fixed-size physical blocks ``0 .. num_blocks-1``; initially allocated in increasing id order."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = np.zeros(num_blocks, dtype=np.int64)    # live ref counts
        self._queue = FreeQueue(num_blocks)
        self.on_evict: Callable[[np.ndarray | int], None] | None = None   # set by the prefix cache
        self._marks: np.ndarray | None = None   # scratch for _distinct, made when first needed

    # ------------------------------------------------------------ queries
    @property
    def ref_counts(self) -> list[int]:
        """A snapshot of the ref counts, as a list (``refs`` is the live array)."""
        return self.refs.tolist()

    @property
    def num_free(self) -> int:
        return self._queue.size

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._queue.size

    def can_allocate(self, n: int) -> bool:
        return n <= self._queue.size

    def is_free(self, block_id: int) -> bool:
        return block_id in self._queue

    def are_free(self, blocks: np.ndarray) -> np.ndarray:
        """``is_free`` of each of ``blocks`` (an int64 array) at once."""
        return self._queue.contains_each(blocks)

    def free_order(self) -> list[int]:
        """The free queue, head (next to be allocated or evicted) first."""
        return self._queue.order()

    # ------------------------------------------------------------ changes
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, each with ref count 1."""
        if n == 1:  # the common case: a request's next block
            if not self._queue.size:
                raise MemoryError("asked for 1 block, 0 free")
            b = self._queue.pop1()
            self.refs[b] = 1
            if self.on_evict is not None:
                self.on_evict(b)
            return [b]
        return self.allocate_array(n).tolist()

    def allocate_array(self, n: int) -> np.ndarray:
        """``allocate`` as an int64 array."""
        if n > self._queue.size:
            raise MemoryError(f"asked for {n} blocks, {self._queue.size} free")
        out = self._queue.pop(n)
        self.refs[out] = 1
        if self.on_evict is not None and n:
            self.on_evict(out)
        return out

    def incref(self, block_id: int) -> None:
        """Share a block (fork, or a prefix-cache hit); a free cached block leaves the free queue."""
        r = int(self.refs[block_id])
        if r == 0:
            if block_id not in self._queue:
                raise KeyError(f"block {block_id} has no references but is not in the free queue")
            self._queue.remove(block_id)
        self.refs[block_id] = r + 1

    def incref_distinct(self, blocks: np.ndarray) -> None:
        """``incref`` of each of ``blocks`` (an int64 array; the caller knows no block appears twice), in
        bulk: the free ones among them leave the free queue. Nothing changes where one cannot."""
        refs = self.refs[blocks]
        revive = blocks[refs == 0]
        if len(revive):
            queued = self._queue.contains_each(revive)
            if not queued.all():
                b = int(revive[np.argmin(queued)])
                raise KeyError(f"block {b} has no references but is not in the free queue")
            self._queue.remove_each(revive)
        self.refs[blocks] = refs + 1

    def free(self, blocks: Iterable[int] | np.ndarray) -> None:
        """Drop one reference to each block; blocks reaching 0 go to the tail of the free queue, in order."""
        if not isinstance(blocks, np.ndarray):
            blocks = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
            if len(blocks) <= 1:
                if blocks:
                    self._free_one(blocks[0])
                return
            blocks = np.array(blocks, dtype=np.int64)
        if len(blocks) <= 1:
            if len(blocks):
                self._free_one(int(blocks[0]))
            return
        refs = self.refs[blocks]
        if np.count_nonzero(refs != 1) == 0 and self._queue.push(blocks):
            self.refs[blocks] = 0   # distinct blocks, each losing its last reference: in bulk
            return
        if self._distinct(blocks):   # shared blocks among them (prefix-cache hits, forks): still in bulk
            left = refs - 1
            if np.count_nonzero(left < 0):
                raise RuntimeError(f"block {int(blocks[np.argmin(left)])} freed more often than allocated")
            self.refs[blocks] = left
            last = blocks[left == 0]
            if len(last) > 1:
                self._queue.push(last, distinct=True)
            elif len(last):
                self._queue.push1(int(last[0]))
            return
        for b in blocks.tolist():   # a block given twice: one at a time
            self._free_one(b)

    def _distinct(self, blocks: np.ndarray) -> bool:
        """No block appears twice in ``blocks`` (a scratch array marks each one's last position)."""
        if self._marks is None:
            self._marks = np.empty(self.num_blocks, dtype=np.int64)
        slots = np.arange(len(blocks))
        self._marks[blocks] = slots
        return not np.count_nonzero(self._marks[blocks] != slots)

    def free_last_refs(self, blocks: np.ndarray) -> None:
        """``free`` of blocks the caller knows each hold exactly one reference (skips that check, and the
        check for a block given twice: a block in two places would hold two references)."""
        if len(blocks) > 1 and self._queue.push(blocks, distinct=True):
            self.refs[blocks] = 0
        else:
            self.free(blocks)

    def grow_tables(self, tables: list[list[int]], pos: list[int], steps: list[int], k: int, used0: int,
                    logical0: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``allocate(len(pos))`` with block e appended to ``tables[pos[e]]`` (events in step order, each
        in one of ``k`` steps), and the used and logical block counts after each step, counted from
        ``used0`` and ``logical0``. None, nothing done, where the compiled path does not apply (then the
        caller allocates)."""
        if native is None or self.on_evict is not None:
            return None
        used = np.empty(k, dtype=np.int64)
        logical = np.empty(k, dtype=np.int64)
        if not self._queue.pop_to_tables(tables, pos, steps, self.refs, used, logical, used0, logical0):
            return None
        return used, logical

    def grow_lane(self, lane: DecodeLane, tables: dict[int, list[int]], bs: int) -> tuple[int, list[int]] | None:
        """The decode lane's block boundaries of one step from the free queue (``FreeQueue.pop_to_lane``):
        (blocks taken, the positions whose new block is their table's final one), or None (nothing done)
        where the compiled path does not apply."""
        if native is None or self.on_evict is not None:
            return None
        return self._queue.pop_to_lane(lane.ids, lane.comp, lane.gen, lane.out, tables, bs, self.refs)

    def free_table(self, table: list[int]) -> None:
        """``free_last_refs`` of a block table's blocks, tail first (the tail is then evicted first when
        cached), given as the table's list."""
        if native is not None and len(table) > 1:
            self._queue.push_table(table, self.refs)
        else:
            self.free_last_refs(np.array(table[::-1], dtype=np.int64))

    def _free_one(self, b: int) -> None:
        r = int(self.refs[b]) - 1
        if r < 0:
            raise RuntimeError(f"block {b} freed more often than allocated")
        self.refs[b] = r
        if r == 0:
            self._queue.push1(b)

    # ------------------------------------------------------------ invariants
    def check_integrity(self, holders: dict[int, int] | None = None) -> None:
        """Assert the pool's invariants; ``holders`` maps block id -> number of block tables holding it."""
        self._queue.check()
        refs = self.refs
        bad = np.flatnonzero(refs < 0)
        assert not len(bad), f"block {bad[0]}: negative ref count {refs[bad[0]]}"
        queued = np.zeros(self.num_blocks, dtype=bool)
        queued[self._queue.order()] = True
        bad = np.flatnonzero(queued != (refs == 0))
        if len(bad):
            b = int(bad[0])
            raise AssertionError(f"block {b}: ref count {refs[b]} but {'in' if queued[b] else 'not in'} free queue")
        assert self.num_free + int(np.count_nonzero(refs)) == self.num_blocks, "free + used != total"
        if holders is not None:
            held = np.zeros(self.num_blocks, dtype=np.int64)
            for b, c in holders.items():
                held[b] = c
            bad = np.flatnonzero(held != refs)
            if len(bad):
                b = int(bad[0])
                raise AssertionError(f"block {b}: ref count {refs[b]} but held by {held[b]} tables")
