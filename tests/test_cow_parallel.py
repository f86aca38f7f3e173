"""Parallel sampling (n > 1): forked block tables, copy-on-write pairs, ref counts after each step.

Hand-worked on 11 blocks of 16 tokens. A 20-token prompt fills block 0 and 4 slots of block 1; at the
first sampled token the request forks into n tables sharing both blocks; the first write into the
shared, partly filled block 1 copies it for every sequence but the last holder.
"""

from __future__ import annotations

from sim.kv.manager import KVCacheManager
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


def step(m: KVCacheManager, req: Request, n: int, seqs: int) -> None:
    """The scheduler's update for a step that computed ``n`` tokens in each of ``seqs`` sequences."""
    req.num_computed_tokens += n
    req.num_generated += 1
    m.note_computed(n * seqs)
    if req.num_generated < req.output_len:
        m.on_token(req)
    m.check_integrity()


def test_fork_then_copy_on_write_exact_pairs():
    m = KVCacheManager(11, 16)
    r = Request(0, 0.0, 20, 30, n=3)
    assert m.allocate_slots(r, 20)
    assert m.block_tables[0] == [0, 1]
    step(m, r, 20, 1)                              # prompt done, first token: fork into 3 sequences
    assert m.seq_tables(0) == [[0, 1], [0, 1], [0, 1]]
    assert m.pool.ref_counts[:2] == [3, 3]
    assert m.pool.num_used == 2
    # decode: every sequence writes token 20 into block 1 (4 of 16 slots filled, shared by 3)
    assert m.allocate_slots(r, 1)
    assert m.take_copies() == [(1, 2), (1, 3)]    # seq 0 and seq 1 copy; seq 2 is then the last holder
    assert m.seq_tables(0) == [[0, 2], [0, 3], [0, 1]]
    assert m.pool.ref_counts[:4] == [3, 1, 1, 1]
    step(m, r, 1, 3)
    # tokens 21..31 fill the private blocks without copies or allocations
    for _ in range(11):
        assert m.allocate_slots(r, 1)
        assert m.take_copies() == []
        step(m, r, 1, 3)
    assert r.num_computed_tokens == 32
    # token 32 starts a new block in each sequence, from the free queue's head
    assert m.allocate_slots(r, 1)
    assert m.seq_tables(0) == [[0, 2, 4], [0, 3, 5], [0, 1, 6]]
    assert m.pool.ref_counts[:7] == [3, 1, 1, 1, 1, 1, 1]
    step(m, r, 1, 3)
    m.free(r)
    assert m.pool.num_used == 0
    assert m.pool.free_order() == [7, 8, 9, 10, 4, 2, 5, 3, 6, 1, 0]
    m.check_integrity()


def test_block_aligned_prompt_needs_no_copy():
    m = KVCacheManager(11, 16)
    r = Request(0, 0.0, 32, 5, n=2)
    assert m.allocate_slots(r, 32)
    step(m, r, 32, 1)
    assert m.allocate_slots(r, 1)                  # token 32 opens a fresh block per sequence
    assert m.take_copies() == []
    assert m.seq_tables(0) == [[0, 1, 2], [0, 1, 3]]
    assert m.pool.ref_counts[:4] == [2, 2, 1, 1]
    step(m, r, 1, 2)


def _run(n: int, num_blocks: int = 64):
    scn = scenario_from_dict({
        "model": "tiny-llama", "hardware": "cpu",
        "kv_cache": {"block_size": 16, "num_gpu_blocks": num_blocks},
        "workload": {"requests": [{"arrival": 0.0, "prompt_len": 20, "output_len": 5, "n": n}]},
        "output": {"plots": False},
    })
    return run_scenario(scn)


def test_scheduler_plans_one_entry_per_sequence_and_the_copies():
    res = _run(3)
    s = res.steps
    assert res.summary["num_finished"] == 1
    # step 0: the prompt (20 tokens, one sequence); steps 1..4: 3 decode tokens each
    assert s["num_prefill_tokens"].tolist() == [20, 0, 0, 0, 0]
    assert s["num_decode_tokens"].tolist() == [0, 3, 3, 3, 3]
    assert s["batch_size"].tolist() == [1, 3, 3, 3, 3]
    assert s["blocks_copied"].tolist() == [0, 2, 0, 0, 0]
    # memory after each step: 2 blocks before the fork; then block 0 shared plus three private second
    # blocks; nothing once the request finished
    assert s["kv_blocks_used"].tolist() == [2, 4, 4, 4, 0]
    # all three sequences count as output: 3 x 5 tokens
    assert res.summary["output_throughput_tok_s"] * res.summary["makespan_s"] == 15


