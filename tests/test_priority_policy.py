"""Priority scheduling: lower value first; under memory pressure the lowest-priority request is the victim."""

from test_sched_util import simulate, who

from sim.request import Request


def test_admission_order_follows_priority():
    reqs = [Request(0, 0.0, 4, 2, priority=2), Request(1, 0.0, 4, 2, priority=0), Request(2, 0.0, 4, 2, priority=1)]
    _, ex = simulate(reqs, 8, 4, policy="priority", max_num_seqs=1)
    assert who(ex) == [[1], [1], [2], [2], [0], [0]]


def test_lowest_priority_running_request_is_the_victim():
    # X (priority 1) and Y (priority 0), prompt 2, 4 out, 4 blocks of 2 tokens. Y is admitted first.
    # At step 4 Y needs a 3rd block: FCFS would pick the latest arrival (Y itself, id 1);
    # priority picks X. X's blocks [1, 3] are freed (tail first: 3, 1) and Y takes 3.
    reqs = [Request(0, 0.0, 2, 4, priority=1), Request(1, 0.0, 2, 4, priority=0)]
    sch, ex = simulate(reqs, 4, 2, policy="priority")
    assert who(ex)[:4] == [[1, 0], [1, 0], [1, 0], [1]]
    assert ex.tables[3] == {1: [0, 2, 3]}
    assert reqs[0].num_preemptions == 1 and reqs[1].num_preemptions == 0
    assert ex.plans[4] == [(0, 5, 0)]          # X recomputes prompt 2 + 3 generated


def test_fcfs_victim_is_the_latest_arrival():
    reqs = [Request(0, 0.0, 2, 4, priority=1), Request(1, 0.0, 2, 4, priority=0)]
    _, ex = simulate(reqs, 4, 2, policy="fcfs")
    assert who(ex)[3] == [0]
    assert reqs[1].num_preemptions == 1


def test_a_late_high_priority_request_preempts_an_earlier_low_priority_one():
    # 3 blocks of 2. L (priority 1, prompt 2) at t=0; H (priority 0, prompt 2) at t=0.5.
    # step 1: L -> [0]. step 2: L grows into 1, H is admitted into 2: no block left.
    # step 3: H needs a block for its 3rd token; it is served first (better priority), so the victim is
    # chosen among H and L: L, whose blocks are freed (1 then 0); H takes block 1. L runs again later.
    reqs = [Request(0, 0.0, 2, 4, priority=1), Request(1, 0.5, 2, 4, priority=0)]
    _, ex = simulate(reqs, 3, 2, policy="priority")
    assert ex.tables[1] == {0: [0, 1], 1: [2]}
    assert ex.plans[2] == [(1, 1, 2)] and ex.tables[2] == {1: [2, 1]}
    assert reqs[0].num_preemptions == 1 and reqs[1].num_preemptions == 0
    assert reqs[1].finish_s < reqs[0].finish_s
