"""SlidingKVCacheManager: the paged cache of a model whose every layer attends a sliding window (Mistral-7B-v0.1
and its fine-tunes: 32 layers, a 4,096-token window), as vLLM's hybrid KV cache manager keeps it.

Every layer is of one kind, so vLLM keeps one group of them all (``SlidingWindowManager``): a block holds
``block_size`` tokens of every layer, as a full-attention model's does, but a request's table keeps only the
blocks its next query still sees. Those behind the window are freed and their places in the table hold a
null entry (-1 here, vLLM's ``null_block``); the table keeps its length, so a token's logical block is
still its position // block_size:

    computed c tokens:   table = [-1] x first + [real blocks first .. ceil(c / bs) - 1]
                         first = first_visible(c) // bs     (a window W: max(0, c - W + 1); chunks of C:
                                                             (c // C) x C; sim/executors/local_attention.py)

(vLLM's ``remove_skipped_blocks``, run as a step allocates, before its new blocks: those leaving are freed
last block first, whether or not the step fits). A request never holds more than the window and one step's
tokens, so a long context fits where a full-attention model's would not.

With a prefix cache, full blocks join the cache as they fill (null entries skipped), and a hit is vLLM's
``find_longest_cache_hit`` for one sliding group: scanning the prompt's blocks from the last one down, the
first run of n = ceil((W - 1) / bs) cached blocks ends the hit, and everything before the run is null;
with no such run, the run of cached blocks from block 0 (chunks of C: from the block where the chunk of the
hit's end starts, the cached blocks that follow).

Approximations (as the hybrid manager's, sim/kv/window_pages.py): a decode inside its table's last block
makes no manager call (the scheduler's fast path), so blocks that leave the window meanwhile are freed at
its next block boundary; those a prefill chunk leaves behind are freed as the next step is planned.

Where no request outgrows the window (its prompt and output within ``span`` tokens), nothing ever leaves it
and a hit is the cached run from block 0: this manager then does exactly what ``KVCacheManager`` does. The
compiled core keeps the same tables (core.c ``sonly``: ``nulls[i]`` null entries, ``allocate_sliding``,
``drop_nulls``, ``sliding_hit``), with the SimPy loop's results bit for bit.

Invariants (``check_integrity``): each table is nulls then real blocks; a block's ref count is the number of
tables holding it; held token slots are the real blocks' filled slots; logical blocks count real entries.
Swaps, a host tier, forked sequences, drafts, static batching and prefill/decode pools are refused by the
scenario (``scenario._hybrid_manager_problem``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from sim.executors.local_attention import LocalAttention
from sim.kv.manager import KVCacheManager, WindowMoves
from sim.kv.prefix_cache import NO_BLOCKS
from sim.kv.window_pages import window_hit_end
from sim.request import Request

NULL = -1   # a table entry whose block left the window (vLLM's null_block)


class SlidingKVCacheManager(WindowMoves, KVCacheManager):
    """The paged manager with each table cut to the window (the module docstring). ``local``: what every layer
    sees; ``step_tokens``: the most tokens one step computes for a request, for ``can_ever_fit``."""

    def __init__(self, num_blocks: int, block_size: int, local: LocalAttention, step_tokens: int,
                 prefix_caching: bool = False) -> None:
        super().__init__(num_blocks, block_size, 0, prefix_caching)
        self.local, self.step_tokens = local, step_tokens
        self._nulls: dict[int, int] = {}   # req_id -> the null entries that start its table
        # requests whose last step computed several tokens (a prefill chunk): the blocks it leaves behind the
        # window are freed when the next step is scheduled (``free_stale_pages``), as vLLM frees them then
        self.stale_pages: dict[int, Request] = {}

    # ------------------------------------------------------------ sizing
    def _first(self, computed: int) -> int:
        """The first logical block the query after ``computed`` tokens sees."""
        return self.local.first_visible(computed) // self.block_size

    def window_blocks_max(self, max_kv: int | np.ndarray) -> int | np.ndarray:
        """The most blocks a request of ``max_kv`` KV tokens ever holds (each of an array of them): a step
        computes at most ``step_tokens`` tokens, whose first query sees at most ``span - 1`` before it (plus a
        block for alignment)."""
        bs = self.block_size
        return np.minimum(-(-max_kv // bs), -(-(self.local.span - 1 + np.minimum(self.step_tokens, max_kv)) // bs) + 1)

    def can_ever_fit(self, req: Request) -> bool:
        return bool(self.window_blocks_max(req.max_kv_tokens) <= self.num_blocks)

    def _leaving(self, rid: int, first: int, gone: Counter[int] | None = None) -> int:
        """Blocks freed when ``rid``'s window moves to start at logical block ``first`` (a block shared by
        prefix hits frees only with its last holder; ``gone``: references other requests drop before this
        one, in the same pass; it gains this one's)."""
        table = self.block_tables.get(rid)
        if not table:
            return 0
        nulls = self._nulls.get(rid, 0)
        stop = min(first, len(table))
        if stop <= nulls:
            return 0
        if self.prefix_cache is None:
            return stop - nulls
        refs = self.pool.refs
        if gone is None:
            return int(np.count_nonzero(refs[np.array(table[nulls:stop], dtype=np.int64)] == 1))
        freed = 0
        for b in table[nulls:stop]:
            gone[b] += 1
            freed += int(refs[b]) == gone[b]
        return freed

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """The table's new blocks, less those that leave the window first."""
        computed = req.num_computed_tokens
        return max(0, super().blocks_needed(req, num_new_tokens) - self._leaving(req.req_id, self._first(computed)))

    # ------------------------------------------------------------ the decode lane's block boundaries
    def boundary_need(self, reqs: list[Request], at: list[int], computed: list[int]) -> int:
        """The most free blocks the boundaries' ``allocate_slots(req, 1)`` need at any point, in batch order:
        each first gives back the blocks that left its window, then takes one."""
        most = total = 0
        gone: Counter[int] = Counter()
        for i, c in zip(at, computed):
            total += 1 - self._leaving(reqs[i].req_id, self._first(c), gone)
            most = max(most, total)
        return most

    # ------------------------------------------------------------ allocation
    def allocate_slots(self, req: Request, num_new_tokens: int, cached: Sequence[int] | np.ndarray | None = None,
                       loaded: int = 0, drafts: int = 0) -> bool:
        """Free the blocks behind the window (vLLM frees them whether or not the step fits), then grow the
        table for ``num_new_tokens`` more tokens, or take a prefix hit (``cached``: ``match_prefix_blocks``,
        nulls first) and the blocks after it; False, nothing else done, where blocks run out."""
        if loaded or drafts:
            raise ValueError("a sliding-window model's blocks are not modelled with a host tier or drafts")
        if cached is not None and len(cached):
            return self._allocate_hit(req, num_new_tokens, np.asarray(cached, dtype=np.int64))
        rid = req.req_id
        table = self.block_tables.get(rid)
        first = self._first(req.num_computed_tokens)
        if table and first > self._nulls.get(rid, 0):   # blocks leave the window
            if self.prefix_cache is not None:   # (a block a decode filled joins the cache before it can leave)
                self._cache_full_blocks(req, table, req.num_computed_tokens)
            self._drop_before(req, first)
        if not super().allocate_slots(req, num_new_tokens):   # (the table grows as a full-attention one)
            return False
        if num_new_tokens > 1:   # its next query sees past this chunk: what it leaves goes next step
            self.stale_pages[rid] = req
        return True

    def _allocate_hit(self, req: Request, num_new_tokens: int, cached: np.ndarray) -> bool:
        """A fresh table from a prefix hit: its null entries, the cached blocks the next query sees (ref counts
        up), then fresh blocks for the new tokens."""
        bs = self.block_size
        hits = len(cached)
        blocks = cached[cached >= 0]
        revive = int(np.count_nonzero(self.pool.refs[blocks] == 0))
        need = -(-(hits * bs + num_new_tokens) // bs) - hits
        if need + revive > self.pool.num_free:
            return False
        self._held_tokens += revive * bs
        self.pool.incref_distinct(blocks)
        rid = req.req_id
        table = self.block_tables[rid] = cached.tolist()
        self._nulls[rid] = hits - len(blocks)
        if need > 0:
            table.extend(self.pool.allocate(need))
        req.num_computed_tokens = hits * bs
        self._first_lookup(req, hits * bs)
        self._note_table(req, table, self._nulls[rid])   # (the null entries hold nothing)
        self._cached_upto[rid] = hits   # (the hit's blocks are cached under these very hashes)
        if num_new_tokens > 1:
            self.stale_pages[rid] = req
        self._cache_full_blocks(req, table, req.num_computed_tokens + num_new_tokens)
        return True

    def _cache_full_blocks(self, req: Request, table: list[int], num_tokens: int) -> None:
        """The manager's, from past the null entries (they lead the table, before any full block to cache)."""
        nulls = self._nulls.get(req.req_id, 0)
        if self._cached_upto.get(req.req_id, 0) < nulls:
            self._cached_upto[req.req_id] = nulls
        super()._cache_full_blocks(req, table, num_tokens)

    def _drop_before(self, req: Request, first: int) -> None:
        """The blocks of ``req``'s logical blocks before ``first`` leave the window: freed, last first (vLLM's
        ``remove_skipped_blocks``), their entries null."""
        rid = req.req_id
        table = self.block_tables.get(rid)
        if not table:
            return
        nulls = self._nulls.get(rid, 0)
        stop = min(first, len(table))
        if stop <= nulls:
            return
        gone = np.array(table[nulls:stop][::-1], dtype=np.int64)
        table[nulls:stop] = [NULL] * (stop - nulls)
        self._nulls[rid] = stop
        if req.prefix_group >= 0:
            self._unref_prefix(gone, req, nulls, stop)
        bs = self.block_size
        self._logical_blocks -= len(gone)
        if self.prefix_cache is None:   # (each block one request's, every slot of it filled)
            self._held_tokens -= bs * len(gone)
            self.pool.free_last_refs(gone)
            return
        self._held_tokens -= bs * int(np.count_nonzero(self.pool.refs[gone] == 1))
        self.pool.free(gone)

    def _unref_prefix(self, blocks: np.ndarray, req: Request, lo: int, hi: int) -> None:
        """Shared-prefix region counters: ``blocks`` (those of logical blocks ``lo .. hi - 1``, last first)
        leave ``req``'s table."""
        refs = self._prefix_refs
        inside = req.prefix_len // self.block_size
        for i, b in zip(range(hi - 1, lo - 1, -1), blocks.tolist()):
            if i < inside:
                refs[b] -= 1
                self._prefix_logical -= 1
                if not refs[b]:
                    del refs[b]

    def free_stale_pages(self) -> None:
        """Free the blocks the last step's prefill chunks left behind the window (the scheduler calls it as
        it plans the next step, before any allocation)."""
        for req in self.stale_pages.values():
            self._drop_before(req, self._first(req.num_computed_tokens))
        self.stale_pages.clear()

    # ------------------------------------------------------------ the prefix cache
    def match_prefix_blocks(self, req: Request) -> np.ndarray:
        """The prefix hit of a request starting from nothing (the module docstring's rule), its null entries
        first; at least one token is left to compute."""
        if self.prefix_cache is None or req.num_computed_tokens or self.block_tables.get(req.req_id):
            return NO_BLOCKS
        bs = self.block_size
        max_blocks = (req.prompt_len + req.num_generated - 1) // bs
        if max_blocks <= 0:
            return NO_BLOCKS
        hashes = self._hashes_upto(req, max_blocks)
        found = self.prefix_cache.find_each(np.array(hashes[:max_blocks], dtype=np.int64))
        span = self.local.span
        if self.local.chunked:   # (vLLM's ChunkedLocalAttentionManager: from the chunk of the end on)
            start = min(max_blocks, (max_blocks * bs // span) * span // bs)
            miss = np.flatnonzero(found[start:] < 0)
            end = start + (int(miss[0]) if len(miss) else max_blocks - start)
        else:
            end = window_hit_end((found >= 0).tolist(), -(-(span - 1) // bs))
        hit = found[:end].copy()
        hit[:self._first(end * bs)] = NULL
        return hit

    # ------------------------------------------------------------ release
    def free(self, req: Request) -> None:
        """Release the table's blocks, tail first (its full computed blocks cached first); null entries hold
        nothing."""
        rid = req.req_id
        table = self.block_tables.get(rid)
        if table is None:
            return
        self.stale_pages.pop(rid, None)
        if self.prefix_cache is not None:
            self._cache_full_blocks(req, table, req.num_computed_tokens)
        nulls = self._nulls.pop(rid, 0)
        blocks = np.array(table[nulls:][::-1], dtype=np.int64)
        if req.prefix_group >= 0:
            self._unref_prefix(blocks, req, nulls, len(table))
        bs = self.block_size
        fill = np.clip(req.num_computed_tokens - np.arange(len(table) - 1, nulls - 1, -1) * bs, 0, bs)
        self._logical_blocks -= len(blocks)
        if self.prefix_cache is None:
            self._held_tokens -= int(fill.sum())
            self.pool.free_last_refs(blocks)
        else:
            self._held_tokens -= int(fill[self.pool.refs[blocks] == 1].sum())
            self.pool.free(blocks)
        del self.block_tables[rid]
        self._beyond_final -= self._beyond.pop(rid, 0)
        self._cached_upto.pop(rid, None)
        self._owners.pop(rid, None)
        if req.num_generated >= req.output_len:
            self._hashes.pop(rid, None)

    # ------------------------------------------------------------ accounting
    def check_integrity(self, extra_holders: Counter[int] | None = None) -> None:
        """Tables are nulls then real blocks; ref counts, held slots and logical blocks recomputed from the
        real entries; the pool, the prefix cache and the slot accounting."""
        bs = self.block_size
        holders: Counter[int] = Counter()
        fill: dict[int, int] = {}
        logical = 0
        for rid, table in self.block_tables.items():
            nulls = self._nulls.get(rid, 0)
            assert all(b == NULL for b in table[:nulls]) and all(b >= 0 for b in table[nulls:]), (
                f"request {rid}: its table is not null entries then blocks")
            if not table:
                continue
            req = self._owners.get(rid)
            assert req is not None, f"table of request {rid} has no owner"
            for i in range(nulls, len(table)):
                f = max(0, min(bs, req.num_computed_tokens - i * bs))
                assert fill.setdefault(table[i], f) == f, f"block {table[i]} filled differently by its holders"
            holders.update(table[nulls:])
            logical += len(table) - nulls
        assert sum(fill.values()) == self._held_tokens, (
            f"held slots {self._held_tokens} != {sum(fill.values())} recomputed from the tables")
        assert logical == self._logical_blocks, f"logical blocks {self._logical_blocks} != {logical}"
        if self.prefix_cache is not None:
            self.prefix_cache.check_integrity()
        self.pool.check_integrity(holders)
        ts, reserved, internal, external, free = self.memory_slots()
        assert min(ts, reserved, internal, external, free) >= 0, f"negative slot count {(ts, reserved, internal)}"
        assert ts + reserved + internal + external + free == self.capacity_slots, "slot accounting does not add up"
