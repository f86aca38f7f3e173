"""KVCacheManager: the paged allocator that maps each running request to its blocks.

A request's block table maps logical blocks to physical ones (block_size = 4 here):

    tokens:        t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 .. ..
    logical block:      0      |      1      |      2
    block table:  [    7       ,      2      ,      9     ]   (physical ids, any order)

``allocate_slots(req, n)`` makes room for ``req.num_computed_tokens + n`` tokens, on demand:

    |<------ computed ------>|<-- new (n) -->|<-- unused slots of the last block -->|
    |        KV present       |  written now  |    allocated, not yet filled         |

Invariants (``check_integrity``): every block's ref count equals the number of block tables
holding it; free + used = total; slot accounting (token_states + reserved + internal + free = capacity).
"""

from __future__ import annotations

from collections import Counter

from sim.kv.block_pool import BlockPool
from sim.request import Request


class KVCacheManager:
    """Paged KV memory for a set of requests, keyed by ``req_id``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[int, list[int]] = {}
        # slot accounting for the memory breakdown (DESIGN.md); all in token slots
        self._held_tokens = 0      # KV of computed tokens, summed over resident requests
        self._beyond_final = 0     # allocated slots past each request's final length
        self._beyond: dict[int, int] = {}

    # ------------------------------------------------------------ sizing
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, req: Request) -> bool:
        """Whether the request fits in an otherwise empty cache."""
        return self.blocks_for(req.max_kv_tokens) <= self.num_blocks

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def usage(self) -> float:
        return self.pool.num_used / self.num_blocks

    # ------------------------------------------------------------ allocation
    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        table = self.block_tables.get(req.req_id)
        have = len(table) if table else 0
        return max(0, self.blocks_for(req.num_computed_tokens + num_new_tokens) - have)

    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        return self.pool.can_allocate(self.blocks_needed(req, num_new_tokens))

    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Grow ``req``'s table to hold its computed plus ``num_new_tokens`` tokens; False if blocks ran out."""
        table = self.block_tables.get(req.req_id)
        if table is None:
            table = self.block_tables[req.req_id] = []
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        table.extend(self.pool.allocate(need))
        self._note_table(req, table)
        return True

    def _note_table(self, req: Request, table: list[int]) -> None:
        beyond = max(0, len(table) * self.block_size - req.max_kv_tokens)
        old = self._beyond.get(req.req_id, 0)
        if beyond != old:
            self._beyond_final += beyond - old
            self._beyond[req.req_id] = beyond

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks (tail first, so the tail is evicted first when cached)."""
        table = self.block_tables.pop(req.req_id, None)
        if table is None:
            return
        self.pool.free(reversed(table))
        self._beyond_final -= self._beyond.pop(req.req_id, 0)
        self._held_tokens -= req.num_computed_tokens

    def note_computed(self, num_tokens: int) -> None:
        """The step computed ``num_tokens`` new tokens of KV for resident requests."""
        self._held_tokens += num_tokens

    def get_block_table(self, req_id: int) -> list[int]:
        return self.block_tables[req_id]

    # ------------------------------------------------------------ accounting
    def memory_slots(self) -> tuple[int, int, int, int, int]:
        """(token_states, reserved, internal_fragmentation, external_fragmentation, free), in token slots."""
        bs = self.block_size
        allocated = self.pool.num_used * bs
        token_states = self._held_tokens
        internal = self._beyond_final
        reserved = allocated - token_states - internal
        return token_states, reserved, internal, 0, self.pool.num_free * bs

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    def check_integrity(self) -> None:
        holders: Counter[int] = Counter()
        for table in self.block_tables.values():
            holders.update(table)
        self.pool.check_integrity(holders)
        ts, reserved, internal, external, free = self.memory_slots()
        assert min(ts, reserved, internal, external, free) >= 0, f"negative slot count {(ts, reserved, internal)}"
        assert ts + reserved + internal + external + free == self.capacity_slots, "slot accounting does not add up"
