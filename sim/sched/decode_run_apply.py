"""Applying a decode run (sim/sched/decode_run.py plans and prices it): the counters, block tables,
inter-token gaps, finishes and step rows that its k single steps would have produced.

A run applies after its wait (or at once, inside a chain that ends before the next arrival). Its blocks
leave the pool in (step, batch) order in one call; a run through finishes frees the finished requests
step by step after them, which hands out the same block ids as single stepping (the free queue gives
its head and takes freed blocks at its tail, and the run's blocks fit those free at its start).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.native import native
from sim.request import Request
from sim.sched.base import StepStats
from sim.sched.plan import StepResult

if TYPE_CHECKING:
    from sim.sched.decode_run import PendingRun

SMALL_BATCH = 32   # a run of at most this many requests is worked out per request in plain Python, a larger
                   # one with numpy (a numpy call costs about a microsecond whatever its size); the compiled
                   # loops, where built, find and take any run's block events


def boundary_steps(c0: np.ndarray, l0: np.ndarray, rem: np.ndarray, k: int, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """The block allocations of a run's k steps, by request: request i (computed ``c0_i``, a table of
    ``l0_i`` blocks, ``rem_i`` tokens to go) takes a block at steps L0_i * bs - c0_i + m * bs (its
    computed count reaches its table's capacity) before its last step rem_i - 1. Returns (positions,
    steps), grouped by request."""
    first = l0 * bs - c0      # >= 0: the step whose token first overflows the table
    kk = np.minimum(rem, k)   # steps each request computes in (it finishes in step rem - 1)
    count = np.maximum(kk - first + (bs - 1), 0) // bs   # boundaries at first, first + bs, ... < kk
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if int(np.maximum.reduce(count)) == 1:
        pos = count.nonzero()[0]
        return pos, first[pos]
    pos = np.arange(len(c0)).repeat(count)
    return pos, first.repeat(count) + (np.arange(total) - (count.cumsum() - count).repeat(count)) * bs


def boundary_events(c0: list[int], l0: list[int], rem: list[int], k: int, bs: int,
                    finals: list[tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """``boundary_steps`` in plain Python (a small batch), sorted by (step, position): the order in which
    the blocks leave the pool. Returns (positions, steps). ``finals``: given, collects (step, position)
    of each request whose table reaches its final block, with slots to spare past its last KV token
    (its most KV tokens are c0 + rem: only its last boundary can do it)."""
    size = len(c0)
    keys = []   # event (step j, position i) as j * size + i: sorted as the pairs would be, and made by range
    for i, (c, n, r) in enumerate(zip(c0, l0, rem)):
        first, end = n * bs - c, (r if r < k else k)   # its boundaries: first, first + bs, ... < end
        if first < end:
            keys.extend(range(first * size + i, end * size + i, bs * size))
            if finals is not None:
                count = (end - first - 1) // bs + 1
                last = (c + r - 1) // bs   # the final block's index
                if n + count == last + 1 and (last + 1) * bs > c + r:
                    finals.append((first + (count - 1) * bs, i))
    keys.sort()
    return [x % size for x in keys], [x // size for x in keys]


def small_batch_events(run: PendingRun, k: int, bs: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """``boundary_events`` of ``run``'s first ``k`` steps, with its finals (compiled where built)."""
    if native is not None and run.c0a is not None:
        return native.boundary_events(run.c0a, run.l0, run.rem, k, bs)
    finals: list[tuple[int, int]] = []
    pos, steps = boundary_events(run.c0, run.l0.tolist(), run.rem.tolist(), k, bs, finals)
    return pos, steps, finals


class DecodeStepView:
    """What the recorder reads of an all-decode step's plan: its size and no block movement (a run
    builds no per-request plan)."""

    __slots__ = ("scheduled",)
    blocks_to_copy = blocks_to_swap_out = blocks_to_swap_in = ()

    def __init__(self, n: int) -> None:
        self.scheduled = range(n)




