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

Approximations (docs/architecture.md): window pages are a request's own, never cached nor shared, so a
prefix-cache hit is decided by the full group's blocks (vLLM also needs the window's pages cached, and
shares them between requests of one prefix), and the hit's window pages are taken fresh. A decode inside
its table's last block makes no manager call (the scheduler's fast path), so pages that leave the window
then are freed at the request's next block boundary: a step late where the window is a whole number of
blocks (vLLM frees them at once). Those a prefill chunk leaves behind are freed as the next step is
planned, as in vLLM.

Invariants (``check_integrity``, besides the manager's): each running request holds exactly
``sliding_groups`` pages per logical block of its window span, every page held by one request with ref
count 1; the pages count as used and logical blocks and as token slots of KV.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from sim.executors.local_attention import LocalAttention
from sim.kv.manager import KVCacheManager
from sim.request import Request


class WindowedKVCacheManager(KVCacheManager):
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
        self._num_pages = 0
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
        dropped, taken = self._window_change(req.req_id, first, stop)
        return max(0, super().blocks_needed(req, num_new_tokens) + taken - dropped)

    def _window_change(self, rid: int, first: int, stop: int) -> tuple[int, int]:
        """(pages freed, pages taken) when ``rid``'s window moves to logical blocks ``first .. stop - 1``."""
        pages = self.window_pages.get(rid)
        have = len(pages) // self.sliding_groups if pages else 0
        at = self._window_first.get(rid, first)
        dropped = min(max(0, first - at), have)
        held_to = at + have if have else first
        return self.sliding_groups * dropped, self.sliding_groups * max(0, stop - max(first, held_to))

    # ------------------------------------------------------------ the decode lane's block boundaries
    def boundary_need(self, reqs: list[Request], at: list[int], computed: list[int]) -> int:
        """The most free blocks the boundaries' ``allocate_slots(req, 1)`` need at any point, in batch order:
        each takes a table block and its window's new pages and first gives back the pages that left it."""
        most = total = 0
        for i, c in zip(at, computed):
            first, stop = self._span(c, c + 1)
            dropped, taken = self._window_change(reqs[i].req_id, first, stop)
            total += 1 + taken - dropped   # (its drops come before its allocation)
            most = max(most, total)
        return most

    def grow_full_tables(self, reqs: list[Request], at: list[int], computed: list[int], finals: list[int]) -> bool:
        """Not here: the boundaries go through ``allocate_slots``, which moves the windows."""
        return False

    def grow_lane(self, lane) -> bool:
        """Not here: the boundaries go through ``allocate_slots``, which moves the windows."""
        return False

    # ------------------------------------------------------------ allocation
    def allocate_slots(self, req: Request, num_new_tokens: int, cached: Sequence[int] | np.ndarray | None = None,
                       loaded: int = 0, drafts: int = 0) -> bool:
        """The manager's ``allocate_slots``, with the window's pages: those behind the window are freed first,
        then the step takes its table's blocks and its window's new pages, or nothing."""
        if loaded or drafts:
            raise ValueError("window pages are not modelled with a host tier or speculative drafts")
        bs = self.block_size
        hits = len(cached) if cached is not None else 0
        computed = hits * bs if hits else req.num_computed_tokens
        first, stop = self._span(computed, computed + num_new_tokens)
        self._drop_before(req.req_id, first)   # (vLLM frees them whether or not the step fits)
        new_pages = self._window_change(req.req_id, first, stop)[1]
        if hits:
            blocks = np.asarray(cached, dtype=np.int64)
            table_need = -(-(hits * bs + num_new_tokens) // bs) - hits + int(np.count_nonzero(
                self.pool.refs[blocks] == 0))
        else:
            table_need = max(0, -(-(computed + num_new_tokens) // bs) - len(self.block_tables.get(req.req_id, ())))
        if table_need + new_pages > self.pool.num_free:
            return False
        if not super().allocate_slots(req, num_new_tokens, cached):
            raise AssertionError(f"request {req.req_id}: its table did not grow though {table_need} blocks were free")
        if num_new_tokens > 1:   # its next query sees past this chunk: the pages it leaves go next step
            self.stale_pages[req.req_id] = req
        if new_pages:
            pages = self.window_pages.get(req.req_id)
            if not pages:   # (a first step, or one past a gap: every held page left the window)
                pages = self.window_pages[req.req_id] = []
                self._window_first[req.req_id] = stop - new_pages // self.sliding_groups
            pages.extend(self.pool.allocate(new_pages))
            self._num_pages += new_pages
            self._logical_blocks += new_pages
            self._note_peaks(False)
        return True

    def _drop_before(self, rid: int, first: int) -> None:
        """Free the pages of ``rid``'s logical blocks before ``first`` (they left the window), oldest first."""
        pages = self.window_pages.get(rid)
        if not pages:
            return
        at = self._window_first[rid]
        gone = min(first - at, len(pages) // self.sliding_groups)
        if gone <= 0:
            return
        cut = gone * self.sliding_groups
        self.pool.free_last_refs(np.array(pages[:cut][::-1], dtype=np.int64))
        del pages[:cut]
        self._window_first[rid] = at + gone
        self._num_pages -= cut
        self._logical_blocks -= cut

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
        self.stale_pages.pop(req.req_id, None)
        super().free(req)
        pages = self.window_pages.pop(req.req_id, None)
        self._window_first.pop(req.req_id, None)
        if pages:
            self.pool.free_last_refs(np.array(pages[::-1], dtype=np.int64))
            self._num_pages -= len(pages)
            self._logical_blocks -= len(pages)

    # ------------------------------------------------------------ accounting
    def window_pages_held(self) -> int:
        """Sliding-window pages held by every request."""
        return self._num_pages

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
        assert sum(pages.values()) == self._num_pages, "window page count differs from the pages held"
        assert all(c == 1 for c in pages.values()), "a window page is held twice"
        super().check_integrity(extra_holders=pages)
