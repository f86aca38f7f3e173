"""What every scheduler shares: admission checks, the post-step update, and step statistics.

A scheduler owns the queues and the KV manager. The engine calls, per step:

    plan = scheduler.schedule(now)      # who runs, how many tokens each; blocks allocated
    ...executor prices the plan, time advances by its duration...
    finished = scheduler.update(plan, result, now)   # tokens computed, tokens sampled, requests done

Invariant: after ``update`` every RUNNING request holds blocks for exactly its computed tokens
(rounded up to blocks), and every FINISHED or REJECTED request holds none (static batching: none
once its batch has ended).

Timeline: every state change appends one ``(req_id, time, Phase)`` record to ``transitions`` (a few per
request, never one per token; sim/sched/records.py keeps them in typed columns); ``timeline_frame()`` turns them into
state intervals for the plots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.kv.manager import KVCacheManager
from sim.request import Request, RequestStatus
from sim.sched.deadlines import InOrder
from sim.sched.plan import LaneEntries, ScheduledRequest, StepPlan, StepResult
from sim.sched.records import (
    PHASE_NAMES,
    Phase,
    TokenGaps,
    Transitions,
    intervals_frame,
    transition_intervals,
)

__all__ = ["Phase", "SchedulerBase", "StepStats"]   # (Phase lives in sim/sched/records.py)


@dataclass(slots=True)
class StepStats:
    """Counters of the last planned step, read by the recorder."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preempted: int = 0
    num_swapped_out: int = 0
    num_swapped_in: int = 0
    num_sampled: int = 0      # tokens sampled in update(): the watchdog's measure of progress


def batched_tokens(config, max_model_len: int) -> int:
    """A step's token budget: ``max_num_batched_tokens``, else max(max_model_len, 2048)."""
    return config.max_num_batched_tokens or max(max_model_len, 2048)


