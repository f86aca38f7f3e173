"""The block pool's free queue: a FIFO of block ids in a numpy array, with lazy deletion.

    slots:   0    1    2    3    4    5    6    7    8
    ids:     .    .    5    9    4    2    7    .    .        head = 2, tail = 7
    at:     at[5] = 2   at[9] = -1 (taken out)   at[4] = 4   at[2] = 5   at[7] = 6

A slot ``i`` in ``head .. tail-1`` is an entry exactly when ``at[ids[i]] == i``; any other slot in that
range is a hole, left by ``remove`` (a prefix-cache hit on a free cached block), skipped when the head
reaches it. Above, the queue is 5 -> 4 -> 2 -> 7 and slot 3 is a hole. So:

- ``pop(n)`` takes a slice from the head, ``push(ids)`` writes a slice at the tail: numpy work per call,
  not Python work per block (unless holes lie in the popped range);
- ``remove(b)`` is O(1): it only clears ``at[b]``;
- when the tail reaches the end of the array, the entries move to its start (holes dropped); the array
  holds twice the pool, so that happens at most once per ``num_blocks`` pushed blocks.

Invariants (``check``): the entries are distinct blocks; ``size`` counts them, ``holes`` counts the
other slots of ``head .. tail-1``.
"""

from __future__ import annotations

import numpy as np

from sim.native import native


