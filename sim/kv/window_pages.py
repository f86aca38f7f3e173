"""WindowedKVCacheManager: the paged cache of a model with local-attention layers (a sliding window, or
Llama 4's chunks), as vLLM's hybrid KV cache manager keeps it.

vLLM groups a model's layers into groups of equal size g (``ModelSpec.kv_pages``): one group of its full-
attention layers and ``sliding_groups`` of its local ones (Gemma-3-27B: 10 full and 52 sliding-window
layers, groups of 10: one full group and six sliding ones, the last padded). A block (a page) holds
``block_size`` tokens of one group's layers, so the pool has L / g times the blocks a block of every layer
would give. A request's table is the full group's, as a full-attention model's is (prefix cache, copy
counts and all); beside it each local group holds pages only for the logical blocks the next query still
sees:

    computed c tokens, computing n more:   pages for logical blocks  first .. ceil((c + n) / bs) - 1,
                                           first = first_visible(c) // bs
                                           (a window W: max(0, c - W + 1); chunks of C: (c // C) x C)

(vLLM's ``remove_skipped_blocks``, run before a step allocates: the blocks before ``first`` leave the
window and are freed, then the step's new blocks are taken; sim/executors/local_attention.py). A step that cannot have both its table's
blocks and its window's pages fails as a whole, as in vLLM; the pages that left the window are freed
either way.

With a prefix cache the pages are cached as vLLM caches them: a full block's pages join the cache with its
table block (page j under ``page_hashes``: its block's hash mixed with j), and a prefix hit takes the hit's
window pages from the cache, shared by reference count. A hit must hold the pages its next query sees, so
it is the full group's run cut by vLLM's rule for the local layers (``window_hit``; vLLM's
``SlidingWindowManager`` and ``ChunkedLocalAttentionManager.find_longest_cache_hit``; a block counts as
cached where every one of its ``sliding_groups`` pages is):

    window W: the rightmost run of n = ceil((W - 1) / bs) cached blocks ending at or before the full run's
              end k, the hit ending with it; with none, the run of cached blocks that starts at block 0
    chunks C: from the block where the chunk holding token k x bs starts, the cached blocks that follow

Approximations (docs/architecture.md): a decode inside its table's last block makes no manager call (the
scheduler's fast path), so pages that leave the window then are freed, and a block it fills is cached with
its pages, at the request's next block boundary: a step late where the window is a whole number of blocks
(vLLM frees and caches them at once). Those a prefill chunk leaves behind are freed as the next step is
planned, as in vLLM.

Invariants (``check_integrity``, besides the manager's): each running request holds exactly
``sliding_groups`` distinct pages per logical block of its window span, a page's ref count the number of
requests holding it (one without a prefix cache); the distinct pages count as used blocks and token slots
of KV, each request's as logical blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from sim.executors.local_attention import LocalAttention
from sim.kv.manager import KVCacheManager, WindowMoves
from sim.kv.prefix_cache import NO_BLOCKS
from sim.request import Request

_PAGE_STEP = np.uint64(0x9E3779B97F4A7C15)
_M64 = (1 << 64) - 1
FEW_PAGES = 16   # up to this many pages are hashed and cached in plain Python (else numpy)


def window_hit_end(cached: Sequence[bool], need: int) -> int:
    """The end (in blocks) of vLLM's sliding-window hit over blocks whose cached flags are ``cached``: right to
    left, as vLLM searches, the first run of ``need`` cached blocks ends it; with none, the cached blocks from
    block 0 (fewer than the window needs)."""
    run = 0
    for i in range(len(cached) - 1, -1, -1):
        if not cached[i]:
            run = 0
            continue
        run += 1
        if run >= need:
            return i + run
    return run


def page_hashes(block_hashes: np.ndarray, groups: int) -> np.ndarray:
    """The hashes the window pages of blocks with ``block_hashes`` (int64) are cached under, ``(blocks,
    groups)`` int64: page j's is splitmix64's finalizer of (its block's hash + (j + 1) x 0x9E3779B97F4A7C15)
    mod 2**64 (core.c ``page_hash``: the same values)."""
    x = block_hashes.astype(np.int64).view(np.uint64)[:, None] + _PAGE_STEP * np.arange(1, groups + 1, dtype=np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x.view(np.int64)


def page_hashes_few(block_hashes: list[int], groups: int) -> list[int]:
    """``page_hashes(...).ravel()`` in plain Python, for a few blocks (the same values)."""
    out = []
    for h in block_hashes:
        for g in range(1, groups + 1):
            x = (h + 0x9E3779B97F4A7C15 * g) & _M64
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
            x ^= x >> 31
            out.append(x - (1 << 64) if x >> 63 else x)
    return out


class WindowedKVCacheManager(WindowMoves, KVCacheManager):
    """The paged manager with each request's window pages beside its table (the module docstring). ``local``:
    what the local layers see; ``sliding_groups``: pages a logical block takes in the window; ``step_tokens``:
    the most tokens one step computes for a request (the prefill budget, else its whole KV), for
    ``can_ever_fit``."""

    def __init__(self, num_blocks: int, block_size: int, local: LocalAttention, sliding_groups: int,
                 step_tokens: int, prefix_caching: bool = False) -> None:
        super().__init__(num_blocks, block_size, 0, prefix_caching)
        self.local, self.sliding_groups, self.step_tokens = local, sliding_groups, step_tokens
        self.window_pages: dict[int, list[int]] = {}   # req_id -> pages, oldest logical block first
        self._window_first: dict[int, int] = {}         # req_id -> the first logical block they hold
        self._num_pages = 0   # distinct pages held (a page shared by prefix hits counts once)
        self._pages_cached_upto: dict[int, int] = {}   # req_id -> logical blocks whose pages were offered to the cache
        self._whole_hits: dict[int, tuple[int, int]] = {}   # req_id -> (full run, evictions then): window_hit was it
        # requests whose last step computed several tokens (a prefill chunk): the pages it leaves behind the
        # window are freed when the next step is scheduled (``free_stale_pages``), as vLLM frees them then
        self.stale_pages: dict[int, Request] = {}
        # a decode inside its table's last block makes no call (the scheduler's fast path and decode lane):
        # the window's pages change at the next block boundary's call (vLLM frees a page the step its block
        # leaves the window: here, for a window or chunk that is a whole number of blocks, one step later)

    # ------------------------------------------------------------ sizing
    def _span(self, computed: int, end: int) -> tuple[int, int]:
        """Logical blocks ``first .. stop - 1`` whose window pages a step needs, from ``computed`` tokens to
        ``end``."""
        bs = self.block_size
        return self.local.first_visible(computed) // bs, -(-end // bs)

    def window_blocks_max(self, max_kv: int | np.ndarray) -> int | np.ndarray:
        """The most logical blocks a request of ``max_kv`` KV tokens ever holds window pages for (each of an
        array of them): a step computes at most ``step_tokens`` tokens, whose first query sees at most
        ``span - 1`` before it (vLLM's bound for its startup check, plus a block for alignment)."""
        bs = self.block_size
        return np.minimum(-(-max_kv // bs), -(-(self.local.span - 1 + np.minimum(self.step_tokens, max_kv)) // bs) + 1)

    def can_ever_fit(self, req: Request) -> bool:
        return bool(self.blocks_for(req.max_kv_tokens)
                    + self.sliding_groups * self.window_blocks_max(req.max_kv_tokens) <= self.num_blocks)

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """The table's new blocks and the window's new pages, less the pages that leave the window."""
        first, stop = self._span(req.num_computed_tokens, req.num_computed_tokens + num_new_tokens)
        freed, taken = self._window_change(req.req_id, first, stop)
        return max(0, super().blocks_needed(req, num_new_tokens) + taken - freed)

    def _window_change(self, rid: int, first: int, stop: int, gone: Counter[int] | None = None) -> tuple[int, int]:
        """(blocks freed, pages taken) when ``rid``'s window moves to logical blocks ``first .. stop - 1``: a
        page shared by prefix hits frees its block only with its last holder (``gone``: references other
        requests drop before this one, in the same pass; it gains this one's)."""
        pages = self.window_pages.get(rid)
        have = len(pages) // self.sliding_groups if pages else 0
        at = self._window_first.get(rid, first)
        dropped = min(max(0, first - at), have)
        held_to = at + have if have else first
        taken = self.sliding_groups * max(0, stop - max(first, held_to))
        leaving = self.sliding_groups * dropped
        if not leaving or self.prefix_cache is None:
            return leaving, taken
        refs = self.pool.refs
        if gone is None:
            return int(np.count_nonzero(refs[pages[:leaving]] == 1)), taken
        freed = 0
        for p in pages[:leaving]:
            gone[p] += 1
            freed += int(refs[p]) == gone[p]
        return freed, taken

    # ------------------------------------------------------------ the decode lane's block boundaries
    def boundary_need(self, reqs: list[Request], at: list[int], computed: list[int]) -> int:
        """The most free blocks the boundaries' ``allocate_slots(req, 1)`` need at any point, in batch order:
        each takes a table block and its window's new pages and first gives back the pages that left it."""
        most = total = 0
        gone: Counter[int] = Counter()
        for i, c in zip(at, computed):
            first, stop = self._span(c, c + 1)
            freed, taken = self._window_change(reqs[i].req_id, first, stop, gone)
            total += 1 + taken - freed   # (its drops come before its allocation)
            most = max(most, total)
        return most

    # ------------------------------------------------------------ allocation
    def allocate_slots(self, req: Request, num_new_tokens: int, cached: Sequence[int] | np.ndarray | None = None,
                       loaded: int = 0, drafts: int = 0) -> bool:
        """The manager's ``allocate_slots``, with the window's pages: those behind the window are freed first,
        then the step takes its table's blocks and its window's new pages, or nothing."""
        if loaded or drafts:
            raise ValueError("window pages are not modelled with a host tier or speculative drafts")
        bs = self.block_size
        rid = req.req_id
        hits = len(cached) if cached is not None else 0
        computed = hits * bs if hits else req.num_computed_tokens
        first, stop = self._span(computed, computed + num_new_tokens)
        self._drop_before(rid, first)   # (vLLM frees them whether or not the step fits)
        hit_pages = NO_BLOCKS
        if hits:   # the hit's pages its next query sees come from the cache (``window_hit`` found them all)
            hit_pages = self._cached_pages(self._hashes_upto(req, hits), first, hits).ravel()
            if np.count_nonzero(hit_pages < 0):
                raise AssertionError(f"request {rid}: a window page of its prefix hit is not cached")
            blocks = np.asarray(cached, dtype=np.int64)
            table_need = -(-(hits * bs + num_new_tokens) // bs) - hits + int(np.count_nonzero(
                self.pool.refs[blocks] == 0))
            revived = int(np.count_nonzero(self.pool.refs[hit_pages] == 0))
            new_pages = self.sliding_groups * (stop - max(first, hits))
        else:
            table_need = max(0, -(-(computed + num_new_tokens) // bs) - len(self.block_tables.get(rid, ())))
            revived = 0
            new_pages = self._window_change(rid, first, stop)[1]
        if table_need + revived + new_pages > self.pool.num_free:
            return False
        if hits:
            self._whole_hits.pop(rid, None)
            self._pages_cached_upto[rid] = hits   # (the hit's pages are cached under these very hashes)
        if len(hit_pages):   # (taken from the free queue before any allocation can evict them, as vLLM does)
            self.pool.incref_distinct(hit_pages)
            self.window_pages[rid] = hit_pages.tolist()
            self._window_first[rid] = first
            self._num_pages += revived
            self._logical_blocks += len(hit_pages)
        if not super().allocate_slots(req, num_new_tokens, cached):
            raise AssertionError(f"request {rid}: its table did not grow though {table_need} blocks were free")
        if num_new_tokens > 1:   # its next query sees past this chunk: the pages it leaves go next step
            self.stale_pages[rid] = req
        if new_pages:
            pages = self.window_pages.get(rid)
            if not pages:   # (a first step, or one past a gap: every held page left the window)
                pages = self.window_pages[rid] = []
                self._window_first[rid] = stop - new_pages // self.sliding_groups
            pages.extend(self.pool.allocate(new_pages))
            self._num_pages += new_pages
            self._logical_blocks += new_pages
        if new_pages or revived:
            self._note_peaks(False)
        if self.prefix_cache is not None:
            self._cache_pages(req, computed + num_new_tokens)
        return True

    # ------------------------------------------------------------ the prefix cache
    def _cached_pages(self, hashes: list[int], lo: int, hi: int) -> np.ndarray:
        """The pages cached for logical blocks ``lo .. hi - 1`` (their table hashes ``hashes``), ``(hi - lo,
        sliding_groups)``: -1 where a page is not."""
        if hi <= lo:
            return NO_BLOCKS.reshape(0, self.sliding_groups)
        keys = page_hashes(np.array(hashes[lo:hi], dtype=np.int64), self.sliding_groups)
        return self.prefix_cache.find_each(keys.ravel()).reshape(hi - lo, self.sliding_groups)

    def window_hit(self, hashes: list[int], full: int) -> int:
        """The prefix hit, in blocks, given the full group's run of ``full`` cached blocks (the module
        docstring's rule); ``hashes``: the request's block hashes, at least ``full`` of them."""
        if full <= 0:
            return 0
        bs, span = self.block_size, self.local.span
        if self.local.chunked:
            start = min(full, (full * bs // span) * span // bs)
            have = (self._cached_pages(hashes, start, full) >= 0).all(axis=1)
            return start + (len(have) if have.all() else int(have.argmin()))
        need = -(-(span - 1) // bs)
        if 0 < need <= full and (self._cached_pages(hashes, full - need, full) >= 0).all():
            return full   # (the usual case: the window's blocks before the hit's end are cached)
        return window_hit_end((self._cached_pages(hashes, 0, full) >= 0).all(axis=1).tolist(), need)

    def match_prefix_blocks(self, req: Request) -> np.ndarray:
        """The full group's cached run (the manager's), cut to where the window's pages are cached too (a
        waiting request matched again finds its whole run still a hit where nothing was evicted since)."""
        run = super().match_prefix_blocks(req)
        full = len(run)
        if not full:
            return run
        seen = (full, self.prefix_cache.num_evicted)
        if self._whole_hits.get(req.req_id) == seen:
            return run
        hit = self.window_hit(self._hashes_upto(req, full), full)
        if hit == full:
            self._whole_hits[req.req_id] = seen
        return run[:hit]

    def _cache_pages(self, req: Request, num_tokens: int) -> None:
        """Offer the pages of ``req``'s full blocks among its first ``num_tokens`` to the cache (those it still
        holds: pages that left the window before their block was full are not cached, as vLLM skips them)."""
        rid = req.req_id
        pages = self.window_pages.get(rid)
        full = num_tokens // self.block_size
        done = self._pages_cached_upto.get(rid, 0)
        if full <= done:
            return
        self._pages_cached_upto[rid] = full
        if not pages:
            return
        g = self.sliding_groups
        at = self._window_first[rid]
        lo, hi = max(done, at), min(full, at + len(pages) // g)
        if hi <= lo:
            return
        held = pages[(lo - at) * g:(hi - at) * g]
        hashes = self._hashes_upto(req, hi)[lo:hi]
        if len(held) <= FEW_PAGES:   # (a decode's block boundary: one block's pages, one at a time)
            insert = self.prefix_cache.insert
            for b, h in zip(held, page_hashes_few(hashes, g)):
                insert(b, h)
            return
        self.prefix_cache.insert_run(held, page_hashes(np.array(hashes, dtype=np.int64), g).ravel().tolist())

    def _drop_before(self, rid: int, first: int) -> None:
        """Free the pages of ``rid``'s logical blocks before ``first`` (they left the window), as ``_give_back`` orders them."""
        pages = self.window_pages.get(rid)
        if not pages:
            return
        at = self._window_first[rid]
        gone = min(first - at, len(pages) // self.sliding_groups)
        if gone <= 0:
            return
        cut = gone * self.sliding_groups
        self._give_back(pages[:cut])
        del pages[:cut]
        self._window_first[rid] = at + gone

    def free_stale_pages(self) -> None:
        """Free the pages the last step's prefill chunks left behind the window (the scheduler calls it as it
        plans the next step, before any allocation, where vLLM frees them; the decodes' fast path would only
        at their next block boundary)."""
        bs = self.block_size
        for rid, req in self.stale_pages.items():
            self._drop_before(rid, self.local.first_visible(req.num_computed_tokens) // bs)
        self.stale_pages.clear()

    def free(self, req: Request) -> None:
        """Release the table (the manager's ``free``) and every window page."""
        rid = req.req_id
        self.stale_pages.pop(rid, None)
        if self.prefix_cache is not None and rid in self.block_tables:
            self._cache_pages(req, req.num_computed_tokens)   # (as the table's full blocks are, in ``free``)
        super().free(req)
        self._pages_cached_upto.pop(rid, None)
        self._whole_hits.pop(rid, None)
        pages = self.window_pages.pop(rid, None)
        self._window_first.pop(rid, None)
        if pages:
            self._give_back(pages)

    def _give_back(self, pages: list[int]) -> None:
        """Drop one reference to each of ``pages`` (a request's, oldest logical block first), group by group
        and each group's last block first, as vLLM's managers free theirs: those left with none join the free
        queue in that order (cached ones stay findable there until evicted)."""
        blocks = np.array(pages, dtype=np.int64).reshape(-1, self.sliding_groups)[::-1].T.ravel()
        self._logical_blocks -= len(blocks)
        if self.prefix_cache is None:   # (each page one request's)
            self.pool.free_last_refs(blocks)
            self._num_pages -= len(blocks)
            return
        self._num_pages -= int(np.count_nonzero(self.pool.refs[blocks] == 1))
        self.pool.free(blocks)

    # ------------------------------------------------------------ accounting
    def window_pages_held(self) -> int:
        """Sliding-window pages held by every request (distinct pages)."""
        return self._num_pages

    def window_pages_logical(self) -> int:
        """Sliding-window pages held, a page once for each request holding it."""
        return sum(map(len, self.window_pages.values()))

    def check_integrity(self) -> None:
        """The manager's invariants with the pages as holders and logical blocks, and each request's pages
        a whole number of logical blocks, ending at its table's end."""
        pages: Counter[int] = Counter()
        for rid, held in self.window_pages.items():
            assert len(held) % self.sliding_groups == 0, f"request {rid}: {len(held)} window pages"
            table = self.block_tables.get(rid)
            assert table is not None, f"request {rid} holds window pages without a table"
            if held:
                assert self._window_first[rid] + len(held) // self.sliding_groups == len(table), (
                    f"request {rid}: window pages end at a logical block other than its table's last")
            pages.update(held)
            assert len(set(held)) == len(held), f"request {rid} holds a window page twice"
        assert len(pages) == self._num_pages, "window page count differs from the pages held"
        assert self.prefix_cache is not None or all(c == 1 for c in pages.values()), "a window page is shared"
        super().check_integrity(extra_holders=pages)