class DecodeRunApplier:
    """The applying half of ``DecodeRunner`` (sim/sched/decode_run.py): a planned run's effects, as single
    stepping would have made them step by step. Expects ``self.sched`` and ``self.recorder``."""

    sched: Any
    recorder: Any
    def apply(self, run: PendingRun) -> list[Request]:
        """Do what single stepping does over the run's k steps (time is now ``run.end``); returns the
        requests finished at the last step."""
        if int(np.minimum.reduce(run.rem)) < run.k:
            return self._apply_through_finishes(run)
        sched = self.sched
        self._follow_lane(run)
        mgr = sched.manager
        k, batch, n = run.k, run.batch, len(run.batch)
        waiting, swapped = run.waiting, run.swapped
        held0 = mgr._held_tokens
        used, beyond, logical = self._allocate(run)
        if run.blocked_head is not None:   # allocate_slots' failed attempt leaves an empty table behind
            mgr.block_tables.setdefault(run.blocked_head.req_id, [])
        mgr.note_decode_run(n, used, logical)
        self._gaps(run)
        end = run.end
        finished = (run.rem == k).nonzero()[0].tolist()
        c0, g0 = run.c0, run.g0
        for i in finished:
            req = batch[i]
            req.num_computed_tokens = c0[i] + k
            req.num_generated = g0[i] + k
            req.last_token_s = end
        if not run.eager:   # chained: the survivors' counters are written once the chain ends
            self.write_back(run)
        sched.step_index += k
        sched.stats = StepStats(num_decode_tokens=n, num_sampled=n)
        if k > 1:
            m = k - 1
            bs = mgr.block_size
            ts = held0 + n * np.arange(1, k, dtype=np.int64)
            u = used[:m]
            self.recorder.record_run(
                run.ends[:m], run.durations[:m], batch_size=n, num_decode_tokens=n, num_running=n,
                num_waiting=waiting, num_swapped=swapped, kv_blocks_used=u,
                slots=(ts, u * bs - ts - beyond[:m], beyond[:m], 0, (mgr.num_blocks - u) * bs),
                breakdown={key: v[:m] for key, v in run.breakdown.items()})
        done = [batch[i] for i in finished]
        if done:
            sched._finish(done, end)
        last = StepResult(float(run.durations[k - 1]), {key: float(v[k - 1]) for key, v in run.breakdown.items()})
        self.recorder.record_step(float(run.ends[k - 1]), DecodeStepView(n), last, sched)
        return done

    def _apply_through_finishes(self, run: PendingRun) -> list[Request]:
        """``apply`` of a run whose requests finish at several of its steps (nobody waiting, no prefix
        cache): request i computes its steps j < rem_i and finishes at the end of step rem_i - 1.

        Its blocks leave the pool first, in (step, batch) order, then the finished requests are freed
        step by step. The pool hands out blocks from the head of its free queue and takes freed ones at
        the tail, and the run's blocks fit the free blocks at its start, so no freed block is handed out
        again inside the run: the same blocks as single stepping. The per-step counters (rows, sums,
        peaks) are those of single stepping: after the step's allocations, before (sums, peaks) or after
        (rows) its finishes."""
        sched = self.sched
        self._follow_lane(run)
        mgr = sched.manager
        k, batch, n0 = run.k, run.batch, len(run.batch)
        rem, ends = run.rem, run.ends
        held0 = mgr._held_tokens
        c0a = run.c0a if run.c0a is not None else np.array(run.c0, dtype=np.int64)
        used, beyond, logical = self._allocate_blocks(run, c0a, peaks=False)
        reml = rem.tolist()
        # (the step each finishing request finishes in, its batch position), sorted: steps in order, batch
        # order within a step
        ending = sorted([(r - 1, i) for i, r in enumerate(reml) if r <= k])
        if run.seqs is not None:                             # requests computing in step j (as priced)
            alive = run.seqs[:k]
        else:
            leaving = np.bincount([j for j, _ in ending], minlength=k)    # requests whose last step is j
            alive = n0 - (leaving.cumsum() - leaving)
        self._gaps(run, alive)   # (before the finished requests' last token times are written)
        # the finishes, step by step (batch order within a step), and what each step's frees gave back
        c0, g0 = run.c0, run.g0
        done: list[Request] = []
        rows = []   # per step with finishes: (step, used, beyond, logical, held tokens) its frees gave back
        for j, pairs in groupby(ending, key=itemgetter(0)):
            group = []
            t = float(ends[j + 1])
            for _, i in pairs:
                req = batch[i]
                r = reml[i]
                req.num_computed_tokens = c0[i] + r
                req.num_generated = g0[i] + r
                req.last_token_s = t
                group.append(req)
            used0, beyond0, logical0 = mgr.decode_run_counters()
            held0_j = mgr._held_tokens
            sched._finish(group, t)
            used1, beyond1, logical1 = mgr.decode_run_counters()
            rows.append((j, used0 - used1, beyond0 - beyond1, logical0 - logical1, held0_j - mgr._held_tokens))
            if j == k - 1:
                done = group
        bs = mgr.block_size
        m = k - 1   # the rows recorded here (the last step's is recorded as a single step)
        if native is not None:   # the counters below, in one compiled pass
            counters = np.empty((5, m), dtype=np.int64)   # used, token slots, fragmented, beyond, empty
            tokens, used_sum, logical_sum, used_peak, logical_peak = native.finish_counters(
                rows, k, used, beyond, logical, alive, held0, bs, mgr.num_blocks, m, counters)
            mgr.note_decode_sums(tokens, used_sum, logical_sum)
            mgr.raise_peaks(used_peak, logical_peak)
        else:
            freed = np.zeros((k, 4), dtype=np.int64)   # used, beyond, logical, held tokens
            table = np.array(rows, dtype=np.int64)
            freed[table[:, 0]] = table[:, 1:]
            freed_through = freed.cumsum(axis=0)          # freed at steps <= j
            gone_before = freed_through - freed               # freed at steps < j
            used_pre = used - gone_before[:, 0]
            logical_pre = logical - gone_before[:, 2]
            mgr.note_decode_steps(alive, used_pre, logical_pre)
            mgr.raise_peaks(int(np.maximum.reduce(used_pre)), int(np.maximum.reduce(logical_pre)))
            through = freed_through[:m]                      # the rows are after their step's finishes
            u = used[:m] - through[:, 0]
            b = beyond[:m] - through[:, 1]
            ts = held0 + alive.cumsum()[:m] - through[:, 3]
            counters = (u, ts, u * bs - ts - b, b, (mgr.num_blocks - u) * bs)
        if not run.eager:
            self.write_back(run)
        sched.step_index += k
        n_last = int(alive[k - 1])
        sched.stats = StepStats(num_decode_tokens=n_last, num_sampled=n_last)
        if k > 1:
            u, ts, frag, b, empty = counters
            n = alive[:m]
            self.recorder.record_run(
                ends[:m], run.durations[:m], batch_size=n, num_decode_tokens=n,
                num_running=alive[1:k], num_waiting=run.waiting,   # (those not finished in step j)
                num_swapped=run.swapped, kv_blocks_used=u, slots=(ts, frag, b, 0, empty),
                breakdown={key: v[:m] for key, v in run.breakdown.items()})
        last_step = StepResult(float(run.durations[k - 1]), {key: float(v[k - 1]) for key, v in run.breakdown.items()})
        self.recorder.record_step(float(ends[k - 1]), DecodeStepView(n_last), last_step, sched)
        return done

    def write_back(self, run: PendingRun) -> None:
        """Write the counters of the requests ``run`` did not finish (at once for a run applied after its
        wait; at the end of a chain for runs applied eagerly)."""
        k, end = run.k, run.end
        lane = self.sched._lane
        if lane is not None and run.lane is lane:   # (the lane followed the run: the same counters)
            lane.synced = True
        else:
            self.sched.drop_lane()
        if native is not None:
            native.write_counters(run.batch, run.c0, run.g0, run.rem, k, end)
            return
        for req, c, g, r in zip(run.batch, run.c0, run.g0, run.rem.tolist()):
            if r > k:
                req.num_computed_tokens = c + k
                req.num_generated = g + k
                req.last_token_s = end

    def _follow_lane(self, run: PendingRun) -> None:
        """The decode lane past ``run`` as it applies: moved k tokens on, its finished requests out, where it
        held the run's batch (``run.lane``); else dropped (rebuilt when next needed)."""
        sched = self.sched
        lane = sched._lane
        if lane is None:
            return
        if run.lane is not lane:
            sched.drop_lane()
            return
        lane.advance(run.k, run.end, run.rem > run.k)

    def _allocate(self, run: PendingRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Call allocate_slots where single stepping would (a request at a block boundary), in step then
        batch order; returns per step the (used, beyond-final, logical) block counters after it."""
        sched = self.sched
        mgr = sched.manager
        k, batch = run.k, run.batch
        bs = mgr.block_size
        c0 = np.array(run.c0, dtype=np.int64)
        if mgr.prefix_cache is None:   # only the blocks matter: allocate them in one call
            return self._allocate_blocks(run, c0)
        first = (-c0) % bs                                   # first step whose computed count % bs == 0
        count = np.where(first < k, (k - 1 - first) // bs + 1, 0)
        total = int(count.sum())
        if total:
            pos = np.arange(len(batch)).repeat(count)
            offset = np.arange(total) - (count.cumsum() - count).repeat(count)
            steps = first.repeat(count) + offset * bs
            order = np.lexsort((pos, steps))
            pos, steps = pos[order], steps[order]
        start = mgr.decode_run_counters()
        snap = np.empty((k, 3), dtype=np.int64)
        have = np.zeros(k, dtype=bool)
        if total:
            allocate = mgr.allocate_slots
            counters = mgr.decode_run_counters
            c0l, g0l = run.c0, run.g0
            for j, p in zip(steps.tolist(), pos.tolist()):
                req = batch[p]
                req.num_computed_tokens = c0l[p] + j
                req.num_generated = g0l[p] + j
                if not allocate(req, 1):
                    raise AssertionError("decode run: the pool bound promised this block")
                snap[j] = counters()
                have[j] = True
        idx = np.maximum.accumulate(np.where(have, np.arange(k), -1))
        vals = np.where((idx >= 0)[:, None], snap[np.maximum(idx, 0)], np.array(start, dtype=np.int64)[None, :])
        return vals[:, 0], vals[:, 1], vals[:, 2]

    def _allocate_blocks(self, run: PendingRun, c0: np.ndarray,
                         peaks: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Without a prefix cache: the run's block boundaries (``boundary_steps``) in (step, batch) order, all
        leaving the pool in one call."""
        k, bs = run.k, self.sched.manager.block_size
        # a request's most KV tokens: prompt + output - 1 = c0 + rem (a decode computes c0 = prompt + g0 - 1)
        if len(run.batch) <= SMALL_BATCH or (native is not None and run.c0a is not None):   # (compiled: any batch)
            if run._events is None:
                pos, steps, finals = small_batch_events(run, k, bs)
            else:   # found for more steps (a router asked before the run was cut): those before k
                pos, steps, finals = run._events
                cut = bisect_left(steps, k)
                if cut < len(steps):
                    pos, steps, finals = pos[:cut], steps[:cut], [f for f in finals if f[0] < k]
            return self.sched.manager.allocate_decode_events(run.batch, pos, steps, finals, k, peaks=peaks)
        pos, steps = boundary_steps(c0, run.l0, run.rem, k, bs)
        if len(steps) > 1:
            order = np.lexsort((pos, steps))
            pos, steps = pos[order], steps[order]
        return self.sched.manager.allocate_decode_run(run.batch, pos, steps, (c0[pos] + steps) // bs + 1,
                                                      (c0 + run.rem)[pos], k, peaks=peaks)

    def _gaps(self, run: PendingRun, alive: np.ndarray | None = None) -> None:
        """Inter-token gaps as ``update`` records them: regular when last_token == now - duration (float).
        ``alive``: the requests in each step, where some finish before the run's last step."""
        gaps = self.sched.gaps
        k, n = run.k, len(run.batch)
        ends = run.ends
        d = run.durations[:k]
        regular = None   # per step: update's step_start (now - duration) is the previous step's end
        if native is not None:
            b0, irregular = native.step_backs(ends, d)   # (step 0's start; irregular steps after it)
        else:
            back = ends[1:] - d
            regular = back == ends[:k]
            b0, irregular = float(back[0]), k - 1 - int(np.count_nonzero(regular[1:]))
        # step 0: each request's last token time decides
        common = run.last_token if run.last_token is not None else run.lane_last
        if common is not None:   # chained, or read off the lane: every request sampled at one time
            num0 = n if common == b0 else 0
            if num0 < n:
                gaps.other_gaps.extend([float(ends[1] - common)] * n)
        else:
            e1 = float(ends[1])
            late = [e1 - t for t in [r.last_token_s for r in run.batch] if t != b0]
            num0 = n - len(late)
            if late:
                gaps.other_gaps.extend(late)
        counts = None
        if k > 1 and not irregular:   # (the usual case)
            counts = np.full(k, n, dtype=np.int64) if alive is None else alive
            if num0 == n:   # every step regular: the pairs at once
                gaps.step_gaps.extend_arrays(d, counts)
                return
        if num0:
            gaps.step_gaps.append((float(d[0]), num0))
        if k == 1:
            return
        if counts is not None:
            gaps.step_gaps.extend_arrays(d[1:], counts[1:])
            return
        counts = np.full(k, n, dtype=np.int64) if alive is None else alive
        if regular is None:
            regular = ends[1:] - d == ends[:k]
        dl = d.tolist()
        for j, m in zip(range(1, k), counts[1:].tolist()):
            if regular[j]:
                gaps.step_gaps.append((dl[j], m))
            else:
                gaps.other_gaps.extend([float(ends[j + 1] - ends[j])] * m)
