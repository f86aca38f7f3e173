"""What every scheduler shares: admission checks, the post-step update, and step statistics.

A scheduler owns the queues and the KV manager. The engine calls, per step:

    plan = scheduler.schedule(now)      # who runs, how many tokens each; blocks allocated
    ...executor prices the plan, time advances by its duration...
    finished = scheduler.update(plan, result, now)   # tokens computed, tokens sampled, requests done

Invariant: after ``update`` every RUNNING request holds blocks for exactly its computed tokens
(rounded up to blocks), and every FINISHED or REJECTED request holds none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.kv.manager import KVCacheManager
from sim.request import Request, RequestStatus
from sim.sched.plan import StepPlan, StepResult


@dataclass(slots=True)
class StepStats:
    """Counters of the last planned step, read by the recorder."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preempted: int = 0
    num_swapped_out: int = 0
    num_swapped_in: int = 0
    num_sampled: int = 0      # tokens sampled in update(): the watchdog's measure of progress


@dataclass
class TokenGaps:
    """Inter-token gaps without one object per token: regular gaps (one step apart) are counted per step."""

    step_gaps: list[tuple[float, int]] = field(default_factory=list)  # (step duration, tokens with that gap)
    other_gaps: list[float] = field(default_factory=list)             # gaps spanning a preemption or a pause


class SchedulerBase:
    """Admission, the post-step update and bookkeeping; subclasses implement ``schedule``."""

    def __init__(self, config, manager: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.manager = manager
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = config.max_num_batched_tokens or max(max_model_len, 2048)
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self.num_preemptions = 0
        self.num_truncated = 0
        self.swapped_blocks = 0
        self.gaps = TokenGaps()
        self.stats = StepStats()
        self._batch: list[Request] = []   # requests of the last plan, in plan order

    # ------------------------------------------------------------ arrivals
    def reject_reason(self, req: Request) -> str:
        """Why ``req`` can never run here ('' when it can)."""
        if req.prompt_len >= self.max_model_len:
            return f"prompt of {req.prompt_len} tokens does not fit max_model_len {self.max_model_len}"
        if not self.config.chunked_prefill and req.prompt_len > self.max_num_batched_tokens:
            return (f"prompt of {req.prompt_len} tokens exceeds max_num_batched_tokens "
                    f"{self.max_num_batched_tokens} without chunked prefill")
        if not self.manager.can_ever_fit(req):
            need = self.manager.blocks_for(req.max_kv_tokens)
            return f"needs {need} KV blocks, the cache has {self.manager.num_blocks}"
        return ""

    def add_request(self, req: Request, now: float) -> bool:
        """Queue a new arrival, or reject it with a reason. Returns whether it was queued."""
        if req.prompt_len + req.output_len > self.max_model_len and req.prompt_len < self.max_model_len:
            req.output_len = self.max_model_len - req.prompt_len  # generation stops at the context limit
            self.num_truncated += 1
        reason = self.reject_reason(req)
        if reason:
            req.status = RequestStatus.REJECTED
            req.reject_reason = reason
            req.finish_s = now
            self.rejected.append(req)
            return False
        req.status = RequestStatus.WAITING
        self._enqueue(req)
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
        return 0

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Advance every scheduled request by its new tokens; sample, finish and free as due."""
        step_start = now - result.duration_s
        regular = 0
        done: list[Request] = []
        computed = 0
        sampled = 0
        for req, s in zip(self._batch, plan.scheduled):
            req.num_computed_tokens += s.num_new_tokens
            computed += s.num_new_tokens
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: no token sampled yet
            req.num_generated += 1
            sampled += 1
            if req.num_generated == 1:
                req.first_token_s = now
            elif req.last_token_s == step_start:
                regular += 1
            else:
                self.gaps.other_gaps.append(now - req.last_token_s)
            req.last_token_s = now
            if req.num_generated >= req.output_len:
                done.append(req)
        self.manager.note_computed(computed)
        self.stats.num_sampled = sampled
        if regular:
            self.gaps.step_gaps.append((result.duration_s, regular))
        if done:
            self._finish(done, now)
        return done

    def _finish(self, done: list[Request], now: float) -> None:
        for req in done:
            req.status = RequestStatus.FINISHED
            req.finish_s = now
            self.manager.free(req)
            self.finished.append(req)
        gone = {id(r) for r in done}
        self.running = [r for r in self.running if id(r) not in gone]

    def check_integrity(self) -> None:
        self.manager.check_integrity()
        for req in self.running:
            assert req.status == RequestStatus.RUNNING, f"request {req.req_id} in running with status {req.status!r}"
            assert req.num_computed_tokens <= req.num_tokens, f"request {req.req_id} computed past its tokens"
