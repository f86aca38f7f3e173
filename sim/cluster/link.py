"""The KV-transfer link between the prefill and the decode pool.

A transfer of ``b`` bytes holds the link for ``b / bandwidth`` seconds (a SimPy resource of capacity 1:
transfers share the bandwidth by taking turns, first come first served), then arrives ``latency_s``
later (propagation, pipelined: the next transfer may start meanwhile). Engines keep stepping while
transfers are in flight: transfers overlap compute.

Invariant: ``bytes_sent`` is the sum of the sizes of the finished transfers.
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

    def send(self, nbytes: int) -> Generator[simpy.Event, None, None]:
        """A SimPy sub-process: ``yield from link.send(n)`` returns when the last byte has arrived."""
        with self.resource.request() as turn:
            yield turn
            wire = nbytes / self.bandwidth
            yield self.env.timeout(wire)
            self.busy_s += wire
        if self.latency_s > 0:
            yield self.env.timeout(self.latency_s)
        self.bytes_sent += nbytes
