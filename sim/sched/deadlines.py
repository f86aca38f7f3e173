"""Client deadlines (``workload.timeout_s``): the requests a scheduler must abort once their clients give up.

A request's deadline is its arrival plus the timeout, so deadlines follow arrivals. A colocated engine is
handed its requests in arrival order and keeps them in a FIFO (``InOrder``: a request handed over late,
after one that arrived later, waits its turn, as the compiled core's ring does). A disaggregated decode
replica is handed them as their prefills end, in no such order: it keeps a heap by deadline (``ByDeadline``);
a prefill replica skips those it has handed on (``UnlessHandedOn``).
"""

from __future__ import annotations

import heapq
from collections import deque

from sim.request import Request, RequestStatus


def timeout_reason(limit: float, where: str, tokens_out: int) -> str:
    """An aborted request's ``reject_reason``: the timeout, where it was, what it had sent."""
    return f"client timeout after {limit:g} s ({where}, {tokens_out} tokens out)"


def mark_aborted(req: Request, now: float, limit: float, where: str) -> None:
    """``req``'s client gave up at ``now`` (``limit`` after sending it) while it was ``where``."""
    req.status = RequestStatus.ABORTED
    req.finish_s = now
    req.reject_reason = timeout_reason(limit, where, req.num_generated)


class InOrder:
    """Deadlines in hand-over order; ``pop_due`` stops at the first one not yet due."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def pop_due(self, now: float, limit: float) -> Request | None:
        """The next request whose deadline (arrival + ``limit``) is at or before ``now``, taken out; else None."""
        q = self._q
        return q.popleft() if q and q[0].arrival_s + limit <= now else None

    def __bool__(self) -> bool:
        return bool(self._q)


class ByDeadline(InOrder):
    """Deadlines in any hand-over order, popped earliest first (ties: in hand-over order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._count = 0

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.arrival_s, self._count, req))
        self._count += 1

    def pop_due(self, now: float, limit: float) -> Request | None:
        h = self._heap
        return heapq.heappop(h)[2] if h and h[0][0] + limit <= now else None

    def __bool__(self) -> bool:
        return bool(self._heap)


class UnlessHandedOn(InOrder):
    """A disaggregated prefill replica's: a request it has handed to the decode pool (its id in ``handed``)
    is no longer its own to abort (the decode replica, or the handoff between, aborts it)."""

    def __init__(self, handed) -> None:
        super().__init__()
        self._handed = handed

    def pop_due(self, now: float, limit: float) -> Request | None:
        while (req := super().pop_due(now, limit)) is not None and req.req_id in self._handed:
            pass
        return req
