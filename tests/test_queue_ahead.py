"""``push_ahead`` (a disaggregated decode replica's request whose KV arrived into blocks it holds): before
everything queued, whatever the policy ranks, in the order they were queued ahead; a preempted request's
``push_front`` goes behind them; ``remove`` and ``len`` keep counting them."""

from __future__ import annotations

import pytest

from sim.request import Request
from sim.sched.queues import make_queue


class _Cache:
    """match_prefix: every request but those ahead has cached blocks (they would be overtaken)."""

    def match_prefix(self, req: Request) -> list[int]:
        return [] if req.req_id >= 100 else [7, 8]


def _req(i: int, priority: int = 0) -> Request:
    return Request(req_id=i, arrival_s=float(i), prompt_len=16, output_len=4, priority=priority)


def _drain(q) -> list[int]:
    out = []
    while len(q):
        assert q.peek() is q.peek()
        out.append(q.pop().req_id)
    return out


@pytest.mark.parametrize("policy", ["fcfs", "round_robin", "priority", "longest_prefix_first"])
def test_queued_ahead_go_first_then_the_preempted_then_the_rest(policy):
    q = make_queue(policy, _Cache())
    for i in range(3):
        q.push(_req(i, priority=i))          # ranked 0, 1, 2 (priority: lower first)
    q.push_ahead(_req(100, priority=9))      # worst priority, no cached blocks: still first
    q.push_ahead(_req(101, priority=9))      # after the earlier one queued ahead
    q.push_front(_req(50, priority=5))       # preempted: behind those queued ahead
    assert len(q) == 6
    order = _drain(q)
    assert order[:2] == [100, 101]
    expected_rest = {"priority": [0, 1, 2, 50]}.get(policy, [50, 0, 1, 2])
    assert order[2:] == expected_rest


@pytest.mark.parametrize("policy", ["fcfs", "priority", "longest_prefix_first"])
def test_removing_one_queued_ahead_keeps_the_others_first(policy):
    q = make_queue(policy, _Cache())
    q.push(_req(0))
    a, b = _req(100), _req(101)
    q.push_ahead(a)
    q.push_ahead(b)
    q.remove(a)
    assert len(q) == 2
    q.push_front(_req(50))
    assert _drain(q) == ([101, 0, 50] if policy == "priority" else [101, 50, 0])
