"""Chunked prefill: prompts split to the token budget, decodes served first (budget 4, 1 s steps).

A (prompt 2, 4 out) and B (prompt 9, 2 out), both at t=0. By hand:
  step 1  A prefill 2, B chunk 2            (budget 4)
  step 2  A decode 1, B chunk 3 -> 5
  step 3  A decode 1, B chunk 3 -> 8
  step 4  A decode 1 (its 4th token, done), B last chunk 1 -> 9, B samples its 1st token
  step 5  B decode, done
"""

from test_sched_util import simulate

from sim.request import Request


def test_chunks_fill_the_budget_after_decodes():
    reqs = [Request(0, 0.0, 2, 4), Request(1, 0.0, 9, 2)]
    _, ex = simulate(reqs, 16, 4, chunked_prefill=True, max_num_batched_tokens=4)
    assert ex.plans == [[(0, 2, 0), (1, 2, 0)], [(0, 1, 2), (1, 3, 2)], [(0, 1, 3), (1, 3, 5)],
                        [(0, 1, 4), (1, 1, 8)], [(1, 1, 9)]]
    assert reqs[1].first_token_s == 4.0 and reqs[0].finish_s == 4.0


def test_a_long_prompt_is_chunked_and_holds_the_head_of_the_queue():
    reqs = [Request(0, 0.0, 12, 1), Request(1, 0.0, 1, 6)]
    _, ex = simulate(reqs, 16, 4, chunked_prefill=True, max_num_batched_tokens=3, max_num_seqs=2)
    # step 1: P takes the whole budget (3); D cannot join. steps 2-4: P 3 more each -> 12 at step 4.
    assert ex.plans[:4] == [[(0, 3, 0)], [(0, 3, 3)], [(0, 3, 6)], [(0, 3, 9)]]
    assert ex.plans[4] == [(1, 1, 0)]


def test_without_chunking_a_long_prompt_waits_for_budget():
    reqs = [Request(0, 0.0, 2, 3), Request(1, 0.0, 4, 1)]
    _, ex = simulate(reqs, 16, 4, max_num_batched_tokens=5)
    assert ex.plans[0] == [(0, 2, 0)]           # B's 4 tokens do not fit the 3 left
    assert ex.plans[1] == [(0, 1, 2), (1, 4, 0)]
