"""A CPU tier under the prefix cache: vLLM's KV offloading (``--kv-offloading-size``, native CPU backend).

Every full block that enters the GPU prefix cache is also copied to host memory (write-through, in the
background: the copy is not priced). The host tier holds block hashes in least-recently-used order, at
most ``capacity`` blocks; storing into a full tier drops its least recently used block. A request admitted
from nothing (new, or preempted by recompute) first reuses the GPU cache's run of blocks, then the run of
blocks that follows it in the host tier: those are loaded back into fresh GPU blocks instead of computed.

    prompt blocks:  b0  b1  b2  b3  b4  b5 | rest of the prompt
    GPU cache:      hit hit  -               (GPU run: 2 blocks, as without the tier)
    host tier:              hit hit  -       (host run: 2 blocks after the GPU run, loaded over PCIe)
    computed:                        b4 b5 + the rest

The tier holds hashes only (no KV): a block's content is named by its chained hash (sim/kv/prefix_cache.py),
so a hash found here is that block's KV. Invariants: ``len(self) <= capacity``; a hash appears once.
Counters in blocks: ``stored`` (copies made), ``evicted`` (dropped when full), ``loaded`` (brought back).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class HostTier:
    """Block hashes in host memory, least recently used first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a host tier holds at least one block, got {capacity}")
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.stored = 0
        self.evicted = 0
        self.loaded = 0
        self.query_tokens = 0   # prompt tokens looked up at first admissions
        self.hit_tokens = 0     # of those, served from this tier

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def store(self, hashes: Sequence[int]) -> None:
        """Copy these blocks to host memory (each becomes the most recently used), dropping the least
        recently used blocks beyond the capacity."""
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            self.stored += 1
            if len(lru) > self.capacity:
                lru.popitem(last=False)
                self.evicted += 1

    def run_from(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """How many of ``hashes[start:stop]``, from ``start`` on without a gap, the tier holds (a query:
        nothing changes)."""
        lru = self._lru
        k = start
        while k < stop and hashes[k] in lru:
            k += 1
        return k - start

    def touch(self, hashes: Sequence[int]) -> None:
        """These blocks were used (a GPU hit or a load): the ones held here become the most recently used."""
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)

    def summary(self, block_size: int) -> dict[str, float]:
        """The tier's figures for summary.json."""
        return {"host_cache_blocks": self.capacity,
                "host_cache_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
                "host_loaded_tokens": self.loaded * block_size,
                "host_stored_blocks": self.stored, "host_evicted_blocks": self.evicted}
