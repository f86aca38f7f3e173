"""The KV-transfer link between the prefill and the decode pool.

A transfer of ``b`` bytes holds the link for ``b / bandwidth`` seconds (a SimPy resource of capacity 1:
transfers share the bandwidth by taking turns, first come first served), then arrives ``latency_s``
later (propagation, pipelined: the next transfer may start meanwhile). Engines keep stepping while
transfers are in flight: transfers overlap compute.

Layer-wise (``ready_from``): the KV was being written from ``ready_from`` on (a prefill's first step) and
each layer could leave as soon as it was written, so a transfer asked for at its prefill's end, when the
link is free, counts the wire time the link stood idle since ``max(ready_from, the last transfer's end)``
as already sent; what is left takes ``max(b / bandwidth - that idle time, tail / bandwidth)``: the last
layer (``tail`` bytes) is written at the end and leaves after it. A transfer that has to queue for the
link overlaps nothing. The KV is taken to be written evenly over that time; a layer-wise link is never
slower than one that sends after the prefill, and never faster than the last layer allows.

Invariants: ``bytes_sent`` is the sum of the sizes of the finished transfers; ``busy_s`` adds ``b /
bandwidth`` a transfer, the overlapped part included (it fell in time the link stood idle).
"""

from __future__ import annotations

from collections.abc import Generator

import simpy


class KVLink:
    def __init__(self, env: simpy.Environment, bandwidth_bytes_s: float, latency_s: float) -> None:
        self.env = env
        self.bandwidth = bandwidth_bytes_s
        self.latency_s = latency_s
        self.resource = simpy.Resource(env, capacity=1)
        self.bytes_sent = 0
        self.busy_s = 0.0
        self.idle_since = 0.0   # when the last transfer left the link

    def send(self, nbytes: int, ready_from: float | None = None, tail_bytes: float = 0.0
             ) -> Generator[simpy.Event, None, None]:
        """A SimPy sub-process: ``yield from link.send(n)`` returns when the last byte has arrived;
        ``ready_from`` and ``tail_bytes``: a layer-wise transfer (the module docstring)."""
        asked = self.env.now
        with self.resource.request() as turn:
            yield turn
            full = nbytes / self.bandwidth
            wire = full
            if ready_from is not None and self.env.now == asked:
                ahead = asked - max(ready_from, self.idle_since)
                wire = max(full - max(ahead, 0.0), tail_bytes / self.bandwidth)
            yield self.env.timeout(wire)
            self.busy_s += full
            self.idle_since = self.env.now
        if self.latency_s > 0:
            yield self.env.timeout(self.latency_s)
        self.bytes_sent += nbytes
