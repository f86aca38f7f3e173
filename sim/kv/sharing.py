"""Block sharing for the paged manager: prefix-cache hits, forked sequences (parallel sampling, beam
search) with copy-on-write, and the physical slot accounting that sharing requires.

Representation of a request with k = max(n, beam_width) > 1 sequences:

    prefill (one sequence, the request's own table):   block_tables[req_id] = [4, 9, 2]   (2 partly full)
    first token sampled -> fork: k tables share every block (ref counts +k-1)
        seq 0: [4, 9, 2]   seq 1: [4, 9, 2]   seq 2: [4, 9, 2]      ref(4) = ref(9) = ref(2) = 3
    next decode step, each sequence writes one token into block 2 (partly full, shared): copy-on-write
        seq 0: [4, 9, 7]  (copy 2 -> 7)   seq 1: [4, 9, 5]  (copy 2 -> 5)   seq 2: [4, 9, 2]  (last holder)
        plan.blocks_to_copy = [(2, 7), (2, 5)]

The sequences advance in lockstep: one Request carries ``num_computed_tokens`` for all of them and the
plan has one ScheduledRequest per sequence (same req_id, its own table). ``block_tables[req_id]`` is
always sequence 0's table. Beam search (``beam_width`` > 1) adds, after each sampled token, a seeded
random draw of k parents among the k beams: a parent drawn twice is forked (its table shared again),
a beam never drawn is freed. A preempted group frees every table and comes back as one sequence (its
recompute covers sequence 0's tokens); when it catches up it forks again, the siblings sharing the
prompt's full blocks and getting fresh blocks for their generated tokens (their KV is priced as part
of sequence 0's recompute: the memory is exact, the compute is underestimated).

Physical accounting: ``_held_tokens`` counts KV slots of distinct blocks (a block shared by m tables
counts once): a hit on a free cached block adds block_size, a copy adds the copied slots, and freeing a
table subtracts, per block whose last reference goes, the slots its table had filled.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.kv.host_tier import HostTier
from sim.kv.prefix_cache import NO_BLOCKS, PrefixCache
from sim.request import Request
from sim.workload.tokens import block_hashes, root_hash


@dataclass(slots=True)
class SeqGroup:
    """The k tables of a forked request; ``tables[0]`` is the request's own (``block_tables[req_id]``)."""

    tables: list[list[int]]
    rng: random.Random | None = None   # beam search: draws the surviving beams
    common: int = 0   # every table holds the same first ``common`` blocks (a lower bound: 0 is always true)
    private_tail: bool = False   # every table's last block holds one reference (its own): True only after an
    # allocation gave each table its own last block; a fork or a beam step (copies share blocks) clears it


def seq_width(req: Request) -> int:
    """Sequences (and seats of max_num_seqs) a request occupies once it has forked."""
    return max(req.n, req.beam_width)


