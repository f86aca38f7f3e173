"""The pre-paging baselines: one contiguous KV region per request over a linear KV space.

The space is ``num_blocks`` blocks of ``block_size`` slots laid end to end; a region is a run of whole
blocks reserved at admission (first fit over a coalescing free list) and freed at the end:

    blocks:  0 ....... 7 | 8 ..... 11 | 12 .... 15 | 16 ........... 23 | 24 .. 31
             r3 (Max)    |   free     | r9 (Oracle)|  r4 (Pow2)        |  free
    largest free extent = 24..31 (8 blocks); the 4 free blocks 8..11 are external fragmentation.

Region size, in token slots (rounded up to whole blocks):
    contiguous-max     the model's max length
    contiguous-pow2    the next power of two of prompt + output (capped at the max length)
    contiguous-oracle  exactly the KV the request will ever hold (prompt + output - 1)

Memory breakdown (token slots): token_states (KV of computed tokens), reserved (region slots the request
will still fill), internal_fragmentation (region slots beyond its final length), external_fragmentation
(free slots outside the largest free extent) and free (the largest free extent); they add up to capacity.
The block list of a request covers its whole region, so executors see ordinary block tables.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from sim.request import Request

MODES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")


class ExtentAllocator:
    """First-fit allocation of block runs; freed runs merge with free neighbours."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.starts: list[int] = [0]          # sorted starts of free extents
        self.lengths: dict[int, int] = {0: num_blocks}
        self.num_free = num_blocks
        self._largest: int | None = num_blocks

    def largest_free(self) -> int:
        if self._largest is None:
            self._largest = max(self.lengths.values(), default=0)
        return self._largest

    def allocate(self, n: int) -> int | None:
        """Start of a run of ``n`` free blocks (the lowest that fits), or None."""
        for i, s in enumerate(self.starts):
            length = self.lengths[s]
            if length >= n:
                del self.lengths[s]
                if length == n:
                    del self.starts[i]
                else:
                    self.starts[i] = s + n
                    self.lengths[s + n] = length - n
                self.num_free -= n
                self._largest = None
                return s
        return None

    def free(self, start: int, n: int) -> None:
        """Return the run ``start .. start+n-1``, merging it with free neighbours."""
        self.num_free += n
        self._largest = None
        i = bisect_left(self.starts, start)
        if i < len(self.starts):
            nxt = self.starts[i]
            assert start + n <= nxt, f"freeing blocks {start}..{start + n - 1} overlaps the free extent at {nxt}"
            if start + n == nxt:  # merge with the right neighbour
                n += self.lengths.pop(nxt)
                del self.starts[i]
        if i > 0:
            prev = self.starts[i - 1]
            end = prev + self.lengths[prev]
            assert end <= start, f"freeing block {start}, which is already free"
            if end == start:  # merge with the left neighbour
                self.lengths[prev] += n
                return
        insort(self.starts, start)
        self.lengths[start] = n

    def check_integrity(self, used: list[tuple[int, int]]) -> None:
        """Free extents are sorted, disjoint, not adjacent, and together with ``used`` tile the space."""
        spans = sorted([(s, self.lengths[s], "free") for s in self.starts] + [(s, n, "used") for s, n in used])
        pos = 0
        for s, n, kind in spans:
            assert s == pos, f"gap or overlap at block {pos} ({kind} run starts at {s})"
            pos = s + n
        assert pos == self.num_blocks, f"runs cover {pos} of {self.num_blocks} blocks"
        for a, b in zip(self.starts, self.starts[1:]):
            assert a + self.lengths[a] < b, f"free extents at {a} and {b} were not merged"
        assert self.num_free == sum(self.lengths.values()), "free count is stale"


def _next_pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


