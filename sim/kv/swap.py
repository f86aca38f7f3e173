"""The CPU swap space: where preemption by swap parks a request's KV blocks.

    GPU table of r7:  [ 4, 9, 2 ]        swap out  ->  (4, 0) (9, 1) (2, 2)     CPU table of r7: [0, 1, 2]
    CPU table of r7:  [ 0, 1, 2 ]        swap in   ->  (0, 5) (1, 3) (2, 8)     GPU table of r7: [5, 3, 8]

Each pair is one block copied over the host link; the scheduler puts the pairs in the step's plan
(``blocks_to_swap_out`` / ``blocks_to_swap_in``) and the executor charges their transfer time.
The space is bounded (``kv_cache.swap_space_gb`` in blocks); when it is full the scheduler falls back
to recompute. Invariant: every CPU block is held by exactly one swapped request, or free.
"""

from __future__ import annotations

import numpy as np

from sim.kv.block_pool import BlockPool


class SwapSpace:
    """CPU blocks ``0 .. num_blocks-1`` and the table of each swapped-out request."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = max(0, num_blocks)
        self.pool = BlockPool(self.num_blocks) if self.num_blocks else None
        self.tables: dict[int, list[int]] = {}

    @property
    def num_used(self) -> int:
        return self.pool.num_used if self.pool is not None else 0

    def can_hold(self, n: int) -> bool:
        return self.pool is not None and self.pool.can_allocate(n)

    def num_held(self, req_id: int) -> int:
        return len(self.tables[req_id])

    def holds(self, req_id: int) -> bool:
        return req_id in self.tables

    def store(self, req_id: int, gpu_blocks: list[int]) -> list[tuple[int, int]]:
        """Give ``req_id`` one CPU block per GPU block; returns the (gpu, cpu) copies to make."""
        assert self.pool is not None and req_id not in self.tables, f"request {req_id} already swapped"
        cpu = self.pool.allocate(len(gpu_blocks))
        self.tables[req_id] = cpu
        return list(zip(gpu_blocks, cpu))

    def load(self, req_id: int, gpu_blocks: list[int]) -> list[tuple[int, int]]:
        """Release ``req_id``'s CPU blocks into ``gpu_blocks``; returns the (cpu, gpu) copies to make."""
        cpu = self.tables.pop(req_id)
        assert len(cpu) == len(gpu_blocks), f"request {req_id}: {len(cpu)} CPU blocks, {len(gpu_blocks)} GPU blocks"
        assert self.pool is not None
        self.pool.free(cpu)
        return list(zip(cpu, gpu_blocks))

    def drop(self, req_id: int) -> None:
        """Free ``req_id``'s CPU blocks without loading them back (its request was aborted while swapped)."""
        assert self.pool is not None
        self.pool.free(self.tables.pop(req_id))

    def check_integrity(self) -> None:
        if self.pool is None:
            assert not self.tables, "swapped tables without a swap space"
            return
        # O(blocks held), not O(swap space): the CPU pool can hold millions of blocks
        blocks = np.fromiter((b for table in self.tables.values() for b in table), np.int64)
        refs = self.pool.refs[blocks]   # (the live array: a snapshot would cost O(swap space))
        bad = np.flatnonzero(refs != 1)
        assert not bad.size, f"CPU block {blocks[bad[0]]}: ref count {refs[bad[0]]}"
        queued = self.pool.are_free(blocks)
        assert not queued.any(), f"CPU block {blocks[np.argmax(queued)]}: held by a table but free"
        held = len(blocks)
        assert held == self.pool.num_used, f"{self.pool.num_used} CPU blocks in use, {held} held by tables"
