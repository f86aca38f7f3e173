"""Static batching on the seed example scaled down (A, B, C, D generate 5, 3, 8, 2 tokens; E waits).

Worked by hand, 4-token prompts, 4-token blocks, 1 s steps, max_num_seqs 4:
static:     step 1 prefills A B C D (one token each); D's 2nd token ends it at step 2, B's 3rd at step 3,
            A's 5th at step 5, C's 8th at step 8: the batch ends; E runs steps 9-11.
continuous: same until D leaves at step 2; E takes its seat at step 3 and finishes at step 5.
"""

from test_sched_util import simulate, who

from sim.request import Request


def seed_requests() -> list[Request]:
    return [Request(i, 0.0, 4, out) for i, out in enumerate([5, 3, 8, 2, 3])]


def test_static_batch_runs_to_its_last_request_and_nobody_joins():
    reqs = seed_requests()
    sch, ex = simulate(reqs, num_blocks=12, block_size=4, batching="static", max_num_seqs=4)
    assert who(ex) == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2], [0, 2], [0, 2], [2], [2], [2], [4], [4], [4]]
    # prefill together, then one token each
    assert ex.plans[0] == [(0, 4, 0), (1, 4, 0), (2, 4, 0), (3, 4, 0)]
    # memory reserved for prompt + output at admission: A 8 slots -> 2 blocks, B 6 -> 2, C 11 -> 3, D 5 -> 2
    assert ex.tables[0] == {0: [0, 1], 1: [2, 3], 2: [4, 5, 6], 3: [7, 8]}
    # finished D and B keep their blocks until C ends the batch (freed D, B, A, C, each tail first);
    # E then takes the head of the free queue: 9, 10
    assert ex.tables[8] == {4: [9, 10]}
    finish = {r.req_id: r.finish_s for r in reqs}
    assert finish == {0: 5.0, 1: 3.0, 2: 8.0, 3: 2.0, 4: 11.0}
    assert reqs[4].first_scheduled_s == 8.0


def test_static_timeline_shows_finished_requests_idle_until_the_batch_ends():
    sch, _ = simulate(seed_requests(), num_blocks=12, block_size=4, batching="static", max_num_seqs=4)
    tl = sch.timeline_frame()
    idle = tl[tl.phase == "idle"].set_index("req_id")
    assert idle.loc[3, ["start_s", "end_s"]].tolist() == [2.0, 8.0]   # D idles from step 2 to step 8
    assert idle.loc[1, ["start_s", "end_s"]].tolist() == [3.0, 8.0]   # B
    assert idle.loc[0, ["start_s", "end_s"]].tolist() == [5.0, 8.0]   # A
    e = tl[tl.req_id == 4].set_index("phase")
    assert e.loc["waiting", ["start_s", "end_s"]].tolist() == [0.0, 8.0]


def test_continuous_batching_gives_the_free_seat_to_the_next_request():
    reqs = seed_requests()
    sch, ex = simulate(reqs, num_blocks=12, block_size=4, batching="continuous", max_num_seqs=4)
    assert who(ex) == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 4], [0, 2, 4], [0, 2, 4], [2], [2], [2]]
    assert reqs[4].first_scheduled_s == 2.0 and reqs[4].finish_s == 5.0
    tl = sch.timeline_frame()
    assert not (tl.phase == "idle").any()


def test_static_batch_is_limited_by_reserved_memory():
    # 5 blocks of 4: A reserves 2 blocks (8 slots), B 2, C would need 3 (11 slots): C waits for the next batch
    reqs = [Request(0, 0.0, 4, 5), Request(1, 0.0, 4, 5), Request(2, 0.0, 4, 8)]
    _, ex = simulate(reqs, num_blocks=5, block_size=4, batching="static", max_num_seqs=8)
    assert who(ex)[0] == [0, 1]
    assert who(ex)[5] == [2]
