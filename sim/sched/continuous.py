"""Continuous batching (Orca / vLLM): requests join and leave the batch at every step.

One step, as vLLM v1 schedules it:

    1. running requests, in batch order, each get their next tokens (1 for a decode; a chunk for a
       chunked prefill). If their next block does not fit, the victim (latest arrival by default)
       is preempted by recompute: its blocks are freed and it returns to the front of the queue.
    2. if nobody was preempted, waiting requests are admitted in queue order while the batch has a
       seat (``max_num_seqs``), the step has token budget (``max_num_batched_tokens``) and their
       prompt's blocks fit. The head of the queue blocks those behind it (no overtaking).
"""

from __future__ import annotations

from sim.kv.manager import KVCacheManager
from sim.request import Request, RequestStatus
from sim.sched.base import SchedulerBase, StepStats
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.sched.queues import make_queue


class ContinuousScheduler(SchedulerBase):
    def __init__(self, config, manager: KVCacheManager, max_model_len: int) -> None:
        super().__init__(config, manager, max_model_len)
        self.waiting = make_queue(config.policy)

    def _enqueue(self, req: Request) -> None:
        self.waiting.push(req)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def num_waiting(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------ preemption
    def _pick_victim(self, candidates: list[Request]) -> Request:
        if self.config.victim == "most_generated":
            return max(candidates, key=lambda r: (r.num_generated, r.arrival_s, r.req_id))
        if self.config.policy == "priority":
            return max(candidates, key=lambda r: (r.priority, r.arrival_s, r.req_id))
        return max(candidates, key=lambda r: (r.arrival_s, r.req_id))

    def _preempt(self, req: Request) -> None:
        """Recompute preemption: free the blocks, forget the computed tokens, requeue at the front."""
        self.manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.stats.num_preempted += 1
        self.waiting.push_front(req)

    # ------------------------------------------------------------ the step
    def schedule(self, now: float) -> StepPlan:
        cfg = self.config
        manager = self.manager
        stats = self.stats = StepStats()
        budget = self.max_num_batched_tokens
        chunked = cfg.chunked_prefill
        batch: list[Request] = []
        plan = StepPlan()
        scheduled = plan.scheduled

        # 1. the running batch
        queue = self.running
        kept: list[Request] = []
        i = 0
        while i < len(queue):
            req = queue[i]
            num_new = req.num_tokens - req.num_computed_tokens
            if chunked and num_new > budget:
                num_new = budget
            if num_new <= 0 or num_new > budget:
                kept.append(req)
                i += 1
                continue
            ok = manager.allocate_slots(req, num_new)
            while not ok:
                victim = self._pick_victim(queue[i:])
                queue.remove(victim)
                self._preempt(victim)
                if victim is req:
                    break
                ok = manager.allocate_slots(req, num_new)
            if not ok:
                continue  # req itself was preempted; queue[i] is now the next request
            self._add(scheduled, batch, req, num_new, stats)
            budget -= num_new
            kept.append(req)
            i += 1
        self.running = kept

        # 2. admissions
        if not stats.num_preempted:
            self._admit(now, scheduled, batch, budget, stats)
        self._batch = batch
        return plan

    def _admit(self, now: float, scheduled: list[ScheduledRequest], batch: list[Request], budget: int,
               stats: StepStats) -> None:
        waiting = self.waiting
        manager = self.manager
        max_seqs = self.config.max_num_seqs
        while len(waiting) and len(self.running) < max_seqs and budget > 0:
            req = waiting.peek()
            num_new = req.num_tokens - req.num_computed_tokens
            if num_new > budget:
                if not self.config.chunked_prefill:
                    break
                num_new = budget
            if not manager.allocate_slots(req, num_new):
                break
            waiting.pop()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first admission
                req.first_scheduled_s = now
            self.running.append(req)
            self._add(scheduled, batch, req, num_new, stats)
            budget -= num_new

    def _add(self, scheduled: list[ScheduledRequest], batch: list[Request], req: Request, num_new: int,
             stats: StepStats) -> None:
        scheduled.append(ScheduledRequest(req.req_id, num_new, req.num_computed_tokens,
                                          self.manager.block_tables[req.req_id]))
        batch.append(req)
        if num_new == 1 and req.num_generated > 0 and req.num_computed_tokens + 1 == req.num_tokens:
            stats.num_decode_tokens += 1
        else:
            stats.num_prefill_tokens += num_new
