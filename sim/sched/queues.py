"""Waiting queues: the order in which waiting requests are admitted.

Every queue supports ``push`` (new arrival, at the back), ``push_front`` (a preempted request, served
next), ``peek``/``pop`` (the next to admit), ``remove`` and ``len``. Policies differ only in order.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from sim.request import Request


class FCFSQueue:
    """First come, first served; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def push(self, req: Request) -> None:
        self._q.append(req)

    def push_front(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """Lowest ``priority`` value first, then earliest arrival; preempted requests keep their rank."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, int, Request]] = []
        self._removed: set[int] = set()
        self._tie = itertools.count()

    def _key(self, req: Request, front: bool) -> tuple[int, float, int, int, Request]:
        return (req.priority, req.arrival_s, req.req_id, next(self._tie), req)

    def push(self, req: Request) -> None:
        self._removed.discard(req.req_id)
        heapq.heappush(self._heap, self._key(req, False))

    push_front = push  # rank is by priority and arrival, not by queue position

    def _prune(self) -> None:
        while self._heap and self._heap[0][2] in self._removed:
            self._removed.discard(heapq.heappop(self._heap)[2])

    def peek(self) -> Request:
        self._prune()
        return self._heap[0][-1]

    def pop(self) -> Request:
        self._prune()
        return heapq.heappop(self._heap)[-1]

    def remove(self, req: Request) -> None:
        self._removed.add(req.req_id)

    def __len__(self) -> int:
        return len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[Request]:
        return (e[-1] for e in sorted(self._heap) if e[2] not in self._removed)


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    """The waiting queue for a scheduler policy (round-robin rotates through an FCFS queue)."""
    if policy == "priority":
        return PriorityQueue()
    return FCFSQueue()