def test_n_sequences_take_n_seats():
    scn = scenario_from_dict({
        "model": "tiny-llama", "hardware": "cpu",
        "kv_cache": {"block_size": 16, "num_gpu_blocks": 64, "swap_space_gb": 0},
        "scheduler": {"max_num_seqs": 4},
        "workload": {"requests": [{"arrival": 0.0, "prompt_len": 20, "output_len": 3, "n": 3},
                                  {"arrival": 0.0, "prompt_len": 20, "output_len": 3, "n": 2}]},
        "output": {"plots": False},
    })
    res = run_scenario(scn)
    r = res.requests.set_index("req_id")
    # 3 + 2 seats > 4: the second request waits until the first finishes (3 steps)
    assert r.loc[1, "first_scheduled_s"] == r.loc[0, "finish_s"]


def test_preempted_group_forks_again_with_private_generated_blocks():
    m = KVCacheManager(11, 16)
    r = Request(0, 0.0, 20, 30, n=2)
    assert m.allocate_slots(r, 20)
    step(m, r, 20, 1)                              # fork: [[0, 1], [0, 1]]
    for _ in range(14):                            # tokens 20..33: seq 0 copies block 1 to 2; token 32
        assert m.allocate_slots(r, 1)              # opens block 3 (seq 0) and block 4 (seq 1)
        step(m, r, 1, 2)
    assert m.seq_tables(0) == [[0, 2, 3], [0, 1, 4]]
    m.free(r)                                      # preempted by recompute: 3, 2 (0 still held), 4, 1, 0
    r.num_computed_tokens = 0
    assert m.pool.free_order() == [5, 6, 7, 8, 9, 10, 3, 2, 4, 1, 0]
    # back: one sequence recomputes prompt + 15 generated tokens = 35 tokens, then forks
    assert m.allocate_slots(r, 35)
    assert m.block_tables[0] == [5, 6, 7]
    step(m, r, 35, 1)
    # the sibling shares block 0 (the prompt's only full block) and gets fresh blocks for the rest
    assert m.seq_tables(0) == [[5, 6, 7], [5, 8, 9]]
    assert m.pool.ref_counts[5:10] == [2, 1, 1, 1, 1]


def test_refork_after_recompute_prices_the_siblings_own_tokens():
    # block size 4, prompt 6 (1 full block + 2 tokens), n = 2, preempted by recompute after 3 tokens.
    # Back again, the prefill recomputes 6 + 3 = 9 tokens for sequence 0 and samples token 4; the re-fork
    # shares only the full prompt block (positions 0-3), so the sibling's positions 4..8 are its own:
    # 9 - 4 = 5 tokens it must recompute, priced on its entry of the next step (1 + 5 new, context 4).
    from sim.scenario import SchedulerConfig
    from sim.sched.continuous import ContinuousScheduler
    from sim.sched.plan import StepResult

    m = KVCacheManager(16, 4)
    sch = ContinuousScheduler(SchedulerConfig(), m, max_model_len=64)
    r = Request(0, 0.0, 6, 8, n=2)
    assert sch.add_request(r, 0.0)
    now = 0.0
    for _ in range(3):                       # prefill + 2 decodes: 3 tokens sampled
        plan = sch.schedule(now)
        now += 1.0
        sch.update(plan, StepResult(1.0), now)
        sch.check_integrity()
    assert (r.num_generated, r.num_computed_tokens) == (3, 8)
    sch.running.remove(r)
    sch._preempt(r, now)                     # recompute preemption: every table freed
    sch.check_integrity()
    assert m.pool.num_used == 0
    plan = sch.schedule(now)                 # back as one sequence: 6 + 3 tokens
    assert [(s.num_new_tokens, s.num_context_tokens) for s in plan.scheduled] == [(9, 0)]
    now += 1.0
    sch.update(plan, StepResult(1.0), now)   # samples token 4 and forks again
    sch.check_integrity()
    plan = sch.schedule(now)
    assert [(s.num_new_tokens, s.num_context_tokens) for s in plan.scheduled] == [(1, 9), (6, 4)]
    now += 1.0
    sch.update(plan, StepResult(1.0), now)
    sch.check_integrity()
    plan = sch.schedule(now)                 # afterwards both sequences decode one token each
    assert [(s.num_new_tokens, s.num_context_tokens) for s in plan.scheduled] == [(1, 10), (1, 10)]
