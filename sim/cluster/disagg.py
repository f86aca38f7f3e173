"""Disaggregated prefill/decode: the handoff of a request from a prefill replica to a decode replica.

    arrival -> router -> prefill replica: computes the prompt, samples the first token (TTFT ends here)
            -> pull (default, vLLM's KV connectors): router -> decode replica, which allocates blocks for
               the prompt and the next token (first come first served, once nothing of its own waits and
               it has a seat and the blocks); then the KV (prompt_len x the model's KV bytes per token)
               goes over the link; the prefill replica holds its blocks until the transfer ends, however
               long the decode side keeps it waiting
            -> push (a KV store between the pools): the KV goes over the link at once, the prefill replica
               frees its blocks at the transfer's end; then router -> decode replica (``layerwise``: the
               layers went over the link while the prefill ran, so less of the transfer is left, link.py)
            -> decode replica: queued like any arrival, with num_computed_tokens = prompt_len and one token
               generated; admitted (pull: its blocks are there) and decodes the rest

The seam (vLLM's KV-connector hooks, done from outside the scheduler through its entry points):
- on the prefill replica the request runs with ``output_len = 1``, so the scheduler finishes it after
  the first token; the prefill manager's ``free`` is wrapped so that, for such a request, the free is
  deferred to the end of its transfer (vLLM's ``request_finished`` returning "delay free");
- pull: the decode manager's ``allocate_slots`` books the blocks before the transfer, and the prompt's KV
  as held there (``note_computed``: the connector writes it into those blocks; vLLM's
  ``update_state_after_alloc`` for a request waiting for remote KV), only while the replica has nothing
  waiting and a seat for it (``_reserve``); the queue goes on after each decode step (the engine's
  ``on_step``: finishes and frees applied, the next step not yet planned); a request whose KV has arrived
  is queued ahead of everything (``ContinuousScheduler.ahead``, ``push_ahead``): it holds its blocks and
  a seat, so nothing that waits can hold it back, and the replica always has work it can start;
- the decode scheduler's ``add_request`` takes the request as it is; its admission (``match_prefix``
  returns nothing for a request with computed tokens) allocates blocks for its prompt plus the next
  token (pull: already there); push: the decode manager's ``allocate_slots`` is wrapped to book the
  received prompt tokens as held KV (``note_computed``) then, as a swap-in would.
Client timeouts (``workload.timeout_s``; the compiled core aborts alike, core/disagg.inc): a request whose client gives up while its prefill
is queued or running is aborted by the prefill replica's scheduler at its next step; while it waits in a
decode replica's queue for its blocks (pull), at its deadline exactly, its prefill blocks freed then; during
its transfer, when the transfer lands (the link is not freed early), the decode blocks it had booked (pull)
freed; on its decode replica, by that scheduler at its next step (deadlines there by time, not hand-over
order). An abort in the queue or the transfer counts on the request's prefill replica (the decode pool
never had it).
Transferred bytes: every prompt token of every request that decodes (output_len > 1); the decode side's
prefix cache is not consulted before the transfer (no deduplication). A request with one output token
finishes on its prefill replica and transfers nothing. One the decode pool would refuse (its replicas
admit alike) is refused on arrival at its prefill replica, with the decode pool's reason: nothing is
computed, held or sent for it. A request that never leaves its prefill replica (refused, or given up
there) keeps its own output length in the results (``restore_lengths``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

import simpy

from sim.cluster.link import KVLink
from sim.cluster.replica import Replica
from sim.cluster.routers import Router
from sim.engine import delay_to
from sim.request import Request
from sim.sched.base import SchedulerBase
from sim.sched.deadlines import ByDeadline, UnlessHandedOn, mark_aborted


def decode_refusal(decode: SchedulerBase, req: Request) -> str:
    """Why the decode pool (``decode``: one of its schedulers; they admit alike) would refuse ``req`` with its
    own output length, as its prefill replica says it ('' if it would not)."""
    why = decode.refusal(req)
    return f"the decode pool refuses it: {why}" if why else ""


class Handoff:
    """Moves finished prefills to the decode pool; tells the decode pool when no more will come."""

    def __init__(self, env: simpy.Environment, decode: Sequence[Replica], router: Router, link: KVLink,
                 kv_bytes_per_token: int, pull: bool = True, layers: int = 0, timeout_s: float | None = None) -> None:
        self.env = env
        self.decode = decode
        self.router = router
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.pull = pull
        self.layers = layers   # > 0: pushed KV leaves layer by layer during the prefill (link.py)
        self.timeout_s = timeout_s   # workload.timeout_s: the client gives up this long after sending
        self.aborted_at: dict[int, float] = {}    # req_id -> when the handoff aborted it (queued or in transfer)
        # pull: per decode replica, the requests routed there waiting for their blocks (FIFO), and those
        # holding blocks there whose KV is on its way (each will take a seat on arrival)
        self._queued: list[deque[tuple[Request, Callable[[Request], None], Replica]]] = [deque() for _ in decode]
        self._reserved = [0] * len(decode)
        self.output_len: dict[int, int] = {}      # req_id -> the request's own output_len
        self.cached_tokens: dict[int, int] = {}   # req_id -> prefix-cache hit at its prefill
        self.prefill_of: dict[int, int] = {}      # req_id -> prefill replica id
        self.decode_of: dict[int, int] = {}       # req_id -> decode replica id
        self.transfer_s: dict[int, float] = {}
        self.transfer_start: dict[int, float] = {}   # req_id -> when its KV started over the link
        self.prefill_end: dict[int, float] = {}      # req_id -> when its prefill ended (handed over then)
        self.in_flight = 0
        self.done_on_prefill = 0                  # requests of one output token, finished on their prefill replica
        self._drained: simpy.Event | None = None
        self._incoming: set[int] = set()          # handed to a decode replica, not yet admitted there
        self.refused: dict[int, str] = {}         # req_id -> why the decode pool would refuse it (refused at once)

    # ------------------------------------------------------------ prefill side
    def attach_prefill(self, rep: Replica) -> None:
        manager = rep.manager
        free = manager.free
        rep.engine.may_block = True
        if self.timeout_s is not None:   # (what it has handed on is no longer its own to abort)
            rep.scheduler.deadlines = UnlessHandedOn(self.prefill_of)
        refused = self.refused

        def reject_reason(req: Request, _own: Callable[[Request], str] = rep.scheduler.reject_reason) -> str:
            return _own(req) or refused.get(req.req_id, "")   # (its own reason first, then the decode pool's)

        rep.scheduler.reject_reason = reject_reason

        def deferred_free(req: Request, _free: Callable[[Request], None] = free) -> None:
            rid = req.req_id
            if rid in self.output_len and req.num_generated >= req.output_len and rid not in self.prefill_of:
                self.prefill_of[rid] = rep.replica_id
                self.cached_tokens[rid] = req.num_cached_tokens
                if self.output_len[rid] <= 1:     # nothing to decode: done here
                    self.done_on_prefill += 1
                    _free(req)
                    return
                self.in_flight += 1
                self.prefill_end[rid] = self.env.now
                if self.pull:
                    self._route(req, _free, rep)
                else:
                    self.env.process(self._transfer(req, _free, rep))
                return
            _free(req)

        manager.free = deferred_free

    def submit_prefill(self, rep: Replica, req: Request) -> None:
        self.output_len[req.req_id] = req.output_len
        if req.output_len > 1:
            why = decode_refusal(self.decode[0].scheduler, req)
            if why:
                self.refused[req.req_id] = why
        req.output_len = 1
        rep.submit(req)

    def restore_lengths(self, requests: Sequence[Request]) -> None:
        """After the run: a request that never left its prefill replica (refused, or given up there) gets its
        own output length back (it ran there with one token)."""
        for req in requests:
            rid = req.req_id
            if rid in self.output_len and rid not in self.prefill_of and rid not in self.aborted_at:
                req.output_len = self.output_len[rid]

    def _send(self, req: Request, free: Callable[[Request], None], src: Replica):
        """The KV over the link; then the prefill side lets go of its blocks."""
        start = self.transfer_start[req.req_id] = self.env.now
        nbytes = req.prompt_len * self.kv_bytes_per_token
        if self.layers and not req.num_preemptions:   # (a preempted prefill's early KV was thrown away)
            yield from self.link.send(nbytes, ready_from=req.first_scheduled_s, tail_bytes=nbytes / self.layers)
        else:
            yield from self.link.send(nbytes)
        free(req)                                  # the prefill side lets go of the blocks now
        src.engine.wake()                          # a prefill waiting for memory may go on
        self.transfer_s[req.req_id] = self.env.now - start

    def _transfer(self, req: Request, free: Callable[[Request], None], src: Replica):
        """push: the KV leaves at once; the decode replica is chosen when it has landed."""
        yield from self._send(req, free, src)
        req.output_len = self.output_len[req.req_id]
        if self._expired(req):   # its client gave up during the transfer
            self._abort(req, "in transfer")
            return
        self._hand_over(req, self.router.choose(req, self.decode))

    def _pulled(self, req: Request, free: Callable[[Request], None], src: Replica, i: int, reserved: bool):
        """pull: the decode replica ``i`` holds the request's blocks (``reserved``; else it will reject the
        request); the KV comes."""
        yield from self._send(req, free, src)
        self.decode[i].incoming -= 1
        if reserved:
            self._reserved[i] -= 1
        if self._expired(req):   # its client gave up during the transfer: the booked blocks go back
            if reserved:
                self.decode[i].manager.free(req)
            self._abort(req, "in transfer")
        else:
            if reserved:   # it holds its blocks: admitted before anything waiting
                self.decode[i].scheduler.ahead.add(req.req_id)
            self._hand_over(req, i, booked=reserved)
        if self._queued[i]:   # (a rejection takes no step: the queue goes on now)
            self._reserve(i)

    def _hand_over(self, req: Request, i: int, booked: bool = False) -> None:
        """Submit ``req`` to decode replica ``i``; ``booked``: its received KV is already booked there."""
        self.decode_of[req.req_id] = self.decode[i].replica_id
        req.kv_received = True                     # its first step there decodes (ContinuousScheduler._admit)
        if not booked:
            self._incoming.add(req.req_id)
        self.decode[i].submit(req)
        self._left()

    def _left(self) -> None:
        """A request has left the handoff (handed over, or aborted on the way)."""
        self.in_flight -= 1
        if not self.in_flight and self._drained is not None and not self._drained.triggered:
            self._drained.succeed()

    def _expired(self, req: Request) -> bool:
        return self.timeout_s is not None and req.arrival_s + self.timeout_s <= self.env.now

    def _abort(self, req: Request, where: str) -> None:
        """``req``'s client has given up while the handoff held it (``where``). Not in a scheduler's
        ``aborted`` (its prefill replica finished it, and counts it in its load as ended; the decode pool never
        had it): ``aborted_at`` keeps it, and replicas.csv counts it on its prefill replica."""
        now = self.env.now
        mark_aborted(req, now, self.timeout_s, where)
        self.aborted_at[req.req_id] = now
        self._left()

    def _give_up_queued(self, req: Request, i: int, _event=None) -> None:
        """pull, at ``req``'s deadline: if it still waits for its blocks on decode replica ``i``, it leaves the
        queue, and its prefill replica lets go of its blocks."""
        queued = self._queued[i]
        at = next((k for k, entry in enumerate(queued) if entry[0] is req), None)
        if at is None:   # (its blocks were booked: the transfer, or the decode replica, aborts it)
            return
        _, free, src = queued[at]
        del queued[at]
        self.decode[i].incoming -= 1
        free(req)
        src.engine.wake()
        self._abort(req, "waiting for a decode seat")
        if queued:
            self._reserve(i)

    def _route(self, req: Request, free: Callable[[Request], None], src: Replica) -> None:
        """pull: choose the decode replica now (it counts the request in its load from now on) and queue
        the request there for its blocks."""
        req.output_len = self.output_len[req.req_id]
        i = self.router.choose(req, self.decode)
        self.decode[i].incoming += 1
        self._queued[i].append((req, free, src))
        self._reserve(i)
        if self.timeout_s is not None:
            deadline = req.arrival_s + self.timeout_s
            now = self.env.now
            delay = delay_to(now, deadline) if deadline > now else 0.0
            self.env.timeout(deadline - now if delay is None else delay).callbacks.append(
                partial(self._give_up_queued, req, i))

    def _reserve(self, i: int) -> None:
        """pull: the requests routed to decode replica ``i`` take their blocks there (prompt and next token),
        oldest first, as vLLM's decode scheduler allocates for a request waiting for remote KV: while nothing
        on the replica waits (its waiting and swapped requests come first), a seat is free for each
        (running plus those whose KV is on its way) and the blocks fit; each one's transfer then starts."""
        queued = self._queued[i]
        sched = self.decode[i].scheduler
        manager = sched.manager
        seats = sched.config.max_num_seqs
        while queued:
            req, free, src = queued[0]
            if len(sched.waiting) or sched.swapped or len(sched.running) + self._reserved[i] >= seats:
                return
            reserve = not sched.would_reject(req)
            if reserve:
                full = req.output_len
                req.output_len = sched.served_output_len(req)   # the length admission will see (it cuts it)
                ok = manager.allocate_slots(req, 1)
                req.output_len = full
                if not ok:
                    return
                manager.note_computed(req.num_computed_tokens)   # the prompt's KV is written there (pulled)
                self._reserved[i] += 1
            queued.popleft()
            self.env.process(self._pulled(req, free, src, i, reserve))

    # ------------------------------------------------------------ decode side
    def attach_decode(self, rep: Replica) -> None:
        manager = rep.manager
        allocate = manager.allocate_slots
        incoming = self._incoming
        if self.timeout_s is not None:   # (handed over as their prefills end: deadlines in no order)
            rep.scheduler.deadlines = ByDeadline()
        if self.pull:   # after each of its steps (finishes and frees applied), the replica's queue goes on
            # nothing startable may be a wait for a request whose KV is on its way into blocks it holds:
            # its arrival (submit) wakes the engine
            rep.engine.may_block = True
            i = next(k for k, r in enumerate(self.decode) if r is rep)
            before = rep.engine.on_step

            def then_reserve(step: int, _before: Callable[[int], None] | None = before) -> None:
                if _before is not None:
                    _before(step)
                if self._queued[i]:
                    self._reserve(i)

            rep.engine.on_step = then_reserve

        def allocate_received(req: Request, num_new_tokens: int, cached=None, loaded: int = 0, drafts: int = 0,
                              _alloc=allocate) -> bool:
            if drafts:   # (a decode verifying drafts: its prompt's KV was received before it first ran)
                return _alloc(req, num_new_tokens, drafts=drafts)
            ok = _alloc(req, num_new_tokens, cached, loaded) if loaded else _alloc(req, num_new_tokens, cached)
            if ok and req.req_id in incoming:
                incoming.discard(req.req_id)
                manager.note_computed(req.num_computed_tokens)   # the received prompt KV is held here
            return ok

        manager.allocate_slots = allocate_received

    def close_after(self, prefill_loops: list[simpy.Process]):
        """A process: once every prefill engine has stopped and the last transfer has landed, the decode
        engines are told that no more requests will come."""
        yield self.env.all_of(prefill_loops)
        if self.in_flight:
            self._drained = self.env.event()
            yield self._drained
        for rep in self.decode:
            rep.engine.end_arrivals()
