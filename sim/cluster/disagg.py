"""Disaggregated prefill/decode: the handoff of a request from a prefill replica to a decode replica.

    arrival -> router -> prefill replica: computes the prompt, samples the first token (TTFT ends here)
            -> its KV blocks (prompt_len x the model's KV bytes per token) go over the link; the prefill
               replica holds them until the transfer ends, then frees them
            -> router -> decode replica: queued like any arrival, with num_computed_tokens = prompt_len
               and one token generated; admitted when its blocks fit; decodes the rest

The seam (vLLM's KV-connector hooks, done from outside the scheduler with its public entry points):
- on the prefill replica the request runs with ``output_len = 1``, so the scheduler finishes it after
  the first token; the prefill manager's ``free`` is wrapped so that, for such a request, the free is
  deferred to the end of its transfer (vLLM's ``request_finished`` returning "delay free");
- the decode scheduler's ``add_request`` takes the request as it is; its admission (``match_prefix``
  returns nothing for a request with computed tokens) allocates blocks for its prompt plus the next
  token; the decode manager's ``allocate_slots`` is wrapped to book the received prompt tokens as held
  KV (``note_computed``), as a swap-in would.
Transferred bytes: every prompt token of every request that decodes (output_len > 1); the decode side's
prefix cache is not consulted before the transfer (no deduplication). A request with one output token
finishes on its prefill replica and transfers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from sim.cluster.link import KVLink
from sim.cluster.replica import Replica
from sim.cluster.routers import Router
from sim.request import Request


class Handoff:
    """Moves finished prefills to the decode pool; tells the decode pool when no more will come."""

    def __init__(self, env: simpy.Environment, decode: Sequence[Replica], router: Router, link: KVLink,
                 kv_bytes_per_token: int) -> None:
        self.env = env
        self.decode = decode
        self.router = router
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.output_len: dict[int, int] = {}      # req_id -> the request's own output_len
        self.cached_tokens: dict[int, int] = {}   # req_id -> prefix-cache hit at its prefill
        self.prefill_of: dict[int, int] = {}      # req_id -> prefill replica id
        self.decode_of: dict[int, int] = {}       # req_id -> decode replica id
        self.transfer_s: dict[int, float] = {}
        self.transfer_start: dict[int, float] = {}   # req_id -> when its KV started over the link
        self.in_flight = 0
        self._drained: simpy.Event | None = None
        self._incoming: set[int] = set()          # handed to a decode replica, not yet admitted there

    # ------------------------------------------------------------ prefill side
    def attach_prefill(self, rep: Replica) -> None:
        manager = rep.manager
        free = manager.free
        rep.engine.may_block = True

        def deferred_free(req: Request, _free: Callable[[Request], None] = free) -> None:
            rid = req.req_id
            if rid in self.output_len and req.num_generated >= req.output_len and rid not in self.prefill_of:
                self.prefill_of[rid] = rep.replica_id
                self.cached_tokens[rid] = req.num_cached_tokens
                if self.output_len[rid] <= 1:     # nothing to decode: done here
                    _free(req)
                    return
                self.in_flight += 1
                self.env.process(self._transfer(req, _free, rep))
                return
            _free(req)

        manager.free = deferred_free

    def submit_prefill(self, rep: Replica, req: Request) -> None:
        self.output_len[req.req_id] = req.output_len
        req.output_len = 1
        rep.submit(req)

    def _transfer(self, req: Request, free: Callable[[Request], None], src: Replica):
        start = self.transfer_start[req.req_id] = self.env.now
        yield from self.link.send(req.prompt_len * self.kv_bytes_per_token)
        free(req)                                  # the prefill side lets go of the blocks now
        src.engine.wake()                          # a prefill waiting for memory may go on
        req.output_len = self.output_len[req.req_id]
        self.transfer_s[req.req_id] = self.env.now - start
        i = self.router.choose(req, self.decode)
        self.decode_of[req.req_id] = self.decode[i].replica_id
        self._incoming.add(req.req_id)
        self.decode[i].submit(req)
        self.in_flight -= 1
        if not self.in_flight and self._drained is not None and not self._drained.triggered:
            self._drained.succeed()

    # ------------------------------------------------------------ decode side
    def attach_decode(self, rep: Replica) -> None:
        manager = rep.manager
        allocate = manager.allocate_slots
        incoming = self._incoming

        def allocate_received(req: Request, num_new_tokens: int, cached=None, _alloc=allocate) -> bool:
            ok = _alloc(req, num_new_tokens, cached)
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
