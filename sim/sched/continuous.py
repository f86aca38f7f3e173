"""Continuous batching (Orca / vLLM): requests join and leave the batch at every step.

One step:

    0. round-robin only: when requests wait and the batch is full (no seat, or no memory for the head
       of the queue), running requests whose turn has lasted ``rr_quantum_steps`` steps, longest first
       and at most as many as the step's token budget can start from the queue, are preempted and go to the BACK of the queue (a request
       still in its prefill is skipped: every turn samples a token, so rotation cannot livelock).
    1. running requests each get their next tokens (1 for a decode, 1 + its drafts with speculative
       decoding; a chunk for a chunked prefill, decodes before prefill chunks). If a request's next block does not fit, a victim (latest arrival,
       lowest priority, or most generated) is preempted: by swap (its blocks copied to the CPU swap
       space, ``blocks_to_swap_out``) when ``preemption: swap`` and the space has room, else by recompute
       (blocks freed, computed tokens forgotten, requeued at the front).
    2. if nobody was preempted in 1: swapped requests come back first (``blocks_to_swap_in``), oldest
       first; only when none is left swapped are waiting requests admitted, in queue order, while the
       batch has a seat (``max_num_seqs``), the step has token budget (``max_num_batched_tokens``) and
       their blocks fit. The head of the queue blocks those behind it (no overtaking).
       A request whose prefix the prefix cache's host tier holds (sim/kv/host_tier.py) takes blocks for its
       GPU hits and the loaded blocks only, and waits aside (``loading``, no seat, no token budget) while
       they come over the host link (one load at a time, each block at ``load_s_per_block``: vLLM's
       WAITING_FOR_REMOTE_KVS); at the first step that starts after its load has ended, it goes back to
       the front of the queue, its prefix computed, and is admitted as any request is.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Callable

import numpy as np

from sim.kv.manager import KVCacheManager
from sim.native import native
from sim.request import Request, RequestStatus
from sim.sched.base import Phase, SchedulerBase, StepStats
from sim.sched.deadlines import mark_aborted
from sim.sched.decode_lane import DecodeLane
from sim.sched.plan import LaneEntries, ScheduledRequest, StepPlan
from sim.sched.queues import make_queue

_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.SWAPPED
LANE_MIN_BATCH = 24   # a decode lane is built for a batch of at least this many (smaller: the loop is cheaper;
                      # instructions under callgrind, the Azure hour's first 5,000 requests as given and outputs
                      # doubled: 24 the least of 16, 24 and 32, 0.3% / 0.5% fewer than 32 once the lane stopped
                      # testing every step for finishes; 3,000 synthetic -0.2%, 8-replica clusters -0.3% to +0.02%)
FINISH_BISECT_MAX = 8   # more requests finishing in one step: one filtering pass over ``running`` instead


def _rank_key(ranks: dict[int, int]) -> Callable[[Request], int]:
    """A request's rank (when it joined ``running``), as a bisection key."""
    def rank_of(req: Request) -> int:
        return ranks[req.req_id]
    return rank_of


