"""Client timeouts between prefill and decode pools: a request is aborted where it is when its client gives
up (on its prefill replica, waiting for decode blocks, in transfer, on its decode replica), the blocks it
held given back, and the abort counted on the replica that had it (on the way between: its prefill replica).

References: the same run without the timeout (until the first abort both runs are the same, so an
engine's abort falls at its first step starting at or after the deadline), the deadline itself (arrival +
timeout) where the handoff aborts a request, and the order of deadlines, not of hand-overs. Each run is made
in the SimPy loop and in the compiled core, which must agree bit for bit.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from result_compare import assert_same
from test_cluster_disagg import LINK, _kv_bytes_per_token, _pd

import sim.engine_core as engine_core
from sim.fuzz_cluster import check_cluster_outcome
from sim.native import native
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.deadlines import ByDeadline, InOrder


def _run(data: dict, timeout: float | None):
    """The run in the SimPy loop and in the compiled core (where built): the same results; the core's."""
    data = copy.deepcopy(data)
    if timeout is not None:
        data["workload"]["timeout_s"] = timeout
    runs = []
    before = engine_core.enabled
    try:
        for on in (False, True):
            engine_core.enabled = on
            runs.append(run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    finally:
        engine_core.enabled = before
    loop, core = runs
    assert_same(loop, core)
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)
    assert core.profile["compiled_core"] == (native is not None)
    return core


def _first_step_at_or_after(res, replica: int, t: float) -> float:
    steps = res.steps[res.steps["replica"] == replica]["start_s"].to_numpy()
    return float(steps[steps >= t].min())


def test_a_request_waiting_for_a_decode_seat_is_aborted_at_its_deadline():
    """One decode seat: r0 decodes there; r1 and r2, their prompts done, wait for its blocks (pulled KV).
    Their clients give up at arrival + 0.05 s: they leave the queue then, counted on the prefill replica
    that held their blocks; r0 is aborted by the decode replica at its first step from 0.05 s on."""
    timeout = 0.05
    data = _pd([(0.0, 200, 400), (0.0, 100, 50), (0.001, 60, 30)], {"replicas": 1},
               {"replicas": 1, "scheduler": {"max_num_seqs": 1}})
    plain, timed = _run(data, None), _run(data, timeout)
    was, out = plain.requests.set_index("req_id"), timed.requests.set_index("req_id")
    assert list(out["status"]) == ["ABORTED"] * 3
    for rid, arrival in ((1, 0.0), (2, 0.001)):
        assert out.loc[rid, "finish_s"] == arrival + timeout
        assert out.loc[rid, "reject_reason"] == f"client timeout after {timeout:g} s (waiting for a decode seat, 1 tokens out)"
        assert out.loc[rid, "replica"] == out.loc[rid, "prefill_replica"] == 0
        assert out.loc[rid, "first_token_s"] == was.loc[rid, "first_token_s"]
        assert np.isnan(out.loc[rid, "transfer_s"])
    abort = _first_step_at_or_after(plain, 1, timeout)
    assert out.loc[0, "finish_s"] == abort and out.loc[0, "replica"] == 1
    # r0's tokens at its abort: its first (on the prefill replica), then one a decode step that had ended by then
    ends = plain.steps.loc[plain.steps["replica"] == 1, "end_s"].to_numpy()
    assert out.loc[0, "reject_reason"] == (f"client timeout after {timeout:g} s (running, "
                                           f"{1 + int((ends <= abort).sum())} tokens out)")
    reps = timed.replicas.set_index("replica")
    assert list(reps["aborted"]) == [2, 1] and list(reps["handed_off"]) == [1, 0]
    assert timed.summary["num_aborted"] == 3 and timed.summary["num_finished"] == 0
    # r1's timeline: its prefill, then the wait for a decode seat until the abort, done once, there
    tl = timed.timeline[timed.timeline["req_id"] == 1]
    wait = tl[tl["phase"] == "kv_wait"]
    assert list(wait["start_s"]) == [out.loc[1, "first_token_s"]] and list(wait["end_s"]) == [timeout]
    assert list(tl.loc[tl["phase"] == "done", "start_s"]) == [timeout]


