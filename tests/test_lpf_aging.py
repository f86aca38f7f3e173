"""longest_prefix_first cannot starve a cache miss: the front request is overtaken at most max_bypass times."""

from __future__ import annotations

from sim.request import Request
from sim.sched.queues import LongestPrefixQueue


class _Cache:
    """match_prefix: two cached blocks for every request except the misses."""

    def __init__(self, misses: set[int]) -> None:
        self.misses = misses

    def match_prefix(self, req: Request) -> list[int]:
        return [] if req.req_id in self.misses else [7, 8]


def _req(i: int) -> Request:
    return Request(req_id=i, arrival_s=float(i), prompt_len=16, output_len=4)


def test_a_miss_at_the_front_waits_for_at_most_max_bypass_hits():
    q = LongestPrefixQueue(_Cache({0}), max_bypass=32)
    for i in range(302):  # the miss first, then 301 hits
        q.push(_req(i))
    order = []
    next_id = 302
    while len(q):
        order.append(q.pop().req_id)
        if next_id < 1000:  # hits keep arriving: the stream never pauses
            q.push(_req(next_id))
            next_id += 1
    assert order.index(0) == 32  # 32 hits overtake it, then it goes (the 33rd admission)
    assert order[:32] == list(range(1, 33))  # hits in queue order


def test_hits_still_go_first_while_the_front_is_young():
    q = LongestPrefixQueue(_Cache({0, 1}), max_bypass=3)
    for i in range(6):
        q.push(_req(i))
    assert [q.pop().req_id for _ in range(6)] == [2, 3, 4, 0, 5, 1]