class ContinuousScheduler(SchedulerBase):
    # the running decodes are kept as arrays (sim/sched/decode_lane.py) where the policy allows: same
    # plans and results as the per-request loop, at numpy cost per step
    use_lane: bool = True
    # a waiting head that could not get its blocks is not tried again until something it depends on changes
    # (``_blocked_head``): same plans and results as trying at every step
    remember_blocked_head: bool = True

    def __init__(self, config, manager: KVCacheManager, max_model_len: int) -> None:
        super().__init__(config, manager, max_model_len)
        self.waiting = make_queue(config.policy, manager)
        self.swapped: list[Request] = []   # swapped out under memory pressure; they return before admissions
        self._plan = StepPlan()
        self._ranks: dict[int, int] = {}   # running req_id -> when it joined running (running is in this order)
        self._next_rank = 0
        # a lane where the batch order is running order (the priority policy sorts it) and the manager is
        # the paged one (a decode token inside its last block needs no call)
        self._lane_policy = self.use_lane and config.policy != "priority" and isinstance(manager, KVCacheManager)
        # (the waiting head, the token budget, its computed tokens, the free blocks) when that head could not
        # get its blocks as the first admission of a step: with the same head, budget and computed count
        # and no more free blocks it cannot get them at a later step either (paged blocks, no prefix cache:
        # nothing else decides), so that step's admission stops at once (a saturated engine tries every step)
        self._blocked_head: tuple[Request, int, int, int] | None = None
        self._note_blocked = self.remember_blocked_head and isinstance(manager, KVCacheManager)
        # req_ids to queue ahead of everything when they arrive (``push_ahead``): a disaggregated decode
        # replica's requests whose KV arrived into blocks they hold (sim/cluster/disagg.py, pull)
        self.ahead: set[int] = set()
        self._ahead_waiting: set[int] = set()   # those of them queued and not yet admitted
        # (``loading``: requests waiting for their prefix from the host tier, (when the load ends, request), in
        # load order)
        self.load_s_per_block = 0.0   # a block's load over the host link (the executor's swap price)
        self._link_free = 0.0         # when the last load queued on the host link ends
        self._held_waiting: dict[int, Request] = {}   # back from their loads, queued, holding their blocks

    def _enqueue(self, req: Request) -> None:
        if req.req_id in self.ahead:
            self.ahead.discard(req.req_id)
            self._ahead_waiting.add(req.req_id)
            self.waiting.push_ahead(req)
        else:
            self.waiting.push(req)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.swapped) or bool(self.loading)

    def num_waiting(self) -> int:
        """Queued requests that are not swapped out (round-robin queues swapped ones too), and those
        waiting for a load from the host tier."""
        return len(self.waiting) - (self._num_swapped - len(self.swapped)) + len(self.loading)

    def _loads_ended(self, now: float) -> None:
        """The requests whose load has ended by ``now`` go back to the front of the queue, in load order."""
        loading = self.loading
        ready = []
        while loading and loading[0][0] <= now:
            ready.append(loading.popleft())
        for _, req in reversed(ready):
            self.waiting.push_front(req)
        for at, req in ready:   # (queued again from its load's end, as before it: waiting, or preempted)
            self._held_waiting[req.req_id] = req
            self.mark(req, Phase.PREEMPTED if req.num_preemptions else Phase.WAITING, at)

    def release_held(self) -> bool:
        """Nothing runs, nothing loads and nothing could start: the requests back from their loads give their
        blocks back (the loaded ones stay in the prefix cache, so a request finds them there when it starts
        again), leaving the cache to what comes first (a swapped request, or the queue's head, which fits an
        empty cache). False where none held any."""
        if not self._held_waiting:
            return False
        held = list(self._held_waiting.values())
        self._held_waiting.clear()
        for req in held:
            self.manager.free(req)
            req.num_computed_tokens = 0
        return bool(held)

    # ------------------------------------------------------------ preemption
    def _pick_victim(self, candidates: list[Request]) -> Request:
        if self.config.victim == "most_generated":
            return max(candidates, key=lambda r: (r.num_generated, r.arrival_s, r.req_id))
        if self.config.policy == "priority":
            return max(candidates, key=lambda r: (r.priority, r.arrival_s, r.req_id))
        return max(candidates, key=lambda r: (r.arrival_s, r.req_id))

    def _preempt(self, req: Request, now: float, rotate: bool = False) -> None:
        """Preempt ``req`` by swap (if configured and the swap space has room) or by recompute.

        ``rotate`` (round-robin): requeue at the back; otherwise a swapped request joins ``swapped`` and a
        recomputed one goes to the front of the queue."""
        manager = self.manager
        self.drop_lane()
        self._ranks.pop(req.req_id, None)
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.stats.num_preempted += 1
        if self.config.preemption == "swap" and manager.can_swap_out(req):
            pairs = manager.swap_out(req)
            self._plan.blocks_to_swap_out.extend(pairs)
            self.swapped_blocks += len(pairs)
            self.stats.num_swapped_out += 1
            self._num_swapped += 1
            req.status = _SWAPPED
            self.mark(req, Phase.SWAPPED, now)
            if rotate:
                self.waiting.push(req)
            else:
                self.swapped.append(req)
            return
        manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        self.mark(req, Phase.PREEMPTED, now)
        if rotate:
            self.waiting.push(req)
        else:
            self.waiting.push_front(req)

    def _expire(self, now: float) -> None:
        """Abort every request whose client gave up by ``now`` (arrival + ``timeout_s``) and that has not
        finished: a queued one leaves the queue, a running one its batch, its blocks freed as a finished
        request's are (full blocks stay in the prefix cache); a swapped-out one gives back its CPU blocks; one
        loading its prefix from the host tier, or back from its load, or queued ahead holding blocks (a decode
        replica's, its KV pulled into them) gives its blocks back. Deadlines are taken as ``deadlines``
        orders them (sim/sched/deadlines.py)."""
        limit = self.timeout_s
        ended = (RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED)
        while (req := self.deadlines.pop_due(now, limit)) is not None:
            if req.status in ended:
                continue
            if req.status == _RUNNING:
                self.drop_lane()
                self._ranks.pop(req.req_id, None)
                self.running = [r for r in self.running if r is not req]
                self.manager.free(req)
                where = "running"
            elif req.status == _SWAPPED:   # its blocks on the CPU (in ``swapped``, or queued by a rotation)
                if req in self.swapped:
                    self.swapped.remove(req)
                else:
                    self.waiting.remove(req)
                self._num_swapped -= 1
                self.manager.drop_swapped(req)
                where = "swapped"
            elif self.loading and any(r is req for _, r in self.loading):   # its prefix coming from the host tier
                self.loading = deque(entry for entry in self.loading if entry[1] is not req)
                self.manager.free(req)   # (the load under way still takes the link until it ends)
                where = "loading"
            else:   # queued: never started, or preempted by recompute (holding no blocks) ...
                self.waiting.remove(req)
                if req.req_id in self._ahead_waiting:   # ... or holding the blocks its pulled KV came into
                    self._ahead_waiting.discard(req.req_id)
                    self.manager.free(req)
                elif self._held_waiting.pop(req.req_id, None) is not None:   # ... or back from its load
                    self.manager.free(req)
                where = "queued"
            mark_aborted(req, now, limit, where)
            self.aborted.append(req)
            self.mark(req, Phase.DONE, now)

    def _rotate(self, now: float) -> None:
        """Round-robin time slice: expired turns (the head of ``running`` has run longest) make way."""
        if len(self.running) < self.config.max_num_seqs and self._head_fits():
            return  # not full: the waiting head gets in without anyone leaving
        limit = self.step_index - self.config.rr_quantum_steps
        n = self._startable()
        out: list[Request] = []
        for req in self.running:  # in turn order
            if len(out) == n or req.turn_start_step > limit:
                break
            if req.req_id not in self._prefilling:  # a turn ends only after a token: no livelock
                out.append(req)
        if out:
            gone = {id(r) for r in out}
            self.running = [r for r in self.running if id(r) not in gone]
            for req in out:
                self._preempt(req, now, rotate=True)

    def _startable(self) -> int:
        """How many queued requests this step's token budget could start (at least 1): rotating out more
        than that would only leave memory idle until later steps."""
        budget = self.max_num_batched_tokens - len(self.running)   # running decodes take a token each
        chunked = self.config.chunked_prefill
        n = 0
        for req in itertools.chain(self.swapped, self.waiting):
            need = 1 if req.status == _SWAPPED else req.num_tokens - req.num_computed_tokens
            if budget <= 0 or (need > budget and not chunked):
                break
            budget -= need
            n += 1
        return max(n, 1)

    def _head_fits(self) -> bool:
        req = self.swapped[0] if self.swapped else self.waiting.peek()
        if req.status == _SWAPPED:
            return self.manager.can_swap_in(req, req.num_tokens - req.num_computed_tokens)
        return self.manager.can_allocate(req, req.num_tokens - req.num_computed_tokens)

    # ------------------------------------------------------------ the step
    def schedule(self, now: float) -> StepPlan:
        cfg = self.config
        manager = self.manager
        stats = self.stats = StepStats()
        budget = self.max_num_batched_tokens
        chunked = cfg.chunked_prefill
        batch: list[Request] = []
        plan = self._plan = StepPlan()
        scheduled = plan.scheduled
        self.step_index += 1
        if self.timeout_s is not None and self.deadlines:   # (no method call a step without timeouts)
            self._expire(now)
        if self.loading:
            self._loads_ended(now)
        if manager.stale_pages:   # (window pages a prefill chunk left behind: freed before any allocation)
            manager.free_stale_pages()

        # 0. round-robin rotation (its preemptions do not hold back admissions)
        if cfg.policy == "round_robin" and self.running and (len(self.waiting) or self.swapped):
            self._rotate(now)
        rotated = stats.num_preempted

        # 1. the running batch (decodes first when prefills are chunked; best priority first under the
        #    priority policy, so that victims, taken from the requests not yet served, are the worst)
        queue = self.running
        order = queue
        bs = manager.block_size
        tables = manager.block_tables
        num_decode = 0
        lane = self._plan_lane = self._take_lane(budget, chunked) if self._lane_policy else None
        if lane is not None:   # the decodes at once; the prefills (a few) through the loop below
            scheduled = plan.scheduled = LaneEntries(lane.ids, lane.comp, tables, ctx_sum=lane.comp_sum)
            num_decode = len(lane)
            budget -= num_decode
            order = list(lane.prefills)
        elif cfg.policy == "priority":
            pre = self._prefilling
            order = sorted(queue, key=lambda r: (r.priority, chunked and r.req_id in pre, r.arrival_s, r.req_id))
        elif chunked and self._prefilling:
            pre = self._prefilling
            order = [r for r in queue if r.req_id not in pre] + [r for r in queue if r.req_id in pre]
        fast = manager.decode_fast_path
        spec = self.speculation.k if self.speculation is not None else 0
        running = _RUNNING
        make = ScheduledRequest
        add_scheduled = scheduled.append
        add_batch = batch.append
        allocate = manager.allocate_slots
        allocate_drafts = getattr(manager, "allocate_drafts", None)
        for idx, req in enumerate(order):
            if req.status != running:
                continue  # preempted earlier in this step
            computed = req.num_computed_tokens
            num_new = req.prompt_len + req.num_generated - computed
            drafts = 0
            if spec and num_new == 1 and req.num_generated:   # a decode proposes drafts (not past its output)
                drafts = max(0, min(spec, req.output_len - req.num_generated - 1, budget - 1))
                num_new += drafts
                if drafts and allocate_drafts(req, num_new, drafts):   # (else: the general path preempts)
                    add_scheduled(make(req.req_id, num_new, computed, tables[req.req_id], drafts))
                    add_batch(req)
                    num_decode += num_new
                    budget -= num_new
                    continue
            if (num_new == 1 and fast and budget > 0 and req.num_generated
                    and (computed % bs or allocate(req, 1))):
                # decode fast path: the next slot is inside the request's last block, or its next block
                # was allocated (a failed allocation changes nothing: the general path below preempts)
                add_scheduled(make(req.req_id, 1, computed, tables[req.req_id]))
                add_batch(req)
                num_decode += 1
                budget -= 1
                continue
            width = manager.seq_width_now(req.req_id) if self._multi_seq else 1
            if chunked and num_new > self.batch_tokens:   # (a chunk is one batch's: pipeline stages, runner.py)
                num_new = self.batch_tokens
            if chunked and num_new * width > budget:
                num_new = budget // width
            if num_new <= 0 or num_new * width > budget:
                continue
            # (a decode with drafts is here only because its allocation above failed: preempt at once)
            ok = not drafts and allocate(req, num_new)
            while not ok:
                victim = self._pick_victim([r for r in order[idx:] if r.status == _RUNNING])
                self._preempt(victim, now)
                if victim is req:
                    break
                ok = allocate_drafts(req, num_new, drafts) if drafts else allocate(req, num_new)
            if ok:
                self._add(scheduled, batch, req, num_new, stats, drafts)
                budget -= num_new * width
        if stats.num_preempted:
            queue = [r for r in queue if r.status == _RUNNING]
        self.running = queue
        stats.num_decode_tokens += num_decode

        # 2. swapped requests come back, then admissions
        if stats.num_preempted == rotated:
            if self.swapped:
                budget = self._swap_in(now, scheduled, batch, budget, stats)
            # (requests queued ahead hold their blocks: they start even while swapped ones cannot return)
            if len(self.waiting) and not self.swapped:
                self._admit(now, scheduled, batch, budget, stats)
            elif self._ahead_waiting and len(self.waiting):
                self._admit(now, scheduled, batch, budget, stats, ahead_only=True)
        if self._multi_seq:
            plan.blocks_to_copy.extend(manager.take_copies())
        if self.lora is not None:
            self._plan_lora(plan, batch)
        self._batch = batch
        return plan

    def _take_lane(self, budget: int, chunked: bool) -> DecodeLane | None:
        """The decode lane for this step, its boundary blocks allocated in batch order (as the loop would);
        None when the loop must plan the step (forked sequences, more decodes than token budget, prefills
        interleaved with decodes, or not enough free blocks for every boundary: somebody is preempted)."""
        manager = self.manager
        if self._multi_seq or not manager.decode_fast_path:
            self.drop_lane()
            return None
        lane = self._lane
        if lane is None:
            if len(self.running) < LANE_MIN_BATCH:
                return None
            lane = self._lane = DecodeLane.build(self.running, self._prefilling, self._ranks)
            if lane is None:
                return None
        n = len(lane)
        if n == 0 or n > budget or (lane.prefills and not chunked):
            self.drop_lane()   # the loop moves the requests past the arrays
            return None
        if native is not None and manager.grow_lane(lane):   # (compiled: found and allocated in one pass)
            return lane
        bs = manager.block_size
        if native is not None:   # (compiled: positions, computed counts and finals in one pass)
            at, computed, finals = native.lane_boundary(lane.comp, lane.gen, lane.out, bs)
        else:
            idx = (lane.comp % bs == 0).nonzero()[0]
            at = idx.tolist()
            computed, finals = lane.boundary(idx, bs) if at else ([], [])
        if at:
            if manager.boundary_need(lane.reqs, at, computed) > manager.pool.num_free:
                self.drop_lane()   # (a boundary takes at most a block, and a window's pages)
                return None
            reqs = lane.reqs
            # one block each, leaving the pool in batch order (allocate_slots' bookkeeping at once)
            if manager.prefix_cache is not None or not manager.grow_full_tables(reqs, at, computed, finals):
                lane.write(at)   # their counters are read by the allocation
                allocate = manager.allocate_slots
                for i in at:
                    if not allocate(reqs[i], 1):
                        raise AssertionError("decode lane: a free block was counted for every boundary")
        return lane

    def _finish(self, done: list[Request], now: float) -> None:
        """``running`` is in ascending rank (requests join at its end): each finished request is found by
        bisection on the ranks and deleted in place, instead of a pass over the batch."""
        self._release_finished(done, now)
        running, ranks = self.running, self._ranks
        if len(done) > FINISH_BISECT_MAX:
            gone = {id(r) for r in done}
            self.running = [r for r in running if id(r) not in gone]
            for req in done:
                ranks.pop(req.req_id, None)
            return
        rank_of = _rank_key(ranks)
        for req in done:
            i = bisect_left(running, ranks[req.req_id], key=rank_of)
            if not (i < len(running) and running[i] is req):
                raise AssertionError(f"request {req.req_id} finished but not found in running by its rank")
            del running[i]
            del ranks[req.req_id]

    def check_integrity(self) -> None:
        self.sync_lane()   # (the checks read the requests' counters)
        super().check_integrity()
        order = [self._ranks[r.req_id] for r in self.running]
        assert order == sorted(order) and len(self._ranks) == len(order), "running is not in rank order"
        manager = self.manager
        if isinstance(manager, KVCacheManager) and not self._multi_seq:   # (decode runs read table lengths so)
            bs = manager.block_size
            for req in self.running:
                have = len(manager.block_tables.get(req.req_id, ()))
                assert have == -(-req.num_computed_tokens // bs), (
                    f"request {req.req_id}: {have} blocks for {req.num_computed_tokens} computed tokens")
        lane = self._lane
        if lane is not None:   # the lane agrees with a fresh one built from the requests
            fresh = DecodeLane.build(self.running, self._prefilling, self._ranks)
            assert fresh is not None, "decode lane held for a batch that has none"
            assert [id(r) for r in lane.reqs] == [id(r) for r in fresh.reqs], "decode lane: requests differ"
            assert [id(r) for r in lane.prefills] == [id(r) for r in fresh.prefills], "decode lane: prefills differ"
            for name in ("ids", "comp", "gen", "out", "rank"):
                assert np.array_equal(getattr(lane, name), getattr(fresh, name)), f"decode lane: {name} differs"
            assert np.array_equal(lane.last_times(), fresh.last_times()), "decode lane: last token times differ"
            assert lane.left == fresh.left, "decode lane: fewest tokens left differs"
            assert lane.comp_sum == fresh.comp_sum, "decode lane: context sum differs"

    def _swap_in(self, now: float, scheduled: list[ScheduledRequest], batch: list[Request], budget: int,
                 stats: StepStats) -> int:
        """Bring swapped requests back, earliest arrival (or best priority) first, while they fit."""
        if self.config.policy == "priority":
            self.swapped.sort(key=lambda r: (r.priority, r.arrival_s, r.req_id))
        else:
            self.swapped.sort(key=lambda r: (r.arrival_s, r.req_id))
        n = 0
        for req in self.swapped:
            num_new = self._resume(req, now, scheduled, batch, budget, stats)
            if num_new == 0:
                break
            budget -= num_new
            n += 1
        del self.swapped[:n]
        return budget

    def _resume(self, req: Request, now: float, scheduled: list[ScheduledRequest], batch: list[Request],
                budget: int, stats: StepStats) -> int:
        """Swap ``req`` in and schedule its next tokens; returns how many (0: it does not fit now)."""
        if len(self.running) >= self.config.max_num_seqs or budget <= 0:
            return 0
        num_new = req.num_tokens - req.num_computed_tokens
        if num_new > budget:
            if not self.config.chunked_prefill:
                return 0
            num_new = budget
        if not self.manager.can_swap_in(req, num_new):
            return 0
        self._plan.blocks_to_swap_in.extend(self.manager.swap_in(req))
        ok = self.manager.allocate_slots(req, num_new)
        assert ok, "swap-in checked the blocks it needs"
        self._num_swapped -= 1
        stats.num_swapped_in += 1
        self._start(req, now, Phase.PREFILL if req.num_computed_tokens < req.prompt_len else Phase.DECODE)
        self._add(scheduled, batch, req, num_new, stats)
        return num_new

    def _admit(self, now: float, scheduled: list[ScheduledRequest], batch: list[Request], budget: int,
               stats: StepStats, ahead_only: bool = False) -> None:
        """Start waiting requests in queue order while seats, token budget and blocks last (``ahead_only``:
        only those queued ahead, ``push_ahead``)."""
        waiting = self.waiting
        manager = self.manager
        blocked = self._blocked_head
        if blocked is not None:
            head = waiting.peek()
            if (blocked[0] is head and blocked[1] == budget and blocked[2] == head.num_computed_tokens
                    and manager.pool.num_free <= blocked[3]):
                return
            self._blocked_head = None
        first_budget = budget
        max_seqs = self.config.max_num_seqs
        seats = len(self.running)
        if self._multi_seq:  # a request with n samples or beams takes that many seats
            seats = sum(max(r.n, r.beam_width) for r in self.running)
        caching = getattr(manager, "prefix_cache", None) is not None
        host = getattr(manager, "host", None) is not None
        bs = manager.block_size
        ahead = self._ahead_waiting
        lora = self.lora
        if lora is not None:   # the batch's adapters (vLLM skips a request whose adapter would be one too many)
            adapters = {r.lora_id for r in self.running if r.lora_id >= 0}
            skipped: list[Request] = []
        while len(waiting) and seats < max_seqs and budget > 0:
            req = waiting.peek()
            if ahead_only and req.req_id not in ahead:
                break
            if lora is not None and req.lora_id >= 0 and req.lora_id not in adapters:
                if len(adapters) >= lora.max_loras:
                    skipped.append(waiting.pop())   # (it keeps its place: back at the front below)
                    continue
                # (counted from here on: a request that does not start now ends the loop, but one sent to load
                # its prefix from the host tier holds its adapter's place this step too)
                adapters.add(req.lora_id)
            if req.status == _SWAPPED:  # round-robin: a rotated request swapped out, back at its turn
                if not self._resume(req, now, scheduled, batch, budget, stats):
                    break
                waiting.pop()
                budget -= scheduled[-1].num_new_tokens
                continue
            width = max(req.n, req.beam_width) if self._multi_seq else 1
            if seats + width > max_seqs and seats:
                break
            cached = manager.match_prefix_blocks(req) if caching else None   # reused blocks skip their compute
            loaded = manager.host_run(req, len(cached)) if host else 0      # and so do those loaded back
            if loaded:   # its blocks now, its compute once they are loaded
                if not manager.allocate_slots(req, 0, cached, loaded):
                    break
                waiting.pop()
                if ahead:
                    ahead.discard(req.req_id)
                self._link_free = ready = max(now, self._link_free) + loaded * self.load_s_per_block
                self.loading.append((ready, req))
                self.mark(req, Phase.HOST_LOAD, now)
                continue
            num_new = req.num_tokens - req.num_computed_tokens - (len(cached) * bs if caching else 0)
            if self.config.chunked_prefill and num_new > self.batch_tokens:   # (a chunk is one batch's)
                num_new = self.batch_tokens
            if num_new > budget:
                # a recomputed prompt + output may exceed the budget: let it run alone rather than never
                if not self.config.chunked_prefill and scheduled:
                    break
                if self.config.chunked_prefill:
                    num_new = budget
            if not manager.allocate_slots(req, num_new, cached):
                if budget == first_budget and self._note_blocked and not caching and width == 1:   # (first try)
                    self._blocked_head = (req, budget, req.num_computed_tokens, manager.pool.num_free)
                break
            waiting.pop()
            if ahead:
                ahead.discard(req.req_id)
            if self._held_waiting:
                self._held_waiting.pop(req.req_id, None)
            seats += width
            if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first admission
                req.first_scheduled_s = now
            # (a request handed to a decode replica with its prompt's KV decodes from its first step there)
            self._start(req, now, Phase.DECODE if req.kv_received else Phase.PREFILL)
            req.kv_received = False
            self._add(scheduled, batch, req, num_new, stats)
            budget -= num_new
        if lora is not None:   # the skipped ones back where they were (a priority queue: by their rank)
            for req in reversed(skipped):
                waiting.push_front(req)

    def _start(self, req: Request, now: float, phase: Phase) -> None:
        """``req`` joins the running batch; its round-robin turn starts now."""
        req.status = _RUNNING
        req.turn_start_step = self.step_index
        self.running.append(req)
        rank = self._ranks[req.req_id] = self._next_rank
        self._next_rank += 1
        self.mark(req, phase, now)
        lane = self._lane
        if lane is not None:
            if phase == Phase.PREFILL:
                lane.joined(req, rank)
            else:
                self.drop_lane()
