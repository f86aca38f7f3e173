"""Waiting queues: the order in which waiting requests are admitted.

Every queue supports ``push`` (new arrival, at the back), ``push_front`` (a preempted request, served
next), ``push_ahead`` (before everything, whatever the policy ranks: a disaggregated decode replica's
request whose KV has arrived into blocks it holds), ``peek``/``pop`` (the next to admit), ``remove`` and
``len``. Policies differ only in order.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from sim.request import Request


class FCFSQueue:
    """First come, first served; preempted requests go back to the front (behind those queued ahead)."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()
        self._ahead = 0   # the first this many were queued ahead (``push_ahead``), in their order

    def push(self, req: Request) -> None:
        self._q.append(req)

    def push_front(self, req: Request) -> None:
        if self._ahead:
            self._q.insert(self._ahead, req)
        else:
            self._q.appendleft(req)

    def push_ahead(self, req: Request) -> None:
        """Before everything queued but those queued ahead earlier (see PriorityQueue.push_ahead)."""
        self._q.insert(self._ahead, req)
        self._ahead += 1

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        if self._ahead:
            self._ahead -= 1
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        if self._ahead and req in itertools.islice(self._q, self._ahead):
            self._ahead -= 1
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
        self._ahead: deque[Request] = deque()   # ``push_ahead``: served before the heap, in their order

    def _key(self, req: Request, front: bool) -> tuple[int, float, int, int, Request]:
        return (req.priority, req.arrival_s, req.req_id, next(self._tie), req)

    def push(self, req: Request) -> None:
        self._removed.discard(req.req_id)
        heapq.heappush(self._heap, self._key(req, False))

    push_front = push  # rank is by priority and arrival, not by queue position

    def push_ahead(self, req: Request) -> None:
        """Before every ranked request, whatever its rank, after those queued ahead earlier (a disaggregated
        decode replica's request whose KV has arrived into blocks it holds: sim/cluster/disagg.py)."""
        self._ahead.append(req)

    def _prune(self) -> None:
        while self._heap and self._heap[0][2] in self._removed:
            self._removed.discard(heapq.heappop(self._heap)[2])

    def peek(self) -> Request:
        if self._ahead:
            return self._ahead[0]
        self._prune()
        return self._heap[0][-1]

    def pop(self) -> Request:
        if self._ahead:
            return self._ahead.popleft()
        self._prune()
        return heapq.heappop(self._heap)[-1]

    def remove(self, req: Request) -> None:
        if req in self._ahead:
            self._ahead.remove(req)
        else:
            self._removed.add(req.req_id)

    def __len__(self) -> int:
        return len(self._ahead) + len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[Request]:
        yield from self._ahead
        yield from (e[-1] for e in sorted(self._heap) if e[2] not in self._removed)


class LongestPrefixQueue(FCFSQueue):
    """Cache-aware order (SGLang's longest prefix match): the waiting request with the most prompt
    blocks in the prefix cache goes first, ties in queue order. Only the first ``window`` requests are
    ranked (each rank is a cache lookup), so a long queue stays cheap.

    Aging bounds starvation: the request at the front of the queue is overtaken at most ``max_bypass``
    times, then it goes next whatever the cache holds. A request with p requests ahead of it is
    therefore admitted within (p + 1) x (max_bypass + 1) admissions, even under an endless stream of hits."""

    def __init__(self, manager, window: int = 128, max_bypass: int = 32) -> None:
        super().__init__()
        # the cached blocks of a request (only their number is read): as an array where the manager has it
        self._match = getattr(manager, "match_prefix_blocks", None) or getattr(manager, "match_prefix", None)
        self.window = window
        self.max_bypass = max_bypass
        self._bypassed = 0   # times the current front request was overtaken
        self._head: Request | None = None
        # (``_ahead`` from FCFSQueue: while any are queued ahead, they go first, unranked)

    def _best(self) -> int:
        q = self._q
        if self._match is None or len(q) < 2 or self._bypassed >= self.max_bypass or self._ahead:
            return 0
        best, best_len = 0, -1
        for i in range(min(len(q), self.window)):
            n = len(self._match(q[i]))
            if n > best_len:
                best, best_len = i, n
        return best

    def peek(self) -> Request:
        self._head = self._q[self._best()]
        return self._head

    def pop(self) -> Request:
        """The request the last ``peek`` chose (admission allocates between the two), else the best."""
        req = self._head if self._head is not None else self._q[self._best()]
        if req is self._q[0]:
            self._q.popleft()
            self._bypassed = 0   # a new request is at the front
            if self._ahead:
                self._ahead -= 1
        else:
            self._q.remove(req)
            self._bypassed += 1
        self._head = None
        return req

    def push(self, req: Request) -> None:
        self._head = None
        self._q.append(req)

    def push_front(self, req: Request) -> None:
        self._head = None
        super().push_front(req)
        self._bypassed = 0

    def push_ahead(self, req: Request) -> None:
        """Not overtaken by a better prefix match either (see PriorityQueue.push_ahead)."""
        self._head = None
        super().push_ahead(req)
        self._bypassed = 0

    def remove(self, req: Request) -> None:
        self._head = None
        if self._q and req is self._q[0]:
            self._bypassed = 0
        super().remove(req)


def make_queue(policy: str, manager=None) -> FCFSQueue | PriorityQueue:
    """The waiting queue for a scheduler policy (round-robin rotates through an FCFS queue;
    longest_prefix_first asks ``manager.match_prefix`` how much of each prompt is cached)."""
    if policy == "priority":
        return PriorityQueue()
    if policy == "longest_prefix_first":
        return LongestPrefixQueue(manager)
    return FCFSQueue()
