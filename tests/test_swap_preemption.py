"""Preemption under memory pressure, by swap and by recompute (2-token blocks, 4 GPU blocks, 1 s steps).

A and B (prompt 2, 4 tokens out) both arrive at t=0. By hand:
  step 1  both prefill: A -> block 0, B -> block 1
  step 2  both decode into a new block: A -> 2, B -> 3
  step 3  both decode inside their last block
  step 4  A needs a 3rd block, none is free: the victim is the latest arrival, B.
          swap: B's blocks [1, 3] go to CPU blocks [0, 1]; A takes the freed 3 and finishes (its 4th token);
                A frees 3, 2, 0 (tail first): free queue 1, 3, 2, 0
  step 5  swap: B comes back into GPU blocks 1, 3 (before anything new), grows into 2 and finishes.
          recompute: B recomputes prompt 2 + 3 generated = 5 tokens (3 blocks).
"""

from test_sched_util import simulate, who

from sim.request import Request


def pair() -> list[Request]:
    return [Request(0, 0.0, 2, 4), Request(1, 0.0, 2, 4)]


def test_swap_out_and_back_in_with_exact_blocks():
    reqs = pair()
    sch, ex = simulate(reqs, 4, 2, cpu_blocks=4, preemption="swap")
    assert who(ex) == [[0, 1], [0, 1], [0, 1], [0], [1]]
    assert ex.tables[2] == {0: [0, 2], 1: [1, 3]}
    assert ex.swap_out[3] == [(1, 0), (3, 1)]
    assert ex.tables[3] == {0: [0, 2, 3]}
    assert ex.swap_in[4] == [(0, 1), (1, 3)]
    assert ex.plans[4] == [(1, 1, 4)]           # no recompute: context 4, one new token
    assert ex.tables[4] == {1: [1, 3, 2]}
    assert sch.swapped_blocks == 2 and sch.num_preemptions == 1
    assert sch.num_swapped() == 0 and not sch.swapped
    assert [r.finish_s for r in reqs] == [4.0, 5.0]
    tl = sch.timeline_frame()
    assert tl[(tl.req_id == 1) & (tl.phase == "swapped")][["start_s", "end_s"]].values.tolist() == [[3.0, 4.0]]


def test_recompute_frees_and_recomputes():
    reqs = pair()
    sch, ex = simulate(reqs, 4, 2, preemption="recompute")
    assert who(ex) == [[0, 1], [0, 1], [0, 1], [0], [1]]
    assert ex.swap_out[3] == [] and ex.plans[4] == [(1, 5, 0)]
    assert sch.swapped_blocks == 0 and reqs[1].num_preemptions == 1


def test_full_swap_space_falls_back_to_recompute():
    reqs = pair()
    sch, ex = simulate(reqs, 4, 2, cpu_blocks=1, preemption="swap")   # B's 2 blocks do not fit in 1
    assert ex.swap_out[3] == [] and ex.plans[4] == [(1, 5, 0)]
    assert sch.swapped_blocks == 0 and sch.num_preemptions == 1


def test_swapped_requests_come_back_before_new_arrivals():
    # C (prompt 2, 1 token) arrives at t=3.5, while B is swapped out: B is swapped in first (step 5),
    # C is admitted in a later step, though the free blocks after A's end would hold both.
    reqs = pair() + [Request(2, 3.5, 2, 1)]
    sch, ex = simulate(reqs, 4, 2, cpu_blocks=4, preemption="swap")
    assert who(ex)[4][0] == 1
    assert reqs[2].first_scheduled_s >= 4.0


def test_most_generated_victim():
    # 6 blocks of 2. A, B (prompt 2, 8 out) at t=0 hold [0, 2] and [1, 3] after step 2; C (prompt 2, 3 out)
    # arrives at t=1.5 and gets block 4 at step 3. Step 4: A takes the last block (5); B needs one, none is
    # left; the candidates are B (3 tokens generated) and C (1). latest_arrival preempts C, most_generated B.
    def run(victim):
        reqs = [Request(0, 0.0, 2, 8), Request(1, 0.0, 2, 8), Request(2, 1.5, 2, 3)]
        _, ex = simulate(reqs, 6, 2, preemption="recompute", victim=victim)
        return reqs, ex

    reqs, ex = run("most_generated")
    assert who(ex)[2] == [0, 1, 2] and who(ex)[3] == [0, 2]
    assert reqs[1].num_preemptions >= 1
    reqs, ex = run("latest_arrival")
    assert who(ex)[3] == [0, 1]
    assert reqs[2].num_preemptions >= 1
