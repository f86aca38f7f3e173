"""Static batching (request-level scheduling, as before Orca): a batch runs to its last request.

    step:     0        1    2   ...  29   30  ...  49   50  ...  99  100 ... 199
    A (100):  prefill  decode ................................ done  idle ........
    B (50):   prefill  decode .................. done  idle ...........................
    C (200):  prefill  decode ............................................... done -> batch ends
    D (30):   prefill  decode ..... done  idle ............................................
    E:        waiting ................................................................. (next batch)

When the engine has no batch, up to ``max_num_seqs`` waiting requests, in queue order, form one: each
reserves the memory for its whole prompt + output at once (a request that does not fit ends the batch
formation), and their prompts prefill together (within ``max_num_batched_tokens``). The batch then
decodes until its last request finishes. Finished requests keep their memory (IDLE) until the batch
ends; nobody joins a running batch, so nothing is ever preempted. A client timeout (``workload.timeout_s``)
takes a queued request out of the queue, and a batch member out of the batch at the step that starts at or
after its deadline; its memory stays with the batch until the batch ends, as a finished member's does.
"""

from __future__ import annotations

from sim.kv.manager import KVCacheManager
from sim.request import Request, RequestStatus
from sim.sched.base import Phase, SchedulerBase, StepStats
from sim.sched.deadlines import mark_aborted
from sim.sched.plan import StepPlan
from sim.sched.queues import make_queue


class StaticScheduler(SchedulerBase):
    def __init__(self, config, manager: KVCacheManager, max_model_len: int) -> None:
        super().__init__(config, manager, max_model_len)
        self.waiting = make_queue(config.policy if config.policy == "priority" else "fcfs")
        self.held: list[Request] = []   # finished members of the current batch, memory not yet released

    def _enqueue(self, req: Request) -> None:
        self.waiting.push(req)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def num_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self, now: float) -> StepPlan:
        stats = self.stats = StepStats()
        self.step_index += 1
        if self.timeout_s is not None and self.deadlines:
            self._expire(now)
        if not self.running:
            self._form_batch(now)
        plan = StepPlan()
        batch: list[Request] = []
        for req in self.running:
            num_new = req.num_tokens - req.num_computed_tokens
            ok = self.manager.allocate_slots(req, num_new)
            assert ok, f"request {req.req_id}: static batching reserved its memory at admission"
            self._add(plan.scheduled, batch, req, num_new, stats)
        self._batch = batch
        return plan

    def _form_batch(self, now: float) -> None:
        waiting = self.waiting
        manager = self.manager
        budget = self.max_num_batched_tokens
        pending = 0  # blocks promised to forked requests (n > 1): counted now, allocated on demand
        while len(waiting) and len(self.running) < self.config.max_num_seqs:
            req = waiting.peek()
            if self.running and req.prompt_len > budget:
                break
            width = max(req.n, req.beam_width)
            spare = manager.num_free_blocks() - pending
            if self._multi_seq and width > 1:
                need = manager.blocks_for(req.max_kv_tokens) * width
                if need > spare and self.running:  # the first one fits by itself (it passed admission)
                    break
                pending += need
            elif manager.blocks_needed(req, req.max_kv_tokens) > spare or not manager.allocate_slots(
                    req, req.max_kv_tokens):  # prompt + output, reserved now
                break
            waiting.pop()
            req.status = RequestStatus.RUNNING
            req.first_scheduled_s = now
            self.running.append(req)
            self.mark(req, Phase.PREFILL, now)
            budget -= req.prompt_len

    def _expire(self, now: float) -> None:
        """Abort every request whose client gave up by ``now``: a queued one leaves the queue; a batch member
        leaves the batch and idles with its memory until the batch ends (``_leave``)."""
        limit = self.timeout_s
        gone = []
        while (req := self.deadlines.pop_due(now, limit)) is not None:
            if req.status in (RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED):
                continue
            where = "running" if req.status == RequestStatus.RUNNING else "queued"
            if where == "queued":
                self.waiting.remove(req)
            mark_aborted(req, now, limit, where)
            self.aborted.append(req)
            if where == "queued":
                self.mark(req, Phase.DONE, now)
            else:
                gone.append(req)
        if gone:
            self._leave(gone, now)

    def _finish(self, done: list[Request], now: float) -> None:
        """Finished requests idle with their memory until the batch's last request finishes."""
        for req in done:
            req.status = RequestStatus.FINISHED
            req.finish_s = now
            self.finished.append(req)
        self._leave(done, now)

    def _leave(self, done: list[Request], now: float) -> None:
        """``done`` (finished or aborted) leave the batch and idle with their memory until it ends."""
        for req in done:
            self.mark(req, Phase.IDLE, now)
        gone = {id(r) for r in done}
        self.running = [r for r in self.running if id(r) not in gone]
        self.held.extend(done)
        if not self.running:  # the batch is over: release everyone's memory
            for req in self.held:
                self.manager.free(req)
                self.mark(req, Phase.DONE, now)
            self.held = []

    def check_integrity(self) -> None:
        super().check_integrity()
        resident = {r.req_id for r in self.running} | {r.req_id for r in self.held}
        holders = {rid for rid, table in self.manager.block_tables.items() if table}
        assert holders <= resident, "a request outside the batch holds KV memory"