class SchedulerBase:
    """Admission, the post-step update and bookkeeping; subclasses implement ``schedule``."""

    def __init__(self, config, manager: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.manager = manager
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = batched_tokens(config, max_model_len)   # a step's token budget
        # one batch's (what a request must fit without chunked prefill, and the most a chunk computes): the
        # step's, but under pipeline parallelism, where a step stands for the p batches in flight
        # (sim/executors/pipeline.py)
        self.batch_tokens = self.max_num_batched_tokens
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self.aborted: list[Request] = []   # their clients gave up (``timeout_s``)
        # workload.timeout_s: a request not finished this long after its arrival is aborted at the next
        # schedule (continuous batching; sim/sched/continuous.py ``_expire``), in hand-over order
        # (sim/sched/deadlines.py; a disaggregated decode replica's by deadline: ``ByDeadline``)
        self.timeout_s: float | None = None
        self.deadlines: InOrder = InOrder()
        self.num_preemptions = 0
        self.num_truncated = 0
        self.swapped_blocks = 0
        self.gaps = TokenGaps()
        self.stats = StepStats()
        self._batch: list[Request] = []   # requests of the last plan, in plan order
        self.step_index = 0               # number of schedule() calls so far
        self.transitions = Transitions()                      # (req_id, time, Phase) records
        self._prefilling: set[int] = set()                    # req_ids in Phase.PREFILL
        self._num_swapped = 0                                 # requests whose KV is in CPU memory
        self._multi_seq = False   # set once a request with n > 1 or beam_width > 1 arrives (paged only)
        # forked sequences (sim/kv/sharing.py) under continuous batching; static batching reserves one
        # sequence per request, so its samples share that reservation
        self.forks = getattr(config, "batching", "continuous") == "continuous"
        # continuous batching: the running decodes as arrays (sim/sched/decode_lane.py), while valid, and
        # the one the last plan used
        self._lane = None
        self._plan_lane = None
        # requests waiting for a load from the prefix cache's host tier (continuous batching: continuous.py)
        self.loading: deque[tuple[float, Request]] = deque()
        # speculative decoding (sim/speculative.py; continuous batching): drafts a decode proposes, and the draws
        self.speculation = None
        # LoRA serving (sim/lora.py): the section, and where this engine's adapters are resident
        self.lora = None
        self.adapters = None

    def enable_speculation(self, speculation) -> None:
        """Decode with drafts: each decode step of a request verifies up to ``speculation.k`` drafted tokens.
        The per-request loop plans every step (a decode lane assumes one token a decode)."""
        self.speculation = speculation
        self.drop_lane()
        self._lane_policy = False

    def enable_lora(self, lora, adapters) -> None:
        """Serve LoRA adapters (sim/lora.py): a batch holds at most ``lora.max_loras`` of them, and each plan
        carries its adapters' tokens and the loads they need (``adapters``, an AdapterCache). The per-request
        loop plans every step (the plan reads each scheduled request's adapter)."""
        self.lora, self.adapters = lora, adapters
        self.drop_lane()
        self._lane_policy = False
        # (a head blocked on blocks may be skipped next step for its adapter, letting later ones start: so
        # admission tries every step)
        self._note_blocked = False

    def _plan_lora(self, plan, batch: list) -> None:
        """The plan's LoRA adapters (distinct ids of its requests), the tokens of the requests that name one,
        and the seconds their loads into GPU slots take (the adapter cache's residency moves on)."""
        adapters: set[int] = set()
        tokens = 0
        lora_id = -1
        for entry, req in zip(plan.scheduled, batch):
            if req is not None:   # (None: a forked request's further sequence, its adapter the request's)
                lora_id = req.lora_id
            if lora_id >= 0:
                adapters.add(lora_id)
                tokens += entry.num_new_tokens
        assert len(adapters) <= self.lora.max_loras, "a batch holds at most max_loras adapters"
        plan.lora_adapters, plan.lora_tokens = len(adapters), tokens
        plan.lora_load_s = self.adapters.activate(adapters) if adapters else 0.0

    # ------------------------------------------------------------ timeline
    def mark(self, req: Request, phase: Phase, now: float) -> None:
        """Record a state change; PREFILL is left for DECODE when the request samples a token."""
        tr = self.transitions
        tr.req_id.append(req.req_id)
        tr.time.append(now)
        tr.phase.append(phase)
        if phase == Phase.PREFILL:
            self._prefilling.add(req.req_id)
        else:
            self._prefilling.discard(req.req_id)

    def timeline_intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``transition_intervals`` of this scheduler's transitions."""
        return transition_intervals(self.transitions)

    def timeline_frame(self) -> pd.DataFrame:
        """State intervals (req_id, phase name, start_s, end_s), each ending where the next begins;
        the final DONE of a request is a point (end_s = start_s)."""
        return intervals_frame(*self.timeline_intervals(), PHASE_NAMES)

    # ------------------------------------------------------------ arrivals
    def reject_reason(self, req: Request) -> str:
        """Why ``req`` can never run here ('' when it can)."""
        if req.prompt_len >= self.max_model_len:
            return f"prompt of {req.prompt_len} tokens does not fit max_model_len {self.max_model_len}"
        if not self.config.chunked_prefill and req.prompt_len > self.batch_tokens:
            return (f"prompt of {req.prompt_len} tokens exceeds max_num_batched_tokens "
                    f"{self.batch_tokens} without chunked prefill")
        width = max(req.n, req.beam_width)
        if width > self.batch_tokens:
            return (f"{width} parallel sequences need {width} tokens per decode step, above "
                    f"max_num_batched_tokens {self.batch_tokens}")
        if not self.manager.can_ever_fit(req):
            region = getattr(self.manager, "region_tokens", None)   # contiguous baselines reserve a region
            need = self.manager.blocks_for(region(req) if region else req.max_kv_tokens)
            if width > 1 and region is None:   # its sequences share the prompt's full blocks, nothing after
                need += (width - 1) * (need - req.prompt_len // self.manager.block_size)
                return f"needs {need} KV blocks for its {width} sequences, the cache has {self.manager.num_blocks}"
            return f"needs {need} KV blocks, the cache has {self.manager.num_blocks}"
        return ""

    def served_output_len(self, req: Request) -> int:
        """``req``'s output length as served: generation stops at the context limit."""
        if req.prompt_len + req.output_len > self.max_model_len and req.prompt_len < self.max_model_len:
            return self.max_model_len - req.prompt_len
        return req.output_len

    def refusal(self, req: Request) -> str:
        """Why ``add_request`` would reject ``req`` now ('' when it would queue it; nothing changes)."""
        out = req.output_len
        req.output_len = self.served_output_len(req)   # (as add_request cuts it; undone below)
        try:
            return self.reject_reason(req)
        finally:
            req.output_len = out

    def would_reject(self, req: Request) -> bool:
        """Whether ``add_request`` would reject ``req`` now (nothing changes)."""
        return bool(self.refusal(req))

    def add_request(self, req: Request, now: float) -> bool:
        """Queue a new arrival, or reject it with a reason. Returns whether it was queued."""
        cap = self.served_output_len(req)
        if cap != req.output_len:
            req.output_len = cap
            self.num_truncated += 1
        reason = self.reject_reason(req)
        if reason:
            req.status = RequestStatus.REJECTED
            req.reject_reason = reason
            req.finish_s = now
            self.rejected.append(req)
            return False
        req.status = RequestStatus.WAITING
        if (req.n > 1 or req.beam_width > 1) and hasattr(self.manager, "on_token") and self.forks:
            self._multi_seq = True
        self.mark(req, Phase.WAITING, now)
        self._enqueue(req)
        if self.timeout_s is not None:
            self.deadlines.add(req)
        return True

    def _enqueue(self, req: Request) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ the step
    def schedule(self, now: float) -> StepPlan:
        raise NotImplementedError

    def has_work(self) -> bool:
        raise NotImplementedError

    def num_waiting(self) -> int:
        raise NotImplementedError

    def num_swapped(self) -> int:
        return self._num_swapped

    def release_held(self) -> bool:
        """Nothing runs and nothing could start: give back blocks that queued requests hold (True), if any
        (continuous batching: the requests back from their loads from the host tier)."""
        return False

    def _add(self, scheduled: list[ScheduledRequest], batch: list[Request], req: Request, num_new: int,
             stats: StepStats, drafts: int = 0) -> None:
        """Put ``req`` in the plan with ``num_new`` tokens to compute (its blocks already allocated); ``drafts``
        of them speculative (a decode verifying its drafts: all of its tokens count as decode tokens)."""
        scheduled.append(ScheduledRequest(req.req_id, num_new, req.num_computed_tokens,
                                          self.manager.block_tables[req.req_id], drafts))
        batch.append(req)
        if drafts:
            stats.num_decode_tokens += num_new
            return
        width = 1
        extra = 0
        if self._multi_seq:  # a forked request: one entry per sequence, the extra ones None in the batch
            tables = self.manager.seq_tables(req.req_id)
            width = len(tables)
            if width > 1:  # after a re-fork each sibling also recomputes its own generated tokens
                extra = getattr(self.manager, "sibling_recompute", {}).pop(req.req_id, 0)
            rid, sib_new, sib_ctx = req.req_id, num_new + extra, req.num_computed_tokens - extra
            scheduled.extend([ScheduledRequest(rid, sib_new, sib_ctx, t) for t in tables[1:]])
            batch.extend([None] * (width - 1))
        if num_new == 1 and req.num_generated > 0 and req.num_computed_tokens + 1 == req.num_tokens:
            stats.num_decode_tokens += width
        else:
            stats.num_prefill_tokens += num_new * width
        stats.num_prefill_tokens += extra * (width - 1)

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Advance every scheduled request by its new tokens; sample, finish and free as due."""
        step_start = now - result.duration_s
        regular = 0
        done: list[Request] = []
        computed = 0
        sampled = 0
        other_gaps = self.gaps.other_gaps
        prefilling = self._prefilling
        multi = self._multi_seq
        entries = plan.scheduled
        if type(entries) is LaneEntries:
            regular, computed, sampled = self._update_lane(self._plan_lane, now, step_start, done)
            entries = entries.rest
        lane = self._lane
        spec = self.speculation
        bs = self.manager.block_size
        n = 0
        for req, s in zip(self._batch, entries):
            if req is None:  # another sequence of the forked request before it: the same new tokens
                computed += n  # (its recomputed tokens, if any, were counted when it forked)
                continue
            n = s.num_new_tokens
            c = req.num_computed_tokens = req.num_computed_tokens + n
            computed += n
            if c < req.prompt_len + req.num_generated:
                continue  # a prefill chunk: no token sampled yet
            if spec is not None and s.num_draft_tokens:   # the accepted drafts and one token of the target's
                accepted = spec.accept(s.req_id, s.num_draft_tokens)
                rejected = s.num_draft_tokens - accepted
                if rejected:   # their KV is discarded, their slots given back
                    c = req.num_computed_tokens = c - rejected
                    computed -= rejected
                    if len(s.block_ids) * bs - c >= bs:   # (a whole block past the computed tokens)
                        self.manager.trim(req)
                g = req.num_generated = req.num_generated + 1 + accepted
                sampled += 1 + accepted
            else:
                g = req.num_generated = req.num_generated + 1
                sampled += 1
            first = prefilling and req.req_id in prefilling
            if first:
                self.mark(req, Phase.DECODE, now)
            if g == 1:
                req.first_token_s = now
            elif req.last_token_s == step_start:
                regular += 1
            else:
                other_gaps.append(now - req.last_token_s)
            req.last_token_s = now
            if first and lane is not None:   # it leaves the lane's prefills (for its decodes, unless done)
                if not (lane.finished_prefill(req) if g >= req.output_len else lane.prefilled(req)):
                    self.drop_lane()
                    lane = None
            if g >= req.output_len:
                done.append(req)
            elif multi and (req.n > 1 or req.beam_width > 1):
                self.manager.on_token(req)   # fork after the prompt; beam search redraws its beams
        self.manager.note_computed(computed)
        self.stats.num_sampled = sampled
        if regular:
            self.gaps.step_gaps.append((result.duration_s, regular))
        if done:
            self._finish(done, now)
        return done

    def _update_lane(self, lane, now: float, step_start: float, done: list[Request]) -> tuple[int, int, int]:
        """``update`` of the plan's decode lane: one token computed and sampled each; the finished are
        appended to ``done`` and leave the lane. Returns (regular gaps, tokens computed, sampled)."""
        n = len(lane)
        if n == 0:
            return 0, 0, 0
        last = lane.last
        if last is None:   # every decode sampled at the same time
            regular = n if lane.last_all == step_start else 0
            if not regular:
                self.gaps.other_gaps.extend([now - lane.last_all] * n)
        else:
            on_grid = last == step_start
            regular = int(np.count_nonzero(on_grid))
            if regular < n:
                self.gaps.other_gaps.extend((now - last[~on_grid]).tolist())
        lane.step(now)
        if lane is not self._lane:   # dropped while this step was planned: nobody else writes it back
            lane.sync()
        if lane.left <= 0:   # some decode sampled its last token
            reqs = lane.reqs
            at = lane.finished()
            lane.write(at)
            done.extend(reqs[i] for i in at)
            lane.drop(at)
        return regular, n, n

    def sync_lane(self) -> None:
        """Bring the requests' counters up to the decode lane's arrays (before anything reads them)."""
        if self._lane is not None:
            self._lane.sync()

    def drop_lane(self) -> None:
        """Give up the decode lane (its requests written back first): it is rebuilt when next needed."""
        if self._lane is not None:
            self._lane.sync()
            self._lane = None

    def _finish(self, done: list[Request], now: float) -> None:
        self._release_finished(done, now)
        gone = {id(r) for r in done}
        self.running = [r for r in self.running if id(r) not in gone]

    def _release_finished(self, done: list[Request], now: float) -> None:
        """``done`` finished at ``now``: status, finish time, memory freed, timeline (not yet out of
        ``running``)."""
        for req in done:
            req.status = RequestStatus.FINISHED
            req.finish_s = now
            self.manager.free(req)
            self.finished.append(req)
            self.mark(req, Phase.DONE, now)

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        for req in self.running:
            assert req.status == RequestStatus.RUNNING, f"request {req.req_id} in running with status {req.status!r}"
            assert req.num_computed_tokens <= req.num_tokens, f"request {req.req_id} computed past its tokens"