class FreeQueue:
    """Block ids ``0 .. num_blocks-1``, initially all queued in increasing order."""

    def __init__(self, num_blocks: int) -> None:
        cap = 2 * num_blocks
        self._ids = np.empty(cap, dtype=np.int64)
        self._ids[:num_blocks] = np.arange(num_blocks)
        self._at = np.arange(num_blocks, dtype=np.int64)   # block -> its slot (stale unless an entry)
        self._head = 0
        self._tail = num_blocks
        self.size = num_blocks     # entries
        self.holes = 0             # non-entries in head .. tail-1

    # ------------------------------------------------------------ queries
    def __contains__(self, b: int) -> bool:
        i = int(self._at[b])
        return self._head <= i < self._tail and self._ids[i] == b

    def contains_each(self, blocks: np.ndarray) -> np.ndarray:
        """``b in self`` for each of ``blocks`` at once."""
        i = self._at[blocks]
        inside = (self._head <= i) & (i < self._tail)
        return inside & (self._ids[np.where(inside, i, 0)] == blocks)

    def order(self) -> list[int]:
        """The entries, head first."""
        return self._entries().tolist()

    def _entries(self) -> np.ndarray:
        seg = self._ids[self._head:self._tail]
        if not self.holes:
            return seg.copy()
        return seg[self._at[seg] == np.arange(self._head, self._tail)]

    # ------------------------------------------------------------ changes
    def pop1(self) -> int:
        """Take the head entry (the queue must not be empty)."""
        h = self._head
        b = int(self._ids[h])
        if self.holes:
            at, ids = self._at, self._ids
            while at[b] != h:
                self.holes -= 1
                h += 1
                b = int(ids[h])
        self._head = h + 1
        self.size -= 1
        return b

    def pop(self, n: int) -> np.ndarray:
        """Take ``n`` entries (``n <= size``) from the head, in order, as a new array."""
        h = self._head
        if not self.holes or not n:
            self._head = h + n
            self.size -= n
            return self._ids[h:h + n].copy()
        parts = []
        need = n
        ids, at = self._ids, self._at
        while need:
            end = min(self._tail, h + need + min(self.holes, need + 32))
            seg = ids[h:end]
            ok = at[seg] == np.arange(h, end)
            got = int(np.count_nonzero(ok))
            if got > need:   # stop just after the need-th entry
                end = h + int(np.flatnonzero(ok)[need - 1]) + 1
                seg, ok, got = seg[:end - h], ok[:end - h], need
            self.holes -= len(seg) - got
            parts.append(seg[ok])
            need -= got
            h = end
        self._head = h
        self.size -= n
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def push1(self, b: int) -> None:
        """Append block ``b`` (not queued) at the tail."""
        if self._tail == len(self._ids):
            self._compact()
        t = self._tail
        self._ids[t] = b
        self._at[b] = t
        self._tail = t + 1
        self.size += 1

    def push(self, blocks: np.ndarray, distinct: bool = False) -> bool:
        """Append ``blocks`` (none queued) at the tail, in order. Refuses (False, nothing queued) when a
        block appears twice, which the caller then handles one block at a time. ``distinct``: the caller
        knows no block appears twice (one block table's blocks), so that is not checked."""
        n = len(blocks)
        if self._tail + n > len(self._ids):
            self._compact()
        t = self._tail
        slots = np.arange(t, t + n)
        self._at[blocks] = slots        # a repeated block keeps only its last slot
        if not distinct and np.count_nonzero(self._at[blocks] != slots):
            return False                # the slots are past the tail: no entry changed
        self._ids[t:t + n] = blocks
        self._tail = t + n
        self.size += n
        return True

    def push_table(self, table: list[int], refs: np.ndarray) -> None:
        """``push`` of a block table's distinct blocks, tail first, each losing its last reference in
        ``refs`` (the pool's counts, set to 0 here), from the list itself in one compiled pass
        (sim/csrc/blocks.c free_table; the caller checks ``native`` is built)."""
        n = len(table)
        if self._tail + n > len(self._ids):
            self._compact()
        native.free_table(table, self._ids, self._at, refs, self._tail)
        self._tail += n
        self.size += n

    def pop_to_tables(self, tables: list[list[int]], pos: list[int], steps: list[int], refs: np.ndarray,
                      used: np.ndarray, logical: np.ndarray, used0: int, logical0: int) -> bool:
        """``pop`` of len(pos) entries straight into block tables, in one compiled pass (sim/csrc/blocks.c
        grow_tables): entry e goes to ``tables[pos[e]]`` with ``refs`` 1; ``used``/``logical`` get the
        counts after each step (``steps`` ascending). False, nothing done, where the queue has holes at
        its head (then ``pop`` must skip them) or too few entries."""
        n = len(pos)
        if self.holes or n > self.size:
            return False
        native.grow_tables(tables, pos, steps, self._ids, refs, self._head, used, logical, used0, logical0)
        self._head += n
        self.size -= n
        return True

    def pop_to_lane(self, ids: np.ndarray, comp: np.ndarray, gen: np.ndarray, out: np.ndarray,
                    tables: dict[int, list[int]], bs: int, refs: np.ndarray) -> tuple[int, list[int]] | None:
        """The decode lane's block boundaries of one step (sim/csrc/blocks.c lane_grow): each lane position
        whose computed count is a multiple of ``bs`` takes the head entry, in lane order, into its table
        (``tables[ids[i]]``) with ``refs`` 1. Returns (blocks taken, the positions whose new block is their
        table's final one with slots to spare); None, nothing done, where a table is not exactly full, entries are short,
        or the queue has holes (the caller's general path applies). The caller checks ``native`` is built."""
        if self.holes:
            return None
        got = native.lane_grow(ids, comp, gen, out, tables, bs, self._ids, refs, self._head, self.size)
        if got is None:
            return None
        self._head += got[0]
        self.size -= got[0]
        return got

    def remove(self, b: int) -> None:
        """Take entry ``b`` out wherever it is (it must be queued): its slot becomes a hole."""
        self._at[b] = -1
        self.size -= 1
        self.holes += 1

    def remove_each(self, blocks: np.ndarray) -> None:
        """``remove`` of each of ``blocks`` (distinct, all queued) at once."""
        self._at[blocks] = -1
        self.size -= len(blocks)
        self.holes += len(blocks)

    def _compact(self) -> None:
        """Move the entries to the start of the array, holes dropped."""
        live = self._entries()
        n = len(live)
        self._ids[:n] = live
        self._at[live] = np.arange(n)
        self._head, self._tail, self.holes = 0, n, 0

    # ------------------------------------------------------------ invariants
    def check(self) -> None:
        seg = self._ids[self._head:self._tail]
        live = self._entries()
        assert 0 <= self._head <= self._tail <= len(self._ids), "head/tail out of range"
        assert len(np.unique(live)) == len(live), "a block is queued twice"
        assert len(live) == self.size, f"{len(live)} entries but size {self.size}"
        assert len(seg) - len(live) == self.holes, f"{len(seg) - len(live)} holes counted as {self.holes}"