class ContiguousKVManager:
    """KVCacheManager's interface over contiguous per-request regions (no swapping, no sharing)."""

    stale_pages: tuple = ()   # (nothing is freed as a step is planned: KVCacheManager.free_stale_pages)

    def __init__(self, num_blocks: int, block_size: int, mode: str, max_model_len: int) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown contiguous allocator {mode!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.mode = mode
        self.max_model_len = max_model_len
        self.space = ExtentAllocator(num_blocks)
        self.block_tables: dict[int, list[int]] = {}
        self.regions: dict[int, tuple[int, int]] = {}   # req_id -> (first block, number of blocks)
        self._held_tokens = 0
        self._internal = 0                                # region slots beyond final lengths
        self._beyond: dict[int, int] = {}
        self.decode_fast_path = True   # a running request's region is reserved: decodes need no call

    # ------------------------------------------------------------ sizing
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def region_tokens(self, req: Request) -> int:
        """Slots the allocator reserves for ``req`` (before rounding up to blocks)."""
        if self.mode == "contiguous-max":
            return self.max_model_len
        if self.mode == "contiguous-pow2":
            return min(_next_pow2(req.prompt_len + req.output_len), max(self.max_model_len, req.max_kv_tokens))
        return req.max_kv_tokens

    def region_tokens_of(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """``region_tokens`` of many requests at once, from their prompt and output lengths (int64 arrays)."""
        final = prompt + output - 1
        if self.mode == "contiguous-max":
            return np.full_like(final, self.max_model_len)
        if self.mode == "contiguous-pow2":   # (log2 is exact enough far beyond any context length)
            pow2 = np.left_shift(1, np.ceil(np.log2(prompt + output)).astype(np.int64))
            return np.minimum(pow2, np.maximum(self.max_model_len, final))
        return final

    def can_ever_fit(self, req: Request) -> bool:
        return self.blocks_for(self.region_tokens(req)) <= self.num_blocks

    def num_free_blocks(self) -> int:
        return self.space.num_free

    def usage(self) -> float:
        return 1.0 - self.space.num_free / self.num_blocks

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    # ------------------------------------------------------------ allocation
    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        return 0 if req.req_id in self.regions else self.blocks_for(self.region_tokens(req))

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        if req.req_id in self.regions:
            return True
        return self.blocks_needed(req, num_new_tokens) <= self.space.largest_free()

    def allocate_slots(self, req: Request, num_new_tokens: int, cached: list[int] | None = None) -> bool:
        """Reserve ``req``'s whole region on first call (first fit); later calls only check it suffices."""
        region = self.regions.get(req.req_id)
        if region is not None:
            assert req.num_computed_tokens + num_new_tokens <= region[1] * self.block_size, "region overflow"
            return True
        n = self.blocks_for(self.region_tokens(req))
        start = self.space.allocate(n)
        if start is None:
            return False
        self.regions[req.req_id] = (start, n)
        self.block_tables[req.req_id] = list(range(start, start + n))
        beyond = n * self.block_size - req.max_kv_tokens
        self._beyond[req.req_id] = beyond
        self._internal += beyond
        return True

    def free(self, req: Request) -> None:
        region = self.regions.pop(req.req_id, None)
        if region is None:
            return
        del self.block_tables[req.req_id]
        self.space.free(*region)
        self._internal -= self._beyond.pop(req.req_id)
        self._held_tokens -= req.num_computed_tokens

    def note_computed(self, num_tokens: int) -> None:
        self._held_tokens += num_tokens

    def get_block_table(self, req_id: int) -> list[int]:
        return self.block_tables[req_id]

    # swapping is not modelled for contiguous regions: preemption falls back to recompute
    def can_swap_out(self, req: Request) -> bool:
        return False

    # ------------------------------------------------------------ accounting
    def memory_slots(self) -> tuple[int, int, int, int, int]:
        """(token_states, reserved, internal_fragmentation, external_fragmentation, free), in token slots."""
        bs = self.block_size
        allocated = (self.num_blocks - self.space.num_free) * bs
        largest = self.space.largest_free() * bs
        external = self.space.num_free * bs - largest
        return self._held_tokens, allocated - self._held_tokens - self._internal, self._internal, external, largest

    def check_integrity(self) -> None:
        self.space.check_integrity(list(self.regions.values()))
        assert self.regions.keys() == self.block_tables.keys(), "regions and block tables disagree"
        ts, reserved, internal, external, free = self.memory_slots()
        assert min(ts, reserved, internal, external, free) >= 0, f"negative slot count {(ts, reserved, internal)}"
        assert ts + reserved + internal + external + free == self.capacity_slots, "slot accounting does not add up"