def test_a_pulled_transfer_that_outlives_its_deadline_gives_its_booked_blocks_back():
    """A decode cache of 52 blocks: r0's 800-token prompt books 51 of them, and its KV takes 0.5 s on the
    link. Its client gives up at 0.3 s; the transfer ends at 0.5 s and r0 is aborted there, its booked
    blocks freed, so r1 (2 blocks, waiting since its prefill) starts its transfer at that very time, where
    without the timeout it waits for r0 to finish decoding."""
    link = {"bandwidth_gb_s": 800 * _kv_bytes_per_token() / 0.5 / 1e9, "latency_s": 0.0}
    data = _pd([(0.0, 800, 4), (0.25, 16, 4)], {"replicas": 1}, {"replicas": 1, "kv_cache": {"num_gpu_blocks": 52}},
               link=link)
    plain, timed = _run(data, None), _run(data, 0.3)
    was, out = plain.requests.set_index("req_id"), timed.requests.set_index("req_id")
    landed = out.loc[0, "first_token_s"] + out.loc[0, "transfer_s"]
    assert out.loc[0, "transfer_s"] == pytest.approx(0.5)
    assert out.loc[0, "status"] == "ABORTED" and out.loc[0, "finish_s"] == landed
    assert out.loc[0, "reject_reason"] == "client timeout after 0.3 s (in transfer, 1 tokens out)"
    assert out.loc[0, "replica"] == 0                          # its prefill replica: the decode pool never had it
    start = lambda reqs, rid: reqs.loc[rid, "first_token_s"] + reqs.loc[rid, "kv_wait_s"]   # noqa: E731
    assert start(out, 1) == pytest.approx(landed, abs=1e-12)
    assert start(was, 1) == pytest.approx(was.loc[0, "finish_s"], abs=1e-12)
    assert was.loc[0, "finish_s"] > landed
    assert out.loc[1, "status"] == "FINISHED"
    assert list(timed.replicas["aborted"]) == [1, 0] and list(timed.replicas["requests"]) == [2, 1]


def test_pushed_kv_whose_client_gave_up_is_dropped_when_it_lands():
    """Pushed: the decode replica is chosen when the KV lands; a request whose client gave up meanwhile is
    aborted then, counted on its prefill replica, and no decode replica ever sees it."""
    link = {"bandwidth_gb_s": 800 * _kv_bytes_per_token() / 0.5 / 1e9, "latency_s": 0.0}
    timed = _run(_pd([(0.0, 800, 4)], {"replicas": 1}, {"replicas": 2}, link=link, mode="push"), 0.3)
    r = timed.requests.iloc[0]
    assert r["status"] == "ABORTED" and r["finish_s"] == r["first_token_s"] + r["transfer_s"]
    assert r["reject_reason"] == "client timeout after 0.3 s (in transfer, 1 tokens out)"
    assert r["replica"] == 0
    assert list(timed.replicas["requests"]) == [1, 0, 0] and list(timed.replicas["aborted"]) == [1, 0, 0]


def test_a_prompt_still_queued_on_its_prefill_replica_is_aborted_there():
    """One prefill seat, 64 tokens a step: r0's 800-token prompt takes 13 steps, r1 waits behind it and its
    client gives up first; the prefill replica aborts it at its first step from the deadline on."""
    chunked = {"max_num_seqs": 1, "max_num_batched_tokens": 64, "chunked_prefill": True}
    data = _pd([(0.0, 800, 4), (0.0, 30, 5)], {"replicas": 1, "scheduler": chunked}, {"replicas": 1})
    plain = _run(data, None)
    timeout = float(plain.requests.loc[0, "first_token_s"]) / 2
    out = _run(data, timeout).requests.set_index("req_id")
    assert out.loc[1, "status"] == "ABORTED" and out.loc[1, "replica"] == 0
    assert out.loc[1, "finish_s"] == _first_step_at_or_after(plain, 0, timeout)
    assert out.loc[1, "reject_reason"] == f"client timeout after {timeout:g} s (queued, 0 tokens out)"
    assert out.loc[0, "status"] == "ABORTED" and out.loc[0, "reject_reason"].endswith("(running, 0 tokens out)")


