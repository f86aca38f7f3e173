"""KVCacheManager: the paged allocator that maps each running request to its blocks.

A request's block table maps logical blocks to physical ones (block_size = 4 here):

    tokens:        t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 .. ..
    logical block:      0      |      1      |      2
    block table:  [    7       ,      2      ,      9     ]   (physical ids, any order)

``allocate_slots(req, n)`` makes room for ``req.num_computed_tokens + n`` tokens, on demand:

    |<------ computed ------>|<-- new (n) -->|<-- unused slots of the last block -->|
    |        KV present       |  written now  |    allocated, not yet filled         |

Invariants (``check_integrity``): every block's ref count equals the number of block tables
(sequences of forked requests included) holding it; free + used = total; slot accounting
(token_states + reserved + internal + free = capacity); the prefix cache's maps agree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.kv.block_pool import BlockPool
from sim.kv.prefix_cache import NO_BLOCKS
from sim.kv.sharing import SharingMixin, seq_width
from sim.kv.swap import SwapSpace
from sim.request import Request

if TYPE_CHECKING:
    from sim.sched.decode_lane import DecodeLane

FEW_EVENTS = 8   # up to this many of a decode run's block allocations are made in plain Python (else numpy)


class WindowMoves:
    """For a manager whose windows move as requests grow (sim/kv/window_pages.py, sliding_only.py): the decode
    lane's block boundaries go through ``allocate_slots``, which moves them, not the bulk paths."""

    def grow_full_tables(self, reqs: list[Request], at: list[int], computed: list[int], finals: list[int]) -> bool:
        """Not here (False, nothing done)."""
        return False

    def grow_lane(self, lane: DecodeLane) -> bool:
        """Not here (False, nothing done)."""
        return False


