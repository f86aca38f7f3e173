"""Multi-step decode: advance k all-decode engine steps at once, exactly as k single steps would.

When nothing can change the batch for a while (nobody waiting who could be admitted, nothing swapped,
every running request one token from its next sample), the next k steps are determined:

    step j (0 <= j < k):   every request i computes token c0_i + j and samples token g0_i + j + 1
                           a request whose c0_i + j is a block boundary calls allocate_slots (as the
                           scheduler would), in batch order within the step
                           time: e_{j+1} = e_j + d_j (float64, left to right, as SimPy would add)

k is bounded by the nearest event that single stepping would react to:
- the fewest remaining output tokens (a request finishes at the run's last step, never inside it), or,
  when nobody waits (a finish admits nobody), the most: request i then takes part in steps j < rem_i
  and finishes inside the run, which prices a shrinking batch and frees each finished request's blocks
  after the run's allocations (no prefix cache, and no router reading the caches inside the run);
- the next arrival: the run ends with the step during which it reaches the engine (e_k >= T_arrival);
- admissions: nobody waits, or no seat or token budget is left, or (FCFS or priority, no prefix cache)
  the head of the queue cannot get its blocks even after step 0 (free blocks only shrink in a run);
- the pool: cumulative block needs A(j) = sum_i max(0, (c0_i + j) // bs + 1 - L0_i) must fit the free
  blocks at the start (no block is freed inside a run, so the first A(j) > free is where single
  stepping would preempt);
- a step cap (the pricing call's array length).

Only the paged manager without forked sequences, and executors with ``supports_decode_runs = True``
(pure pricers whose ``execute_decode_run`` equals ``execute`` bit for bit), take this path. Everything
single stepping observes is reproduced: request counters and token times, inter-token gaps (including
the float test ``last_token == now - duration``), block ids and their allocation order, prefix-cache
inserts, slot accounting per step, step_index (round-robin turns), the step rows, finish order.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from sim.errors import KvsimError
from sim.executors.base import execute_decode_run
from sim.native import native
from sim.request import Request, RequestStatus
from sim.sched.decode_run_apply import SMALL_BATCH, DecodeRunApplier, boundary_steps, small_batch_events
from sim.sched.plan import ScheduledRequest, StepPlan

MAX_RUN_STEPS = 4096   # longest run priced in one call
MIN_RUN_STEPS = 4      # shorter runs cost more than single steps: step one at a time instead (instructions
                       # under callgrind, the hour's first 5,000 requests as given and outputs doubled: 4-6 the
                       # least of 2-16, 16 costing 13% / 10% more in the engine loop; with the compiled loops
                       # of sim/csrc, 4 is 0.7% / 0.6% below 5 and 3 0.4% / 0.1%)
MIN_RUN_STEPS_LARGE = 16   # the same for a batch of more than SMALL_BATCH requests, whose run is planned and
                           # applied with numpy while its single steps take the decode lane (3,000 synthetic
                           # requests at 30 req/s, batches of ~100: 5 cost 10% more than 16 in the engine loop)
PRICE_AHEAD = 8        # a run is priced for up to this many times the steps estimated to the next arrival
                       # (instruction counts, 4,000 requests of the hour and of 8 round_robin replicas:
                       # 8 the least of 1, 2, 4, 8, 16 for the two together)
MAX_BACKOFF_STEPS = 16  # the most steps single stepped without trying a run after failed attempts


def supports_decode_runs(executor: object) -> bool:
    """Whether ``executor`` may price k decode steps at once (a missing flag means single steps only)."""
    return bool(getattr(executor, "supports_decode_runs", False))


@dataclass
class PendingRun:
    """A run priced at its start ``ends[0]``, applied once time has reached ``ends[k]``."""

    k: int
    batch: list[Request]
    c0: list[int]
    g0: list[int]
    rem: np.ndarray            # remaining output tokens per request at the start
    durations: np.ndarray      # (>= k,) step prices; only the first k are used
    ends: np.ndarray           # (k + 1,) ends[0] = start, ends[j + 1] = ends[j] + durations[j]
    breakdown: dict[str, np.ndarray] = field(default_factory=dict)
    l0: np.ndarray | None = None   # table lengths at the start
    waiting: int = 0           # queue lengths at the start (arrivals inside a run come in its last step)
    swapped: int = 0
    blocked_head: Request | None = None   # the queue's head, whose failed allocation creates its empty table
    last_token: float | None = None   # every request's last token time (a chained run), else read them
    eager: bool = False        # applied at plan time inside a chain: counters of survivors not written
    lane: Any = None           # the scheduler's decode lane, when it holds the batch (in order) and follows the
                               # run: planned from its arrays, advanced as the run applies, never rebuilt
    lane_last: float | None = None   # every request's last token time as that lane holds it (not yet synced)
    c0a: np.ndarray | None = None     # c0 and g0 as arrays (carried to the next run of a chain)
    g0a: np.ndarray | None = None
    seqs: np.ndarray | None = None    # requests in each priced step, where some finish inside the run
    _finish_times: list[float] | None = None   # (finished_before's, for the steps priced: a cut keeps them)
    _held: tuple | None = None                # (blocks_held's tables, likewise)
    # (boundary_events' positions, steps and finals for the steps priced, a small batch's: apply takes
    # those before its k, which are the events of the run as cut)
    _events: tuple[list[int], list[int], list[tuple[int, int]]] | None = None

    def finished_before(self, now: float) -> int:
        """How many of its requests finish inside it before ``now`` (their last step ends before then)."""
        if self._finish_times is None:
            rem = self.rem
            self._finish_times = np.sort(self.ends[rem[rem <= self.k]]).tolist()
        return bisect_left(self._finish_times, now)

    @property
    def end(self) -> float:
        return float(self.ends[self.k])


def _blocks_needed(c0: np.ndarray, l0: np.ndarray, bs: int, j: int, rem: np.ndarray | None = None) -> int:
    """Blocks allocated over steps 0..j of a run (sum over requests of max(0, (c0 + j) // bs + 1 - L0));
    with ``rem``, a request computes no token after its last step ``rem - 1``."""
    at = c0 + j if rem is None else c0 + np.minimum(j, rem - 1)
    return int(np.maximum(at // bs + 1 - l0, 0).sum())


def _step_ends(now: float, d: np.ndarray) -> tuple[np.ndarray, int]:
    """(ends, first bad): ends[0] = ``now``, ends[j + 1] = ends[j] + d[j], summed left to right as SimPy
    adds; the index of the first duration not above 0 (NaN too), or -1."""
    if native is not None and d.flags.c_contiguous:
        ends = np.empty(len(d) + 1)
        return ends, native.step_ends(ends, d, now)
    if np.minimum.reduce(d) > 0:
        return np.concatenate(([now], d)).cumsum(), -1
    return np.concatenate(([now], d)).cumsum(), int((~(d > 0)).nonzero()[0][0])


def _shrinking_sums(c0: np.ndarray, rem: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step j < k of a run in which request i computes its steps j < rem_i: the sequences in the step,
    and their contexts summed, each counting its token (c0_i + j + 1), as exact integers."""
    steps = np.minimum(rem, k)                                  # steps each request computes in (>= 1)
    seqs = len(c0) - np.bincount(steps, minlength=k + 1)[:k].cumsum()   # those with steps > j
    # the contexts (c0 + 1) of the requests gone before step j, summed in float64: exact below 2**53
    gone_ctx = np.bincount(steps, weights=c0 + 1, minlength=k + 1)[:k].cumsum().astype(np.int64)
    base = int(c0.sum()) + len(c0) - gone_ctx
    return seqs, base + seqs * np.arange(k, dtype=np.int64)


def _shrinking_segments(c0: list[int], rem: list[int], k: int) -> tuple[list[int], list[int], list[int]]:
    """``_shrinking_sums`` as stretches of steps with the same requests, in plain Python (a small batch):
    (sizes, lengths, bases), stretch s has ``sizes[s]`` requests for ``lengths[s]`` steps, whose contexts
    (c0 + 1) sum to ``bases[s]`` at the run's start. Some request takes part in every one of the k steps."""
    gone: dict[int, list[int]] = {}   # last step + 1 (< k) -> [requests, their c0 + 1 summed]
    for c, r in zip(c0, rem):
        if r < k:
            g = gone.get(r)
            if g is None:
                gone[r] = [1, c + 1]
            else:
                g[0] += 1
                g[1] += c + 1
    size, base = len(c0), sum(c0) + len(c0)
    sizes, lengths, bases = [], [], []
    prev = 0
    for end in sorted(gone):
        sizes.append(size)
        lengths.append(end - prev)
        bases.append(base)
        prev = end
        size -= gone[end][0]
        base -= gone[end][1]
    sizes.append(size)
    lengths.append(k - prev)
    bases.append(base)
    return sizes, lengths, bases


class DecodeRunner(DecodeRunApplier):
    """Plans, prices and applies decode runs for one continuous scheduler and its paged manager."""

    def __init__(self, sched, executor, recorder, max_steps: int = MAX_RUN_STEPS,
                 min_steps: int | None = None, stop_before_arrival: bool = False,
                 arrival_times: np.ndarray | None = None, cut_lazily: bool = False,
                 staging: bool = False) -> None:
        self.sched = sched
        self.executor = executor
        self.recorder = recorder
        self.max_steps = max_steps
        self._head: tuple[Request, int] | None = None   # a waiting head that cannot be admitted (see _batch)
        # a run is taken only if its bounds allow this many steps
        self.min_steps = MIN_RUN_STEPS if min_steps is None else min_steps
        self.min_steps_large = max(self.min_steps, MIN_RUN_STEPS_LARGE) if min_steps is None else min_steps
        # runs end before the step the next arrival reaches (not with it): somebody reads this engine's
        # state at that moment (a cluster's router), and the step in progress then must have allocated
        self.stop_before_arrival = stop_before_arrival
        # ``arrival_times``: when requests may be handed to the engine, if known; no step of a run may end
        # exactly at one (event order decides there). Then, with async scheduling (``staging``), a run
        # goes on through the step after the one an arrival falls in: that step is planned without it
        self.arrival_times = arrival_times
        self.staging = staging and arrival_times is not None and not stop_before_arrival
        # cut lazily (a cluster whose router reads only replica loads and KV usage): runs are not bounded by the next
        # arrival; the engine cuts one (``cut``) when an arrival is routed to it. A run is priced as far as
        # its other bounds allow (its requests' remaining tokens bound it): any nearer bound ends runs
        # that the next arrivals, routed elsewhere, would not have cut, and chaining them costs more than
        # pricing steps that a cut drops (instruction counts, 8 replicas behind least_requests)
        self.cut_lazily = cut_lazily
        # after f failed attempts in a row that cost per-request work, the next 2**f - 1 steps (at most
        # MAX_BACKOFF_STEPS - 1) do not try: a saturated engine rarely has a run, and trying costs O(batch)
        self._fails = 0
        self._skip = 0
        # with nobody waiting, a run may go on past its requests' last tokens (the batch shrinks as they
        # finish) where the executor prices such steps at once, no prefix cache reacts to the frees, and
        # no router reads the engine's caches inside a run (one that reads loads or KV usage counts the
        # finishes a run has made by then: Engine.pending_finished, Engine.pending_blocks)
        self.through_finishes = (callable(getattr(executor, "execute_decode_profile", None))
                                 and sched.manager.prefix_cache is None
                                 and not stop_before_arrival)

    @property
    def arrival_times(self) -> np.ndarray | None:
        return self._arrival_times

    @arrival_times.setter
    def arrival_times(self, times: np.ndarray | None) -> None:
        self._arrival_times = times
        self._times = times.tolist() if times is not None else []   # the same, for bisect (no numpy call)
        self._native_ties = (native is not None and times is not None and times.dtype == np.float64
                             and times.flags.c_contiguous)

    # ------------------------------------------------------------ eligibility
    def _batch(self) -> list[Request] | None:
        """The running batch in plan order, if the next step is surely all-decode; else None."""
        sched = self.sched
        mgr = sched.manager
        if (sched._multi_seq or not mgr.decode_fast_path or sched._prefilling or sched.swapped
                or getattr(mgr, "groups", None)):
            return None
        running = sched.running
        n = len(running)
        budget = sched.max_num_batched_tokens
        if n == 0 or n > budget:
            return None
        cfg = sched.config
        self._head = None
        if len(sched.waiting):   # admissions must be impossible for the whole run
            if cfg.policy == "round_robin":
                return None
            if n < cfg.max_num_seqs and budget - n > 0:
                # a seat and budget are free: only a head of the queue that cannot get its blocks blocks
                # (FCFS/priority: nobody overtakes it); plan() checks its blocks against the pool
                if cfg.policy not in ("fcfs", "priority") or mgr.prefix_cache is not None:
                    return None
                head = sched.waiting.peek()
                if head.status == RequestStatus.SWAPPED:
                    return None
                num_new = head.num_tokens - head.num_computed_tokens
                if num_new > budget - n and cfg.chunked_prefill:
                    num_new = budget - n
                if num_new <= budget - n or cfg.chunked_prefill:   # else: too long for the step, no attempt
                    self._head = (head, num_new)
        if cfg.policy == "priority":
            return sorted(running, key=lambda r: (r.priority, r.arrival_s, r.req_id))
        return list(running)

    def _head_fits_anyway(self, n: int) -> bool:
        """Whether the waiting head (``_head``) fits even if each of the ``n`` running requests takes a
        block at step 0: then it is admitted next step and no run can start (``_price`` would find so
        after a pass over the batch)."""
        if self._head is None:
            return False
        mgr = self.sched.manager
        head, num_new = self._head
        need = -(-(head.num_computed_tokens + num_new) // mgr.block_size) - len(mgr.block_tables.get(head.req_id) or ())
        return need <= mgr.pool.num_free - n

    def _arrival_limit(self, now: float, next_arrival: float, prev_duration: float) -> int:
        """Steps estimated to the next arrival from the last step's duration: a run is taken only if this
        reaches ``min_steps``, and priced for up to ``PRICE_AHEAD`` times it (the exact cut is made on the
        priced ends)."""
        if math.isfinite(next_arrival) and prev_duration > 0:
            return max(1, min(self.max_steps, int((next_arrival - now) / prev_duration) + 3))
        return self.max_steps

    def _bound(self, next_arrival: float) -> float:
        """The time a run is priced up to: the next arrival, or no time when cut lazily."""
        return math.inf if self.cut_lazily else next_arrival

    def plan(self, now: float, next_arrival: float, prev_duration: float, step: int) -> PendingRun | None:
        """Price the longest run allowed from ``now``; None when the next step is not a plain decode step
        or the runs from here would be shorter than ``min_steps`` (``min_steps_large`` for a batch of more
        than SMALL_BATCH requests; then single stepping is cheaper; same results). With nobody waiting, a
        run may stop at a request's last token and be chained (``plan_next``), so only the time to the next
        arrival has to reach it."""
        limit = self._arrival_limit(now, self._bound(next_arrival), prev_duration)
        # (the batch is the running requests, in some order)
        need = self.min_steps if len(self.sched.running) <= SMALL_BATCH else self.min_steps_large
        if limit < need or next_arrival <= now:   # (a fed engine not told of its next request)
            return None
        batch = self._batch()
        if batch is None or self._head_fits_anyway(len(batch)):
            return None
        if self._skip:   # the last attempts failed after their per-request work: back off
            self._skip -= 1
            return None
        run = self._plan_batch(now, next_arrival, limit, step, batch, need)
        if run is None:
            self._fails += 1
            self._skip = min(2 ** self._fails, MAX_BACKOFF_STEPS) - 1
        else:
            self._fails = 0
        return run

    def _plan_batch(self, now: float, next_arrival: float, limit: int, step: int,
                    batch: list[Request], min_steps: int) -> PendingRun | None:
        sched = self.sched
        chained = not len(sched.waiting)
        lane = sched._lane
        if lane is not None and (lane.last is not None or lane.prefills or len(lane) != len(batch)):
            lane = None
        if lane is not None:
            # the lane holds the batch (the running decodes, in running order): its arrays, no pass over the
            # requests; each table covers its computed tokens exactly (the scheduler's invariant)
            if not chained and lane.left < min_steps:
                return None
            c0, g0, out = lane.comp, lane.gen, lane.out
            l0 = -(-c0 // sched.manager.block_size)
        else:
            sched.sync_lane()   # the counters are read here
            cols = self._batch_columns(batch, None if chained else min_steps)
            if cols is None:
                return None
            c0, g0, out, l0 = cols
        run = self._price(now, next_arrival, limit, step, batch, c0, g0, l0, out - g0,
                          1 if chained else min_steps, None, chained)
        if run is not None and lane is not None:
            run.lane, run.lane_last = lane, lane.last_all
        return run

    def _batch_columns(self, batch: list[Request], min_left: int | None) -> tuple[np.ndarray, ...] | None:
        """(computed, generated, output, table length) of each request of ``batch`` as int64 arrays; None
        when a request is not one token from its next sample, or (given ``min_left``) has fewer tokens than
        that to go."""
        tables = self.sched.manager.block_tables
        if native is not None:   # (compiled: the columns, every request's check and the fewest left at once)
            cols = np.empty((5, len(batch)), dtype=np.int64)
            least = native.batch_columns(batch, tables, cols)
            if least < 0 or (min_left is not None and least < min_left):
                return None
            c0, g0, _, out, l0 = cols
            return c0, g0, out, l0
        if min_left is not None and min([r.output_len - r.num_generated for r in batch]) < min_left:
            return None   # (the usual stop when runs cannot be chained, tested early)
        rows = [(r.num_computed_tokens, r.num_generated, r.prompt_len, r.output_len, len(tables[r.req_id]))
                for r in batch]
        cols = np.fromiter(chain.from_iterable(rows), np.int64, 5 * len(rows)).reshape(len(rows), 5)
        c0, g0, prompt, out, l0 = cols.T
        if len(rows) <= SMALL_BATCH:   # every request one token from its next sample
            if any(g <= 0 or p + g - c != 1 for c, g, p, _, _ in rows):
                return None
        elif np.minimum.reduce(g0) <= 0 or np.count_nonzero(prompt + g0 - c0 != 1):
            return None
        return c0, g0, out, l0

    def plan_next(self, run: PendingRun, next_arrival: float, step: int) -> PendingRun | None:
        """The run that follows ``run`` (applied, at its end), from the arrays it carried: the same batch
        less the requests it finished, every counter k further, no per-request work. None when single
        stepping must take over (somebody waits, or nobody is left)."""
        sched = self.sched
        if len(sched.waiting) or sched.swapped or sched._prefilling or next_arrival <= run.end:
            return None
        k = run.k
        keep = run.rem > k
        kept = np.count_nonzero(keep)
        if not kept:
            return None
        batch = run.batch if kept == len(keep) else [r for r, f in zip(run.batch, keep.tolist()) if f]
        c0 = run.c0a[keep] + k
        bs = sched.manager.block_size
        end = run.end
        limit = self._arrival_limit(end, self._bound(next_arrival), float(run.durations[k - 1]))
        nxt = self._price(end, next_arrival, limit, step, batch, c0, run.g0a[keep] + k, -(-c0 // bs),
                          run.rem[keep] - k, 1, end, True)
        if nxt is not None and run.lane is not None and run.lane is sched._lane:   # (it followed the run)
            nxt.lane = run.lane
        return nxt

    def _price(self, now: float, next_arrival: float, limit: int, step: int, batch: list[Request],
               c0: np.ndarray, g0: np.ndarray, l0: np.ndarray, rem: np.ndarray, min_steps: int,
               last_token: float | None, nobody_waits: bool) -> PendingRun | None:
        """Bound, price and cut the run of ``batch`` (computed ``c0``, generated ``g0``, table lengths ``l0``,
        remaining ``rem``) starting at ``now``. With nobody waiting (no admission can follow a finish), the
        run may go on past requests' last tokens, until the last one's."""
        sched = self.sched
        mgr = sched.manager
        through = nobody_waits and self.through_finishes
        bound = int(np.maximum.reduce(rem) if through else np.minimum.reduce(rem))
        if min(bound, limit) < min_steps:
            return None
        # priced past the estimate ``limit`` (PRICE_AHEAD times it): steps shorten as requests finish, and a
        # run that ends short of the arrival is chained at a run's cost; the exact cut is made on the ends
        k = min(bound, PRICE_AHEAD * limit, self.max_steps)
        free = mgr.pool.num_free   # (blocks freed by finishes inside are not counted: a bound, not exact)
        bs = mgr.block_size
        cap = rem if through else None
        # each request takes at most (k - 1) // bs + 1 blocks in k steps (its table covers what it computed)
        if len(c0) * ((k - 1) // bs + 1) > free and _blocks_needed(c0, l0, bs, k - 1, cap) > free:
            lo, hi = 0, k - 1   # invariant: A(lo - 1) <= free < A(hi); find the first j with A(j) > free
            while lo < hi:
                mid = (lo + hi) // 2
                if _blocks_needed(c0, l0, bs, mid, cap) > free:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
            if k < min_steps:
                return None
        if self._head is not None and last_token is None:   # the head must not fit after step 0's allocations
            head, num_new = self._head                      # (free only shrinks)
            need = -(-(head.num_computed_tokens + num_new) // bs) - len(mgr.block_tables.get(head.req_id) or ())
            if need <= free - _blocks_needed(c0, l0, bs, 0):
                return None
        run, seqs = self._price_steps(batch, c0, k, rem if through else None)
        d = np.asarray(run.durations, dtype=np.float64)
        ends, bad = _step_ends(now, d)
        if bad >= 0:
            raise KvsimError("executor", f"step {step + bad} returned a non-positive duration {d[bad]}")
        if self.cut_lazily:
            k = self._before_tie(ends, k)
            if k < 1:
                return None
        elif math.isfinite(next_arrival):
            first = int(ends[1:].searchsorted(next_arrival, side="left"))   # the step it reaches
            # (a step that ends exactly then is left to single stepping, whose event order decides)
            tie = first < len(ends) - 1 and ends[first + 1] == next_arrival
            k = min(k, first if self.stop_before_arrival or tie else first + 1 + self.staging)
            if self.arrival_times is not None:
                k = self._before_tie(ends, k)
            if k < 1:
                return None
        head = self._head[0] if self._head is not None and last_token is None else None
        return PendingRun(k, batch, c0.tolist(), g0.tolist(), rem, d, ends[: k + 1], run.breakdown, l0,
                          sched.num_waiting(), sched.num_swapped(), head, last_token, c0a=c0, g0a=g0, seqs=seqs)

    def _before_tie(self, ends: np.ndarray, k: int) -> int:
        """``k`` cut so that no step of the run ends exactly when the arrival process wakes."""
        times = self._times
        lo = bisect_right(times, ends[0])
        hi = bisect_right(times, ends[k], lo)
        if lo == hi:
            return k
        if self._native_ties:
            tie = native.first_tie(ends, k, self._arrival_times, lo, hi)
            return min(k, tie - 1) if tie >= 0 else k
        at = self.arrival_times[lo:hi]
        pos = ends[: k + 1].searchsorted(at, side="left")   # ends[pos] >= at, pos <= k
        tied = pos[ends[pos] == at]
        return min(k, int(tied.min()) - 1) if tied.size else k

    def blocks_held(self, run: PendingRun, now: float) -> int:
        """Blocks ``run`` holds at ``now`` (inside it) beyond those held at its start: those taken by the steps
        started by then (a step allocates as it starts), less the tables of the requests it has finished
        before then (request i computes its tokens up to c0_i + rem_i - 1; its table then covers them).
        Read by bisection on tables built once per run: a router may ask at every arrival."""
        step_ends, taken_at, finish_times, freed = self._holdings(run)
        j = min(bisect_right(step_ends, now), run.k - 1)   # the step in progress
        return bisect_right(taken_at, j) - freed[bisect_left(finish_times, now)]

    def _holdings(self, run: PendingRun) -> tuple[list, list, list, list]:
        """(step ends, the step of each block taken in ascending order, finish times ascending, tables
        freed by the first i finishes), cached on the run. Built for the steps priced; a cut run keeps
        them (it is asked only about times before its end, where they agree)."""
        if run._held is None:
            k, bs = run.k, self.sched.manager.block_size
            step_ends = run.ends[1: k + 1].tolist()
            rem, l0 = run.rem.tolist(), run.l0.tolist()
            if len(run.batch) <= SMALL_BATCH or (native is not None and run.c0a is not None):
                pos, taken_at, finals = small_batch_events(run, k, bs)
                run._events = (pos, taken_at, finals)
            else:
                taken_at = np.sort(boundary_steps(run.c0a, run.l0, run.rem, k, bs)[1]).tolist()
            finishes = sorted((r, i) for i, r in enumerate(rem) if r <= k)   # by finish time (stable)
            freed = [0]
            for r, i in finishes:
                freed.append(freed[-1] + max(l0[i], (run.c0[i] + r - 1) // bs + 1))
            run._held = (step_ends, taken_at, [step_ends[r - 1] for r, _ in finishes], freed)
        return run._held

    def cut(self, run: PendingRun, now: float) -> bool:
        """A request is routed to this engine at ``now``, inside ``run`` (cut lazily): the run ends with
        the step that ``now`` falls in, as if it had been planned knowing the arrival; with async
        scheduling, with the step after it where priced (planned before the request is handed over, as
        that step starts: the caller's part). Returns whether it goes on through that step."""
        k = int(run.ends[1: run.k + 1].searchsorted(now, side="left")) + 1
        if not (k <= run.k and run.ends[k - 1] < now < run.ends[k]):
            raise AssertionError(f"decode run: cut at {now!r} outside its steps or at a step's end")
        through = self.staging and k < run.k
        k += through
        run.k = k
        run.ends = run.ends[: k + 1]
        return through

    def _price_steps(self, batch: list[Request], c0: np.ndarray, k: int, rem: np.ndarray | None = None):
        """Prices of k decode steps of ``batch`` (step j: every context c0 + j); from the batch's size and
        context sum where the executor takes them, else through a plan. With ``rem``, request i takes part
        in steps j < rem_i only (the batch shrinks as requests finish); then also returns the requests in
        each step (else None)."""
        stretches = getattr(self.executor, "execute_decode_stretches", None)
        if rem is not None and int(np.minimum.reduce(rem)) < k:
            if stretches is not None and native is not None:   # (compiled: any batch)
                return stretches(*native.shrinking_stretches(c0, rem, k))
            if len(c0) <= SMALL_BATCH:
                sizes, lengths, bases = _shrinking_segments(c0.tolist(), rem.tolist(), k)
                if stretches is not None:
                    return stretches(sizes, lengths, bases)
                seqs = np.array(sizes, dtype=np.int64).repeat(lengths)
                ctx = np.array(bases, dtype=np.int64).repeat(lengths) + seqs * np.arange(k, dtype=np.int64)
                return self.executor.execute_decode_profile(seqs, ctx, (sizes, lengths)), seqs
            seqs, ctx = _shrinking_sums(c0, rem, k)
            return self.executor.execute_decode_profile(seqs, ctx), seqs
        n = len(batch)
        if stretches is not None:
            return stretches([n], [k], [int(c0.sum()) + n])[0], None
        sums = getattr(self.executor, "execute_decode_sums", None)
        if sums is not None:
            return sums(n, int(c0.sum()) + n, k), None
        tables = self.sched.manager.block_tables
        plan = StepPlan(scheduled=[ScheduledRequest(r.req_id, 1, c, tables[r.req_id])
                                   for r, c in zip(batch, c0.tolist())])
        return execute_decode_run(self.executor, plan, k), None