class SharingMixin:
    """Mixed into KVCacheManager; uses its pool, block_size, block_tables and slot counters."""

    def _init_sharing(self, prefix_caching: bool, host_blocks: int = 0) -> None:
        self.prefix_cache = PrefixCache(self.pool) if prefix_caching else None
        # CPU copies of the cached blocks (kv_cache.cpu_offload_gib: sim/kv/host_tier.py), under the prefix cache
        self.host = HostTier(host_blocks) if prefix_caching and host_blocks > 0 else None
        self.groups: dict[int, SeqGroup] = {}
        self.copies: list[tuple[int, int]] = []   # copy-on-write pairs of the step being planned
        self._hashes: dict[int, list[int]] = {}   # req_id -> chained hashes of sequence 0's full blocks
        self._cached_upto: dict[int, int] = {}    # req_id -> blocks of its table already offered to the cache
        self._looked_up: set[int] = set()         # requests whose first admission was counted
        # req_id -> tokens each sibling still has to recompute after a re-fork (priced in the next step)
        self.sibling_recompute: dict[int, int] = {}
        self._owners: dict[int, Request] = {}     # req_id -> request, while it holds blocks
        self._logical_blocks = 0                  # sum of table lengths: the blocks without any sharing
        self._prefix_refs: Counter[int] = Counter()  # block -> holders among shared-prefix regions
        self._prefix_logical = 0
        self.peaks = {"used": 0, "logical": 0, "prefix": 0, "prefix_logical": 0}
        self._sum_used = 0
        self._sum_logical = 0

    # ------------------------------------------------------------ prefix cache
    def _hashes_upto(self, req: Request, num_blocks: int) -> list[int]:
        lst = self._hashes.get(req.req_id)
        if lst is None:
            lst = self._hashes[req.req_id] = []
        if len(lst) < num_blocks:
            lst.extend(block_hashes(req, len(lst), num_blocks, self.block_size, lst[-1] if lst else root_hash(req)))
        return lst

    def match_prefix(self, req: Request) -> list[int]:
        """Cached blocks a fresh admission of ``req`` would reuse (at least one token is left to compute)."""
        return self.match_prefix_blocks(req).tolist()

    def match_prefix_blocks(self, req: Request) -> np.ndarray:
        """``match_prefix`` as an int64 array (read-only), which ``allocate_slots`` takes as it is."""
        if self.prefix_cache is None or req.num_computed_tokens or self.block_tables.get(req.req_id):
            return NO_BLOCKS   # only a request starting from nothing (new, or preempted by recompute) looks up
        max_blocks = (req.prompt_len + req.num_generated - 1) // self.block_size
        if max_blocks <= 0:
            return NO_BLOCKS
        return self.prefix_cache.match_blocks(self._hashes_upto(req, max_blocks), max_blocks, key=req.req_id)

    def host_run(self, req: Request, gpu_blocks: int) -> int:
        """Blocks the host tier would load for a fresh admission of ``req`` after its ``gpu_blocks`` GPU hits
        (at least one token is left to compute); 0 without a host tier. A query: nothing changes."""
        if self.host is None or req.num_computed_tokens or self.block_tables.get(req.req_id):
            return 0
        max_blocks = (req.prompt_len + req.num_generated - 1) // self.block_size
        if max_blocks <= gpu_blocks:
            return 0
        return self.host.run_from(self._hashes_upto(req, max_blocks), gpu_blocks, max_blocks)

    def _host_lookup(self, req: Request) -> None:
        """An admission from nothing looked ``req``'s blocks up (vLLM's connector touches every one): those the
        host tier holds become its most recent."""
        max_blocks = (req.prompt_len + req.num_generated - 1) // self.block_size
        if max_blocks > 0:
            self.host.touch(self._hashes_upto(req, max_blocks)[:max_blocks])

    def _cache_full_blocks(self, req: Request, table: list[int], num_tokens: int) -> None:
        full = min(num_tokens // self.block_size, len(table))
        done = self._cached_upto.get(req.req_id, 0)
        if full <= done:
            return
        hashes = self._hashes_upto(req, full)
        self.prefix_cache.insert_run(table[done:full], hashes[done:full])
        if self.host is not None:   # written through to host memory
            self.host.store(hashes[done:full])
        self._cached_upto[req.req_id] = full

    def prefix_cache_hit_rate(self) -> float:
        """Share of prompt tokens, over first admissions, served from the prefix cache."""
        return self.prefix_cache.hit_rate() if self.prefix_cache is not None else 0.0

    def _first_lookup(self, req: Request, hit_tokens: int, loaded_tokens: int = 0) -> None:
        """A fresh table was admitted: count its first lookup (``hit_tokens`` from the GPU cache,
        ``loaded_tokens`` from the host tier); its remembered match is of no more use."""
        if self.prefix_cache is not None:
            self.prefix_cache.forget(req.req_id)
            if req.req_id not in self._looked_up:
                self._looked_up.add(req.req_id)
                self.prefix_cache.record_lookup(req.prompt_len, hit_tokens)
                req.num_cached_tokens = hit_tokens + loaded_tokens   # (as vLLM's: local and external hits)
                if self.host is not None:
                    self.host.query_tokens += req.prompt_len
                    self.host.hit_tokens += loaded_tokens

    def _allocate_cached(self, req: Request, num_new_tokens: int, cached: Sequence[int] | np.ndarray,
                         loaded: int = 0) -> bool:
        """Start ``req``'s table with the ``cached`` blocks (ref counts up), then ``loaded`` fresh blocks the
        host tier fills (``host_run``; they join the cache when the request computes after its load), then
        fresh ones for its new tokens."""
        bs = self.block_size
        pool = self.pool
        blocks = np.asarray(cached, dtype=np.int64)   # distinct: the cache maps each block to one hash
        revive = int(np.count_nonzero(pool.refs[blocks] == 0))
        hits = len(blocks)
        need = -(-((hits + loaded) * bs + num_new_tokens) // bs) - hits
        if need + revive > pool.num_free:
            return False
        self._held_tokens += (revive + loaded) * bs
        pool.incref_distinct(blocks)
        table = self.block_tables[req.req_id] = blocks.tolist()
        if need > 0:
            table.extend(pool.allocate(need))
        req.num_computed_tokens = (hits + loaded) * bs
        self._first_lookup(req, hits * bs, loaded * bs)
        if self.host is not None:
            self.host.loaded += loaded
            self._host_lookup(req)
        self._note_table(req, table)
        self._cached_upto[req.req_id] = hits   # the hits are cached under these very hashes
        if not loaded:
            self._cache_full_blocks(req, table, req.num_computed_tokens + num_new_tokens)
        return True

    # ------------------------------------------------------------ growth and release
    def _note_table(self, req: Request, table: list[int], old: int = 0) -> None:
        """After sequence 0's table grew from ``old`` blocks (0: a fresh table): counters and peaks."""
        self._logical_blocks += len(table) - old
        self._owners[req.req_id] = req
        prefix = req.prefix_group >= 0
        if prefix:
            refs = self._prefix_refs
            for i in range(old, min(len(table), req.prefix_len // self.block_size)):
                refs[table[i]] += 1
                self._prefix_logical += 1
        self._note_beyond(req)
        self._note_peaks(prefix)

    def _release(self, table: list[int], num_computed: int, unshared: bool = False, skip: int = 0) -> None:
        """Drop one table: blocks losing their last reference give back the slots the table filled.
        ``unshared``: the caller knows each of its blocks holds one reference (else they are read).
        ``skip``: the caller keeps its first ``skip`` blocks referenced as they are (a beam step: copies
        of them gain what this table gives up); only the rest lose this table's reference."""
        bs = self.block_size
        if unshared:   # (the usual case) nothing to read: the table's filled slots, min(computed, capacity)
            self._held_tokens -= min(max(num_computed, 0), len(table) * bs)
            self._logical_blocks -= len(table)
            self.pool.free_table(table)
            return
        self._logical_blocks -= len(table)
        if len(table) <= skip:
            return
        blocks = np.array(table[skip:] if skip else table, dtype=np.int64)
        last = self.pool.refs[blocks] == 1
        alone = np.count_nonzero(last) == len(last)   # nothing shared after all
        filled = num_computed - skip * bs
        if alone:
            held = min(max(filled, 0), len(blocks) * bs)
        else:
            fill = np.clip(filled - np.arange(len(blocks)) * bs, 0, bs)
            held = int(fill[last].sum())
        self._held_tokens -= held
        if alone:
            self.pool.free_last_refs(blocks[::-1])
        else:
            self.pool.free(blocks[::-1])

    def _free_shared(self, req: Request, table: list[int]) -> None:
        """Everything ``free`` does beyond the pool: cache, groups, prefix-region counters."""
        rid = req.req_id
        group = self.groups.pop(rid, None)
        if group is None:
            if self.prefix_cache is not None:
                self._cache_full_blocks(req, table, req.num_computed_tokens)
        elif not self.groups:
            self.decode_fast_path = True
        if req.prefix_group >= 0:
            refs = self._prefix_refs
            for i in range(min(len(table), req.prefix_len // self.block_size)):
                b = table[i]
                refs[b] -= 1
                self._prefix_logical -= 1
                if not refs[b]:
                    del refs[b]
        if group is None:   # blocks are shared only by forks and prefix-cache hits: without either, none is
            self._release(table, req.num_computed_tokens, unshared=self.prefix_cache is None)
        else:   # the common blocks lose all but the last table's references at once; that table frees them
            tables, c = group.tables, group.common
            for t in tables[:-1]:
                self._release(t, req.num_computed_tokens, skip=c)
            if c and len(tables) > 1:
                head = np.array(tables[-1][:c], dtype=np.int64)
                self.pool.refs[head] -= len(tables) - 1
            self._release(tables[-1], req.num_computed_tokens)
        self._cached_upto.pop(rid, None)
        self._owners.pop(rid, None)
        self.sibling_recompute.pop(rid, None)
        if req.num_generated >= req.output_len:
            self._hashes.pop(rid, None)

    # ------------------------------------------------------------ forked sequences
    def seq_tables(self, req_id: int) -> list[list[int]]:
        group = self.groups.get(req_id)
        return group.tables if group is not None else [self.block_tables[req_id]]

    def seq_width_now(self, req_id: int) -> int:
        group = self.groups.get(req_id)
        return len(group.tables) if group is not None else 1

    def on_token(self, req: Request) -> None:
        """After a multi-sequence request sampled a token: fork it, or (beam search) redraw its beams."""
        group = self.groups.get(req.req_id)
        if group is None:
            self._fork(req, seq_width(req))
        elif req.beam_width > 1:
            self._beam_step(req, group)

    def _fork(self, req: Request, k: int) -> None:
        """Share sequence 0's table with k-1 siblings. After a recompute or swap (more than one token
        generated), the siblings' generated-token blocks are their own again: fresh blocks, filled as
        if recomputed with sequence 0 (so memory matches the group before its preemption), when free."""
        t0 = self.block_tables[req.req_id]
        bs = self.block_size
        pool = self.pool
        own_from = len(t0)
        if req.num_generated > 1:
            own_from = min(len(t0), req.prompt_len // bs)
            if (k - 1) * (len(t0) - own_from) > pool.num_free:
                own_from = len(t0)
        if own_from < len(t0):  # the siblings' own tokens were not recomputed with sequence 0's
            self.sibling_recompute[req.req_id] = max(0, req.num_computed_tokens - own_from * bs)
        if own_from and k > 1:   # (t0 holds each of them: none is free, so a plain count of k - 1 more each)
            pool.refs[np.array(t0[:own_from], dtype=np.int64)] += k - 1
        tables = [t0]
        for _ in range(k - 1):
            t = t0[:own_from]
            if own_from < len(t0):
                t.extend(pool.allocate(len(t0) - own_from))
                for i in range(own_from, len(t0)):
                    self._held_tokens += max(0, min(bs, req.num_computed_tokens - i * bs))
            tables.append(t)
        rng = random.Random(req.req_id * 1_000_003 + 17) if req.beam_width > 1 else None
        self.groups[req.req_id] = SeqGroup(tables, rng, own_from)
        self._logical_blocks += (k - 1) * len(t0)
        self.decode_fast_path = False
        self._note_beyond(req)
        self._note_peaks()

    def _beam_step(self, req: Request, group: SeqGroup) -> None:
        """The k beams redrawn: a parent drawn twice or more is copied (its blocks shared), a beam not drawn
        is dropped. The first ``group.common`` blocks are in every table, so each gains as many references
        from the copies as it loses with the dropped beams: only the blocks after them are touched."""
        k = len(group.tables)
        parents = sorted(group.rng.choices(range(k), k=k))
        c = group.common
        seen: set[int] = set()
        tables = []
        for p in parents:
            t = group.tables[p]
            if p in seen:   # a second child shares the parent's whole table (its blocks are distinct and held)
                t = list(t)
                if len(t) > c:
                    self.pool.incref_distinct(np.array(t[c:], dtype=np.int64))
                self._logical_blocks += len(t)
            seen.add(p)
            tables.append(t)
        for i, t in enumerate(group.tables):
            if i not in seen:
                self._release(t, req.num_computed_tokens, skip=c)
        kept = [group.tables[p] for p in sorted(seen)]   # the surviving beams: their common blocks grow
        head, shortest = kept[0], min(len(t) for t in kept)
        while c < shortest and all(t[c] == head[c] for t in kept):
            c += 1
        group.common = c
        group.private_tail = False   # (a copied beam shares its parent's blocks)
        group.tables = tables
        self.block_tables[req.req_id] = tables[0]
        self._note_beyond(req)

    def _allocate_group(self, req: Request, num_new_tokens: int) -> bool:
        """Room for every sequence's next tokens. A write into a block other tables still hold first
        replaces it with a private block: a copy (``copies`` gets (src, dst)) when it holds tokens."""
        bs = self.block_size
        pool = self.pool
        refs = pool.refs
        pos = req.num_computed_tokens
        end = pos + num_new_tokens
        total = -(-end // bs)
        first = pos // bs
        group = self.groups[req.req_id]
        if num_new_tokens == 1 and pos % bs and group.private_tail:   # inside every sequence's own last block
            self._note_peaks()
            return True
        left: dict[int, int] = {}
        need = 0
        for t in group.tables:
            for i in range(first, min(total, len(t))):
                b = t[i]
                r = left.get(b, refs[b])
                if r > 1:
                    need += 1
                    left[b] = r - 1
            need += max(0, total - len(t))
        if need > pool.num_free:
            return False
        for t in group.tables:
            for i in range(first, min(total, len(t))):
                src = t[i]
                if refs[src] > 1:
                    dst = pool.allocate(1)[0]
                    pool.free((src,))
                    t[i] = dst
                    if i < group.common:
                        group.common = i
                    filled = min(bs, pos - i * bs)
                    if filled > 0:
                        self.copies.append((src, dst))
                        self._held_tokens += filled
            grow = total - len(t)
            if grow > 0:
                t.extend(pool.allocate(grow))
                self._logical_blocks += grow
        group.private_tail = True   # blocks first .. total-1 of every table are its own now
        self._note_beyond(req)
        self._note_peaks()
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        out, self.copies = self.copies, []
        return out

    # ------------------------------------------------------------ accounting
    def _note_beyond(self, req: Request) -> None:
        """Internal fragmentation: slots past the final length, in the distinct blocks at the last index."""
        bs = self.block_size
        last = (req.max_kv_tokens - 1) // bs
        per = (last + 1) * bs - req.max_kv_tokens
        if per:
            group = self.groups.get(req.req_id)
            if group is None:  # one table: no set needed
                beyond = per if len(self.block_tables[req.req_id]) > last else 0
            else:
                beyond = per * len({t[last] for t in group.tables if len(t) > last})
        else:
            beyond = 0
        old = self._beyond.get(req.req_id, 0)
        if beyond != old:
            self._beyond_final += beyond - old
            self._beyond[req.req_id] = beyond

    def _note_peaks(self, prefix: bool = True) -> None:
        """Raise the peaks to the current counters. The shared-prefix counters grow only in ``_note_table``
        for a request with a prefix group, which asks for them (``prefix``), so skipping them otherwise
        keeps every peak exact."""
        p = self.peaks
        used = self.pool.num_used
        if used > p["used"]:
            p["used"] = used
        if self._logical_blocks > p["logical"]:
            p["logical"] = self._logical_blocks
        if not prefix:
            return
        if len(self._prefix_refs) > p["prefix"]:
            p["prefix"] = len(self._prefix_refs)
        if self._prefix_logical > p["prefix_logical"]:
            p["prefix_logical"] = self._prefix_logical

    def sharing_summary(self, block_bytes: int) -> dict[str, float]:
        """Summary keys of block sharing (``block_bytes``: KV bytes of one block):

        kv_bytes_peak                  most KV bytes in use at once (distinct physical blocks)
        kv_bytes_unshared_peak         most bytes the same tables would use with nothing shared: the sum
                                       of all table lengths (n independent sequences, one copy per request)
        kv_sharing_saving              1 - physical / unshared blocks, summed over steps (after each step)
        prefix_kv_bytes_peak           most bytes of distinct blocks in shared-prefix regions (the full
                                       blocks of a request's first prefix_len tokens, prefix_group >= 0)
        prefix_kv_bytes_unshared_peak  the same regions counted once per request
        prefix_cache_evictions         cached blocks whose hash was forgotten when reallocated
        """
        p = self.peaks
        return {
            "kv_bytes_peak": p["used"] * block_bytes,
            "kv_bytes_unshared_peak": p["logical"] * block_bytes,
            "kv_sharing_saving": 1 - self._sum_used / self._sum_logical if self._sum_logical else 0.0,
            "prefix_kv_bytes_peak": p["prefix"] * block_bytes,
            "prefix_kv_bytes_unshared_peak": p["prefix_logical"] * block_bytes,
            "prefix_cache_evictions": self.prefix_cache.num_evicted if self.prefix_cache is not None else 0,
            **(self.host.summary(self.block_size) if self.host is not None else {}),
        }

    def _check_sharing(self, holders: Counter[int]) -> None:
        """Group tables are counted as holders; the slot counters are recomputed from the tables."""
        bs = self.block_size
        fill: dict[int, int] = {}
        for rid, table in self.block_tables.items():
            if not table:
                continue  # a fresh table whose first allocation did not fit
            req = self._owners.get(rid)
            assert req is not None, f"table of request {rid} has no owner"
            group = self.groups.get(rid)
            tables = group.tables if group is not None else [table]
            if group is not None:
                assert tables[0] is table, f"request {rid}: sequence 0 is not its block table"
                head = table[:group.common]
                assert len(head) == group.common and all(t[:group.common] == head for t in tables), (
                    f"request {rid}: its sequences differ within their {group.common} common blocks")
                assert not group.private_tail or all(t and self.pool.refs[t[-1]] == 1 for t in tables), (
                    f"request {rid}: a sequence's last block is shared though marked its own")
                for t in tables[1:]:
                    holders.update(t)
            for t in tables:
                for i, b in enumerate(t):
                    f = max(0, min(bs, req.num_computed_tokens - i * bs))
                    assert fill.setdefault(b, f) == f, f"block {b} filled differently by its holders"
        assert sum(fill.values()) == self._held_tokens, (
            f"held slots {self._held_tokens} != {sum(fill.values())} recomputed from the tables")
        logical = sum(len(t) for rid in self.block_tables for t in self.seq_tables(rid)) + self.window_pages_logical()
        assert logical == self._logical_blocks, f"logical blocks {self._logical_blocks} != {logical}"
        if self.prefix_cache is not None:
            self.prefix_cache.check_integrity()
        if self.host is not None:
            assert len(self.host) <= self.host.capacity, f"host tier holds {len(self.host)} > {self.host.capacity}"