def test_a_decode_replica_aborts_by_deadline_not_by_hand_over_order():
    """Two prefill replicas (round robin: r0 and r2 on one, r1 on the other): r1's long prompt (chunked, 64
    tokens a step) reaches the decode replica after r2's, which arrived 5 ms after it: handed over r0, r2,
    r1, due r0 = r1 < r2. One decode seat, r0 decoding: at the decode replica's first step from the
    deadline on, r0 and r1 (queued) are both aborted; r2 then runs."""
    timeout = 0.1
    data = _pd([(0.0, 16, 400), (0.0, 800, 5), (0.005, 16, 5)],
               {"replicas": 2, "scheduler": {"max_num_batched_tokens": 64, "chunked_prefill": True}},
               {"replicas": 1, "scheduler": {"max_num_seqs": 1}}, link=LINK, mode="push")
    plain, timed = _run(data, None), _run(data, timeout)
    was, out = plain.requests.set_index("req_id"), timed.requests.set_index("req_id")
    landed = was["first_token_s"] + was["transfer_s"]
    assert landed[0] < landed[2] < landed[1] < timeout          # handed over r0, r2, r1
    abort = _first_step_at_or_after(plain, 2, timeout)
    assert abort < 0.005 + timeout                               # (r2 not due then)
    assert (out.loc[0, "finish_s"], out.loc[1, "finish_s"]) == (abort, abort)
    assert out.loc[1, "reject_reason"] == f"client timeout after {timeout:g} s (queued, 1 tokens out)"
    assert out.loc[2, "status"] == "FINISHED" and out.loc[2, "first_scheduled_s"] <= abort


def test_deadlines_by_time_pop_earliest_first_and_in_order_ones_stop_at_the_first_not_due():
    def req(i: int, arrival: float) -> Request:
        return Request(req_id=i, arrival_s=arrival, prompt_len=1, output_len=1)

    reqs = [req(0, 0.0), req(2, 0.5), req(1, 0.0), req(3, 0.2)]   # handed over in this order
    heap, fifo = ByDeadline(), InOrder()
    for r in reqs:
        heap.add(r)
        fifo.add(r)
    due = []
    while (r := heap.pop_due(0.3 + 1.0, 1.0)) is not None:    # due: deadlines at or before 1.3
        due.append(r.req_id)
    assert due == [0, 1, 3] and heap
    assert fifo.pop_due(1.3, 1.0).req_id == 0 and fifo.pop_due(1.3, 1.0) is None   # r2 (1.5) stops it


# drawn by the cluster fuzzer (sim/fuzz_cluster.py, a P/D case with a timeout): a prefill replica still holds
# the deadline of a request it handed on; when it stepped after that deadline while the decode replica had not
# yet aborted the request, it tried to abort it itself (the decode replica's running request). Prefill replicas
# now skip what they have handed on (sim/sched/deadlines.py, ``UnlessHandedOn``).
HANDED_ON = {'name': 'fuzz-cluster-10',
     'seed': 730389500,
     'model': 'llama-3-8b',
     'hardware': 'a100-80gb',
     'kv_cache': {'block_size': 2,
                  'num_gpu_blocks': 21,
                  'swap_space_gb': 0.01,
                  'allocator': 'paged',
                  'prefix_caching': False,
                  'dtype': 'fp8'},
     'scheduler': {'batching': 'continuous',
                   'policy': 'fcfs',
                   'preemption': 'recompute',
                   'victim': 'most_generated',
                   'chunked_prefill': False,
                   'async_scheduling': False,
                   'max_num_seqs': 256,
                   'rr_quantum_steps': 4,
                   'multi_step': True,
                   'parallel_sampling': 'fork',
                   'max_steps_without_progress': 5000},
     'executor': {'engine': False},
     'frontend': {'enabled': True},
     'output': {'plots': False},
     'workload': {'synthetic': {'num_requests': 8,
                                'arrival': {'process': 'burst'},
                                'prompt_len': {'dist': 'uniform', 'min': 18, 'max': 42},
                                'output_len': {'dist': 'lognormal',
                                               'mean': 10.0,
                                               'std': 21.0,
                                               'min': 1,
                                               'max': 40}},
                  'timeout_s': 0.02},
     'cluster': {'prefill': {'replicas': 1, 'hardware': 'h100-80gb'},
                 'decode': {'replicas': 1, 'hardware': 'h200-141gb', 'scheduler': {'max_num_seqs': 1}},
                 'kv_transfer': {'link': 'infiniband-400g', 'mode': 'pull'},
                 'router': {'policy': 'least_kv'}}}


def test_a_prefill_replica_leaves_what_it_handed_on_to_the_decode_replica():
    scn = scenario_from_dict(copy.deepcopy(HANDED_ON))
    res = run_scenario(scn, check_integrity=True)
    assert check_cluster_outcome(res, scn) == []
    assert res.summary["num_aborted"] == int((res.requests["status"] == "ABORTED").sum()) > 0
