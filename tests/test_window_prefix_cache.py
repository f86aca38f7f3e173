"""Window pages in the prefix cache (sim/kv/window_pages.py, as vLLM's hybrid manager caches its sliding and
chunked groups): a hit shares the pages its next query sees, worked by hand; the hit is the longest whose
visible pages are all cached, against a brute-force rule over random cache states; requests leave no page
behind and the counts add up under pressure."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sim.executors.local_attention import LocalAttention
from sim.kv.window_pages import WindowedKVCacheManager, page_hashes, page_hashes_few
from sim.request import Request


def _req(i: int, prompt: int, out: int = 4, plen: int = 0) -> Request:
    return Request(i, 0.0, prompt, out, prefix_group=0 if plen else -1, prefix_len=plen)


def _admit(mgr: WindowedKVCacheManager, req: Request) -> int:
    """Admit ``req`` with its prefix hit and compute its whole prompt in one step; returns the hit in blocks."""
    cached = mgr.match_prefix_blocks(req)
    n = req.prompt_len - len(cached) * mgr.block_size
    assert mgr.allocate_slots(req, n, cached)
    req.num_computed_tokens += n
    mgr.note_computed(n)
    mgr.free_stale_pages()
    mgr.check_integrity()
    return len(cached)


def test_a_hit_shares_the_window_pages_by_hand():
    # blocks of 4 tokens, a window of 8 (a query sees itself and the 7 tokens before it), 2 sliding groups
    mgr = WindowedKVCacheManager(num_blocks=40, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                 step_tokens=1000, prefix_caching=True)
    a = _req(0, 20, plen=16)
    assert _admit(mgr, a) == 0
    # a: 5 table blocks; its prefill held pages for all 5 blocks, then the next query (token 20) sees tokens
    # 13..20: blocks 0-2 left the window, their 6 pages freed (cached, findable), blocks 3-4 keep 4 pages
    assert mgr.pool.num_used == 5 + 4
    b = _req(1, 20, plen=16)
    # b shares a's 16-token prefix: 4 full blocks cached; its first query (token 16) sees tokens 9..16, so the
    # hit needs blocks 2 and 3's pages: block 2's from the free queue, block 3's shared with a
    assert _admit(mgr, b) == 4 and b.num_cached_tokens == 16
    # b then computed tokens 16..19 (a fresh block 4 and its 2 pages) and its next query (token 20) sees
    # 13..20: block 2's pages leave again. Both windows now start at block 3, whose pages they share
    a_pages, b_pages = mgr.window_pages[0], mgr.window_pages[1]
    assert b_pages[:2] == a_pages[:2] and b_pages[2:] != a_pages[2:]
    assert all(mgr.pool.refs[p] == 2 for p in a_pages[:2])
    # used: a's 9, b's new table block, block 4's 2 fresh pages
    assert mgr.pool.num_used == 9 + 1 + 2
    assert mgr.window_pages_held() == 4 + 2 and mgr.window_pages_logical() == 4 + 4
    for r in (a, b):
        mgr.free(r)
    assert mgr.pool.num_used == 0 and mgr.window_pages_held() == 0
    mgr.check_integrity()


def test_a_hit_stops_where_the_window_pages_were_evicted():
    mgr = WindowedKVCacheManager(num_blocks=40, block_size=4, local=LocalAttention(8), sliding_groups=2,
                                 step_tokens=1000, prefix_caching=True)
    a = _req(0, 24, plen=20)
    _admit(mgr, a)
    mgr.free(a)   # every block and page free and cached
    # evict block 4's pages (hash of block 4, both groups): the table's 5 prefix blocks stay cached
    hashes = mgr._hashes_upto(a, 5)
    gone = mgr._cached_pages(hashes, 4, 5).ravel()
    mgr.prefix_cache._on_evict(gone)
    # the full group finds 5 blocks; a hit of 5 would need blocks 3-4's pages, block 4's are gone; the
    # rightmost 2 blocks with their pages end at block 3: a hit of 4 blocks (16 tokens)
    b = _req(1, 24, plen=20)
    assert _admit(mgr, b) == 4 and b.num_cached_tokens == 16
    mgr.free(b)
    mgr.check_integrity()


def _brute_hit(cached: list[bool], full: int, local: LocalAttention, bs: int) -> int:
    """The longest hit of at most ``full`` blocks whose next query (at token hit x bs) finds every block it
    sees cached (the blocks from ``first_visible`` on)."""
    for h in range(full, 0, -1):
        if all(cached[k] for k in range(local.first_visible(h * bs) // bs, h)):
            return h
    return 0


@pytest.mark.parametrize("seed", range(40))
def test_the_hit_is_the_longest_whose_window_is_cached(seed):
    rng = random.Random(seed)
    bs, groups = rng.choice([4, 16]), rng.randint(1, 3)
    local = LocalAttention(rng.randint(1, 6) * bs if rng.random() < 0.5 else rng.randint(2, 90),
                           chunked=rng.random() < 0.3)
    if local.chunked:
        local = LocalAttention(rng.randint(1, 5) * bs, chunked=True)   # (chunks of whole blocks, as vLLM needs)
    mgr = WindowedKVCacheManager(num_blocks=2000, block_size=bs, local=local, sliding_groups=groups,
                                 step_tokens=1000, prefix_caching=True)
    full = rng.randint(0, 30)
    hashes = [rng.getrandbits(63) for _ in range(full)]
    keys = page_hashes(np.array(hashes, dtype=np.int64), groups)
    cached = []
    density = rng.random()
    for k in range(full):   # a block's pages cached all, or some of them (then it counts as missing)
        take = [g for g in range(groups) if rng.random() < density]
        for g in take:
            mgr.prefix_cache.insert(1000 + k * groups + g, int(keys[k, g]))
        cached.append(len(take) == groups)
    assert mgr.window_hit(hashes, full) == _brute_hit(cached, full, local, bs)


@pytest.mark.parametrize("seed", range(8))
def test_shared_prefixes_under_pressure_leave_no_page_behind(seed):
    rng = random.Random(seed)
    bs, groups = 4, rng.randint(1, 3)
    local = LocalAttention(rng.choice([5, 8, 12, 30]), chunked=False) if seed % 2 else LocalAttention(8, True)
    mgr = WindowedKVCacheManager(num_blocks=rng.randint(60, 120), block_size=bs, local=local, sliding_groups=groups,
                                 step_tokens=16, prefix_caching=True)
    waiting = [_req(i, rng.randint(8, 40), rng.randint(1, 12), plen=rng.choice([0, 8, 16, 24]))
               for i in range(30)]
    for r in waiting:
        r.prefix_len = min(r.prefix_len, r.prompt_len)
    running: list[Request] = []
    shared_seen = False
    while waiting or running:
        mgr.free_stale_pages()
        # the decodes at a block boundary, in batch order: the free blocks they need at most, as the decode
        # lane counts them (a shared page that leaves one window frees nothing until its last holder drops it)
        edge = [r for r in running if r.num_computed_tokens >= r.prompt_len and r.num_computed_tokens % bs == 0]
        need = mgr.boundary_need(edge, list(range(len(edge))), [r.num_computed_tokens for r in edge])
        free0, lowest = mgr.pool.num_free, mgr.pool.num_free
        for r in edge:
            if not mgr.allocate_slots(r, 1):
                break
            lowest = min(lowest, mgr.pool.num_free)   # (the step below finds its block and pages taken)
        else:
            assert need == free0 - lowest
        for r in list(running):   # one step each: a prefill chunk of up to 16 tokens, else a decode
            left = r.prompt_len - r.num_computed_tokens
            n = min(16, left) if left > 0 else 1
            if not mgr.allocate_slots(r, n):
                mgr.free(r)   # preempted by recompute
                r.num_computed_tokens = r.num_generated = 0
                running.remove(r)
                waiting.insert(0, r)
                continue
            r.num_computed_tokens += n
            if r.num_computed_tokens >= r.prompt_len:
                r.num_generated += 1
            mgr.note_computed(n)
            if r.num_generated >= r.output_len:
                mgr.free(r)
                running.remove(r)
        if waiting:
            r = waiting[0]
            cached = mgr.match_prefix_blocks(r)
            n = min(16, r.prompt_len - len(cached) * bs)
            if mgr.allocate_slots(r, n, cached):
                waiting.pop(0)
                r.num_computed_tokens += n
                mgr.note_computed(n)
                running.append(r)
            elif not running:
                pytest.fail("a request can never be admitted on an empty pool")
        shared_seen = shared_seen or any(mgr.pool.refs[p] > 1 for ps in mgr.window_pages.values() for p in ps)
        mgr.check_integrity()
    assert mgr.pool.num_used == 0 and mgr.window_pages_held() == 0 and mgr.window_pages_logical() == 0
    assert shared_seen or seed % 2 == 0   # (chunks of 8 with 4-token blocks may never need a shared page)


def test_page_hashes_are_one_function_in_numpy_and_in_python():
    # (core.c's page_hash is checked against them by every run the core and the loop must agree on)
    rng = random.Random(5)
    hashes = [rng.randint(-2**63, 2**63 - 1) for _ in range(50)] + [0, -1, 2**63 - 1, -2**63]
    keys = page_hashes(np.array(hashes, dtype=np.int64), 3)
    assert keys.ravel().tolist() == page_hashes_few(hashes, 3)
    assert len(set(keys.ravel().tolist()) | set(hashes)) == 4 * len(hashes)   # none equals a block's or another's