class KVCacheManager(SharingMixin):
    """Paged KV memory for a set of requests, keyed by ``req_id``. Block sharing (prefix caching,
    forked sequences, copy-on-write) lives in ``SharingMixin`` (sim/kv/sharing.py)."""

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 prefix_caching: bool = False, host_blocks: int = 0) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pool = BlockPool(num_blocks)
        self.swap = SwapSpace(num_cpu_blocks)   # CPU blocks for preemption by swap
        self.block_tables: dict[int, list[int]] = {}
        # slot accounting for the five-way memory breakdown (docs/architecture.md); all in token slots
        self._held_tokens = 0      # KV of computed tokens, summed over resident requests
        self._beyond_final = 0     # allocated slots past each request's final length
        self._beyond: dict[int, int] = {}
        # True while a decode token that lands inside a request's last block needs no manager call:
        # the block is exclusively the request's (no copy-on-write) and nothing is tracked per token.
        self.decode_fast_path = True
        self._init_sharing(prefix_caching, host_blocks)

    # ------------------------------------------------------------ sizing
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, req: Request) -> bool:
        """Whether the request fits in an otherwise empty cache (k sequences share the prompt's full blocks)."""
        own = self.blocks_for(req.max_kv_tokens)
        return own + (seq_width(req) - 1) * (own - req.prompt_len // self.block_size) <= self.num_blocks

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

    def allocate_slots(self, req: Request, num_new_tokens: int, cached: Sequence[int] | np.ndarray | None = None,
                       loaded: int = 0, drafts: int = 0) -> bool:
        """Grow ``req``'s table to hold its computed plus ``num_new_tokens`` tokens; False if blocks ran out.
        ``cached``: prefix-cache blocks (from ``match_prefix`` or ``match_prefix_blocks``) that start a fresh
        table; ``loaded``: blocks after them the host tier fills (``host_run``); a forked request grows every
        sequence (copy-on-write pairs collect in ``copies``). ``drafts``: the last of the new tokens are
        speculative (a block they fill joins the prefix cache only once they are accepted)."""
        rid = req.req_id
        if (cached is not None and len(cached)) or loaded:
            return self._allocate_cached(req, num_new_tokens, NO_BLOCKS if cached is None else cached, loaded)
        if rid in self.groups:
            return self._allocate_group(req, num_new_tokens)
        table = self.block_tables.get(rid)
        fresh = not table
        if table is None:
            table = self.block_tables[rid] = []
        end = req.num_computed_tokens + num_new_tokens
        need = -(-end // self.block_size) - len(table)
        if need > self.pool.num_free:
            return False
        if need > 0 or fresh:
            old = len(table)
            if need > 0:
                table.extend(self.pool.allocate(need))
            self._note_table(req, table, old)
        if self.prefix_cache is not None:
            if fresh:
                self._first_lookup(req, 0)
                if self.host is not None and not req.num_computed_tokens:
                    self._host_lookup(req)
            self._cache_full_blocks(req, table, end - drafts)
        return True

    def allocate_drafts(self, req: Request, num_new_tokens: int, drafts: int) -> bool:
        """``allocate_slots(req, num_new_tokens, drafts=drafts)`` of a running decode (one table, blocks held):
        without a call there when its blocks already hold the new tokens."""
        table = self.block_tables.get(req.req_id)
        if table and req.req_id not in self.groups:
            end = req.num_computed_tokens + num_new_tokens
            if -(-end // self.block_size) <= len(table):
                if self.prefix_cache is not None:
                    self._cache_full_blocks(req, table, end - drafts)
                return True
        return self.allocate_slots(req, num_new_tokens, drafts=drafts)

    def trim(self, req: Request) -> None:
        """Give back the blocks of ``req``'s table past its computed tokens (speculative decoding: the slots of
        rejected drafts). They hold one reference each and are in no prefix cache (``allocate_slots(drafts=)``)."""
        table = self.block_tables[req.req_id]
        keep = self.blocks_for(req.num_computed_tokens)
        if len(table) > keep:
            extra = table[keep:]
            del table[keep:]
            self._logical_blocks -= len(extra)
            self.pool.free_table(extra)
            self._note_beyond(req)

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks (tail first, so the tail is evicted first when cached)."""
        table = self.block_tables.get(req.req_id)
        if table is None:
            return
        self._free_shared(req, table)   # caches full blocks, releases every sequence's table
        del self.block_tables[req.req_id]
        self._beyond_final -= self._beyond.pop(req.req_id, 0)

    def note_computed(self, num_tokens: int) -> None:
        """The step computed ``num_tokens`` new tokens of KV (one per sequence for a forked request)."""
        self._held_tokens += num_tokens
        self._sum_used += self.pool.num_used   # per-step sums for kv_sharing_saving (sharing.py)
        self._sum_logical += self._logical_blocks

    def note_decode_run(self, tokens_per_step: int, used: np.ndarray, logical: np.ndarray) -> None:
        """``len(used)`` decode steps computed ``tokens_per_step`` tokens each (sim/sched/decode_run.py);
        ``used``/``logical``: the pool's used and logical block counts at each step's end, as
        ``note_computed`` would have seen them one step at a time."""
        self._held_tokens += tokens_per_step * len(used)
        self._sum_used += int(used.sum())
        self._sum_logical += int(logical.sum())

    def note_decode_steps(self, tokens: np.ndarray, used: np.ndarray, logical: np.ndarray) -> None:
        """``note_decode_run`` for steps that computed ``tokens[j]`` tokens each (a batch that shrinks)."""
        self.note_decode_sums(int(tokens.sum()), int(used.sum()), int(logical.sum()))

    def note_decode_sums(self, tokens: int, used: int, logical: int) -> None:
        """``note_decode_steps`` given the sums over the steps of their tokens, used and logical blocks."""
        self._held_tokens += tokens
        self._sum_used += used
        self._sum_logical += logical

    def raise_peaks(self, used: int, logical: int) -> None:
        """Raise the used and logical block peaks to values the counters reached (between steps of a run)."""
        p = self.peaks
        p["used"] = max(p["used"], used)
        p["logical"] = max(p["logical"], logical)

    def allocate_decode_events(self, reqs: list[Request], pos: list[int], steps: list[int],
                               finals: list[tuple[int, int]], k: int,
                               peaks: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``allocate_decode_run`` in plain Python (a small batch: cheaper than numpy's grouping up to
        hundreds of events), given the (step, position) of each request whose table reaches its final
        block with slots to spare (its last event): those are noted once all tables have grown."""
        used0, beyond0, logical0 = self.decode_run_counters()
        total = len(steps)
        if total == 0:
            return np.full(k, used0), np.full(k, beyond0), np.full(k, logical0)
        tables = [self.block_tables[r.req_id] for r in reqs]
        grown = self.pool.grow_tables(tables, pos, steps, k, used0, logical0)   # (compiled, where built)
        if grown is None:
            taken = np.bincount(steps, minlength=k).cumsum()   # blocks taken up to each step's end
            for p, b in zip(pos, self.pool.allocate(total)):
                tables[p].append(b)
            grown = used0 + taken, logical0 + taken
        self._logical_blocks += total
        if finals:
            extra = np.zeros(k, dtype=np.int64)   # slots beyond final lengths added at each step
            for j, i in finals:
                before = self._beyond_final
                self._note_beyond(reqs[i])
                extra[j] += self._beyond_final - before
            beyond = beyond0 + extra.cumsum()
        else:
            beyond = np.full(k, beyond0)
        if peaks:
            self._note_peaks()
        return grown[0], beyond, grown[1]

    def allocate_decode_run(self, reqs: list[Request], pos: np.ndarray, steps: np.ndarray,
                            new_len: np.ndarray, max_kv: np.ndarray, k: int,
                            peaks: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Grow tables as ``allocate_slots(req, 1)`` would at each decode-run boundary, without a prefix
        cache (nothing to insert or evict): event e gives ``reqs[pos[e]]`` a table of ``new_len[e]``
        blocks at step ``steps[e]`` (its request holds at most ``max_kv[e]`` KV tokens); events come
        sorted by (step, position), which is the order blocks leave the pool. Returns per step (used,
        beyond-final, logical) counters after its allocations. ``peaks``: raise the peaks to the counters
        after all of them (False: the caller raises them, when blocks are freed between the run's steps)."""
        bs = self.block_size
        last = (max_kv - 1) // bs
        per = (last + 1) * bs - max_kv
        final = (new_len == last + 1) & (per > 0)   # the table reaches its final block, with slots to spare
        total = len(steps)
        if total <= FEW_EVENTS:
            at = final.nonzero()[0]
            return self.allocate_decode_events(reqs, pos.tolist(), steps.tolist(),
                                               list(zip(steps[at].tolist(), pos[at].tolist())), k, peaks)
        used0, beyond0, logical0 = self.decode_run_counters()
        grown = np.bincount(steps, minlength=k).cumsum()   # blocks taken up to each step's end
        blocks = self.pool.allocate_array(total)
        order = np.argsort(pos, kind="stable")   # group by request, keeping step order
        by_req = pos[order]
        cut = ((by_req[1:] != by_req[:-1]).nonzero()[0] + 1).tolist()
        grown_ids = blocks[order].tolist()
        owners = by_req.tolist()
        tables = self.block_tables
        for a, b in zip([0, *cut], [*cut, total]):
            tables[reqs[owners[a]].req_id].extend(grown_ids[a:b])
        for e in final.nonzero()[0].tolist():
            self._note_beyond(reqs[int(pos[e])])
        self._logical_blocks += total
        if peaks:
            self._note_peaks()
        d_beyond = np.bincount(steps[final], weights=per[final], minlength=k).astype(np.int64)
        return used0 + grown, beyond0 + d_beyond.cumsum(), logical0 + grown

    def grow_full_tables(self, reqs: list[Request], at: list[int], computed: list[int], finals: list[int]) -> bool:
        """``allocate_slots(reqs[i], 1)`` for each ``i`` in ``at`` (batch order), whose ``computed`` tokens
        (``computed[j]`` for ``at[j]``, passed by the caller so the requests need not be up to date)
        exactly fill their tables, without a prefix cache: one block each, taken in that order, with the
        same bookkeeping. ``finals``: the ``i`` whose table thereby reaches its final block (the one
        holding the request's last KV token). False, with nothing done, when a table is not exactly full
        or blocks are short."""
        tables = self.block_tables
        bs = self.block_size
        grown = [tables[reqs[i].req_id] for i in at]
        n = len(at)
        if [len(t) * bs for t in grown] != computed or n > self.pool.num_free:
            return False
        if self.pool.grow_tables(grown, list(range(n)), [0] * n, 1, 0, 0) is None:   # (compiled, where built)
            for table, b in zip(grown, self.pool.allocate(n)):
                table.append(b)
        for i in finals:
            self._note_beyond(reqs[i])
        self._logical_blocks += len(at)
        self._note_peaks()
        return True

    stale_pages: dict | tuple = ()   # blocks to free as the next step is planned (window pages): none here

    def free_stale_pages(self) -> None:
        """Free what ``stale_pages`` holds: nothing here."""

    def boundary_need(self, reqs: list[Request], at: list[int], computed: list[int]) -> int:
        """The most free blocks ``allocate_slots(reqs[i], 1)`` for each ``i`` in ``at`` (in that order; their
        ``computed`` tokens fill their tables) needs at any point: one each."""
        return len(at)

    def grow_lane(self, lane: DecodeLane) -> bool:
        """``grow_full_tables`` of the decode lane's block boundaries this step, found and allocated in one
        compiled pass (``BlockPool.grow_lane``); False, nothing done, where that does not apply (then the
        caller finds them and takes the general path)."""
        if self.prefix_cache is not None:
            return False
        got = self.pool.grow_lane(lane, self.block_tables, self.block_size)
        if got is None:
            return False
        grown, finals = got
        if grown:
            reqs = lane.reqs
            for i in finals:
                self._note_beyond(reqs[i])
            self._logical_blocks += grown
            self._note_peaks()
        return True

    def decode_run_counters(self) -> tuple[int, int, int]:
        """(used blocks, slots beyond final lengths, logical blocks): what a decode run snapshots per step."""
        return self.pool.num_used, self._beyond_final, self._logical_blocks

    def get_block_table(self, req_id: int) -> list[int]:
        return self.block_tables[req_id]

    # ------------------------------------------------------------ swapping (preemption by swap)
    def can_swap_out(self, req: Request) -> bool:
        """Whether the CPU swap space has room for all of ``req``'s blocks (a forked request, whose
        sequences share blocks, is not swapped: it falls back to recompute)."""
        if req.req_id in self.groups:
            return False
        table = self.block_tables.get(req.req_id)
        return bool(table) and self.swap.can_hold(len(table))

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Copy ``req``'s blocks to CPU and free them on the GPU; returns the (gpu, cpu) pairs."""
        pairs = self.swap.store(req.req_id, self.block_tables[req.req_id])
        self.free(req)
        return pairs

    def swap_in_blocks(self, req: Request, num_new_tokens: int) -> int:
        """GPU blocks a swapped ``req`` needs to come back and compute ``num_new_tokens`` more."""
        return max(self.swap.num_held(req.req_id), self.blocks_for(req.num_computed_tokens + num_new_tokens))

    def can_swap_in(self, req: Request, num_new_tokens: int) -> bool:
        return self.pool.can_allocate(self.swap_in_blocks(req, num_new_tokens))

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Bring ``req``'s blocks back from CPU into fresh GPU blocks; returns the (cpu, gpu) pairs."""
        table = self.pool.allocate(self.swap.num_held(req.req_id))
        pairs = self.swap.load(req.req_id, table)
        self.block_tables[req.req_id] = table
        self._note_table(req, table)
        self._held_tokens += req.num_computed_tokens
        return pairs

    def drop_swapped(self, req: Request) -> None:
        """Give back a swapped-out ``req``'s CPU blocks (aborted while swapped: never loaded back)."""
        self.swap.drop(req.req_id)

    # ------------------------------------------------------------ accounting
    def window_pages_held(self) -> int:
        """Blocks held outside the tables (window pages, sim/kv/window_pages.py): none here."""
        return 0

    def window_pages_logical(self) -> int:
        """``window_pages_held`` counting a page once for each request holding it: none here."""
        return 0

    def memory_slots(self) -> tuple[int, int, int, int, int]:
        """(token_states, reserved, internal_fragmentation, external_fragmentation, free), in token slots
        (window pages count whole as token states)."""
        bs = self.block_size
        free = self.pool.num_free
        allocated = (self.num_blocks - free) * bs   # used = total - free
        token_states = self._held_tokens + self.window_pages_held() * bs
        internal = self._beyond_final
        reserved = allocated - token_states - internal
        return token_states, reserved, internal, 0, free * bs

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    def check_integrity(self, extra_holders: Counter[int] | None = None) -> None:
        """The pool's ref counts against the tables (and ``extra_holders``: blocks held outside them), the
        sharing counters, the swap space and the slot accounting."""
        holders: Counter[int] = Counter() if extra_holders is None else Counter(extra_holders)
        for table in self.block_tables.values():
            holders.update(table)
        self._check_sharing(holders)   # adds the forked sequences' tables to the holders
        self.pool.check_integrity(holders)
        self.swap.check_integrity()
        ts, reserved, internal, external, free = self.memory_slots()
        assert min(ts, reserved, internal, external, free) >= 0, f"negative slot count {(ts, reserved, internal)}"
        assert ts + reserved + internal + external + free == self.capacity_slots, "slot accounting does not add up"
