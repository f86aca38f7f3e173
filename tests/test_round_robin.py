"""Round-robin: a real time slice. max_num_seqs 1, quantum 3 steps, 1 s steps, 4-token blocks.

A (prompt 4, 10 tokens out) and B (prompt 4, 2 out), both at t=0. By hand:
  steps 1-3  A (prefill, then 2 decodes: 3 tokens)        its turn started at step 1
  step 4     A's turn is over (3 steps) and B waits: A goes to the back of the queue; B prefills
  step 5     B decodes its 2nd token and finishes
  step 6     A again: recompute mode recomputes prompt + 3 generated = 7 tokens; swap mode swaps its
             2 blocks back (6 tokens of KV) and decodes 1 token
  steps 6-12 A's tokens 4..10 (no one waits, no more rotation)
FCFS instead: A runs steps 1-10, B steps 11-12.
"""

import pytest
from test_sched_util import simulate, who

from sim.metrics import jain_index, requests_frame, summarize
from sim.request import Request


def two() -> list[Request]:
    return [Request(0, 0.0, 4, 10), Request(1, 0.0, 4, 2)]


def test_round_robin_rotates_after_the_quantum_recompute():
    reqs = two()
    sch, ex = simulate(reqs, 8, 4, policy="round_robin", rr_quantum_steps=3, max_num_seqs=1)
    assert who(ex) == [[0]] * 3 + [[1], [1]] + [[0]] * 7
    assert ex.plans[3] == [(1, 4, 0)]
    assert ex.plans[5] == [(0, 7, 0)]           # recompute: prompt 4 + 3 generated tokens
    assert reqs[0].num_preemptions == 1 and sch.num_preemptions == 1
    assert reqs[1].first_scheduled_s == 3.0 and reqs[1].finish_s == 5.0
    assert reqs[0].finish_s == 12.0
    tl = sch.timeline_frame()
    a = tl[tl.req_id == 0][["phase", "start_s", "end_s"]].values.tolist()
    assert a == [["waiting", 0.0, 0.0], ["prefill", 0.0, 1.0], ["decode", 1.0, 3.0], ["preempted", 3.0, 5.0],
                 ["prefill", 5.0, 6.0], ["decode", 6.0, 12.0], ["done", 12.0, 12.0]]


def test_round_robin_rotates_by_swap_and_moves_the_blocks():
    reqs = two()
    sch, ex = simulate(reqs, 8, 4, cpu_blocks=4, policy="round_robin", rr_quantum_steps=3, max_num_seqs=1,
                       preemption="swap")
    assert who(ex) == [[0]] * 3 + [[1], [1]] + [[0]] * 7
    # after 3 tokens A holds 6 tokens of KV in blocks [0, 1]; they go to CPU blocks 0, 1
    assert ex.swap_out[3] == [(0, 0), (1, 1)]
    # free queue then: 2..7, 1, 0; B takes 2 (prefill) and 3 (its 5th token); B's end frees 3, 2.
    assert ex.tables[3] == {1: [2]} and ex.tables[4] == {1: [2, 3]}
    # A comes back into the head of the free queue, 4 and 5, and decodes one token (context 6)
    assert ex.swap_in[5] == [(0, 4), (1, 5)]
    assert ex.plans[5] == [(0, 1, 6)]
    assert sch.swapped_blocks == 2
    assert reqs[0].finish_s == 12.0


def test_fcfs_makes_the_short_request_wait_for_the_long_one():
    reqs = two()
    _, ex = simulate(reqs, 8, 4, policy="fcfs", max_num_seqs=1)
    assert who(ex) == [[0]] * 10 + [[1]] * 2
    assert reqs[1].first_scheduled_s == 10.0


def test_fairness_metrics_by_hand():
    # normalized latency = e2e / output tokens. FCFS: A 10/10 = 1, B 12/2 = 6 -> Jain 49/74.
    # RR: A 12/10 = 1.2, B 5/2 = 2.5 -> Jain 3.7^2 / (2 (1.44 + 6.25)) = 13.69 / 15.38.
    fc = two()
    simulate(fc, 8, 4, policy="fcfs", max_num_seqs=1)
    rr = two()
    simulate(rr, 8, 4, policy="round_robin", rr_quantum_steps=3, max_num_seqs=1)
    norm = [[r.finish_s / r.output_len for r in reqs] for reqs in (fc, rr)]
    assert norm == [[1.0, 6.0], [1.2, 2.5]]
    assert jain_index(norm[0]) == pytest.approx(49 / 74)
    assert jain_index(norm[1]) == pytest.approx(13.69 / 15.38)
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_fairness_keys_of_the_summary():
    # queue wait = first scheduled - arrival: FCFS B waits 10 s, RR B waits 3 s; A never waits.
    out = {}
    for policy in ("fcfs", "round_robin"):
        reqs = two()
        sch, ex = simulate(reqs, 8, 4, policy=policy, rr_quantum_steps=3, max_num_seqs=1)
        out[policy] = summarize(requests_frame(reqs), ex.recorder.steps_frame(), sch, capacity_slots=32,
                                wall_time_s=0.0)
    fc, rr = out["fcfs"], out["round_robin"]
    assert fc["queue_wait_max_s"] == 10.0 and rr["queue_wait_max_s"] == 3.0
    assert fc["queue_wait_p99_s"] == pytest.approx(9.9) and rr["queue_wait_p99_s"] == pytest.approx(2.97)
    assert fc["jain_fairness"] == pytest.approx(49 / 74) and rr["jain_fairness"] == pytest.approx(13.69 / 15.38)
    assert fc["output_throughput_tok_s"] == pytest.approx(12 / 12) and rr["num_preemptions"] == 1
