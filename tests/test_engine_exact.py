"""The engine loop on tiny cases worked out by hand (constant 1 s steps)."""

import math

from sim.engine import Engine
from sim.kv.manager import KVCacheManager
from sim.metrics import Recorder, requests_frame
from sim.request import Request, RequestStatus
from sim.scenario import SchedulerConfig
from sim.sched.continuous import ContinuousScheduler
from sim.sched.plan import StepPlan, StepResult


class OneSecond:
    def __init__(self):
        self.plans = []

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append([(s.req_id, s.num_new_tokens, s.num_context_tokens, list(s.block_ids))
                           for s in plan.scheduled])
        return StepResult(1.0, {})


def run(reqs, num_blocks, block_size, **sched):
    mgr = KVCacheManager(num_blocks, block_size)
    sch = ContinuousScheduler(SchedulerConfig(**sched), mgr, max_model_len=4096)
    ex = OneSecond()
    rec = Recorder(num_blocks, num_blocks * block_size)
    Engine(reqs, sch, ex, rec, check_integrity=True).run()
    return sch, ex, rec


def test_two_requests_no_pressure():
    # A: prompt 10, 5 tokens out; B: prompt 20, 3 tokens out; both at t=0.
    # step 1 prefills both (30 tokens) and samples one token each; B's 3rd token comes at step 3,
    # A's 5th at step 5. Decode tokens: 2 + 2 + 1 + 1 = 6.
    a = Request(0, 0.0, 10, 5)
    b = Request(1, 0.0, 20, 3)
    sch, ex, rec = run([a, b], num_blocks=8, block_size=16)
    assert len(ex.plans) == 5
    assert [len(p) for p in ex.plans] == [2, 2, 2, 1, 1]
    assert ex.plans[0] == [(0, 10, 0, [0]), (1, 20, 0, [1, 2])]
    assert ex.plans[1] == [(0, 1, 10, [0]), (1, 1, 20, [1, 2])]
    steps = rec.steps_frame()
    assert steps["num_prefill_tokens"].tolist() == [30, 0, 0, 0, 0]
    assert steps["num_decode_tokens"].tolist() == [0, 2, 2, 1, 1]
    assert (a.first_token_s, a.finish_s) == (1.0, 5.0)
    assert (b.first_token_s, b.finish_s) == (1.0, 3.0)
    assert a.num_generated == 5 and b.num_generated == 3
    assert sch.manager.num_free_blocks() == 8


def test_recompute_preemption_of_the_latest_arrival():
    # block size 4, 3 blocks. A (prompt 4, out 6) and B (prompt 4, out 2) both at t=0.
    # step 1: A -> [0], B -> [1]; both sample a token.
    # step 2: A needs a 2nd block (takes 2); B needs a 2nd block, none free: B (latest) is preempted.
    # steps 3-5: B (5 tokens to recompute, 2 blocks) cannot fit beside A.
    # step 6: A's 9th token needs a 3rd block: block 1, freed by B. A finishes (6 tokens).
    # A's table [0, 2, 1] is freed tail first: free queue 1, 2, 0.
    # step 7: B recomputes 4 prompt + 1 generated tokens in blocks [1, 2] and samples its 2nd token.
    a = Request(0, 0.0, 4, 6)
    b = Request(1, 0.0, 4, 2)
    sch, ex, rec = run([a, b], num_blocks=3, block_size=4)
    assert len(ex.plans) == 7
    assert ex.plans[0] == [(0, 4, 0, [0]), (1, 4, 0, [1])]
    assert ex.plans[1] == [(0, 1, 4, [0, 2])]
    assert ex.plans[5] == [(0, 1, 8, [0, 2, 1])]
    assert ex.plans[6] == [(1, 5, 0, [1, 2])]
    assert b.num_preemptions == 1 and sch.num_preemptions == 1
    assert rec.steps_frame()["num_preempted"].tolist() == [0, 1, 0, 0, 0, 0, 0]
    assert (b.first_token_s, b.finish_s) == (1.0, 7.0)
    assert a.finish_s == 6.0
    assert a.status == b.status == RequestStatus.FINISHED


def test_max_num_seqs_and_token_budget():
    # three prompts of 8 at t=0, max 2 sequences: C waits for a seat until A and B finish (2 tokens each).
    reqs = [Request(i, 0.0, 8, 2) for i in range(3)]
    _, ex, _ = run(reqs, num_blocks=16, block_size=4, max_num_seqs=2)
    assert [[r for r, *_ in p] for p in ex.plans] == [[0, 1], [0, 1], [2], [2]]
    # budget 10 tokens: the second prompt does not fit in step 1 (8 + 8 > 10) and no overtaking
    reqs = [Request(i, 0.0, 8, 2) for i in range(2)]
    _, ex, _ = run(reqs, num_blocks=16, block_size=4, max_num_batched_tokens=10)
    assert [[(r, n) for r, n, *_ in p] for p in ex.plans] == [[(0, 8)], [(0, 1), (1, 8)], [(1, 1)]]


def test_chunked_prefill_splits_the_prompt_decodes_first():
    # budget 8: A's prompt of 20 goes 8 + 8 + 4; B (arrives at 1.5) decodes alongside
    a = Request(0, 0.0, 20, 2)
    b = Request(1, 0.0, 3, 4)
    _, ex, _ = run([a, b], num_blocks=16, block_size=4, max_num_batched_tokens=8, chunked_prefill=True)
    assert [[(r, n) for r, n, *_ in p] for p in ex.plans][:3] == [[(0, 8)], [(0, 8)], [(0, 4), (1, 3)]]
    assert a.first_token_s == 3.0


def test_rejects_what_can_never_fit_and_truncates_at_context():
    sch = ContinuousScheduler(SchedulerConfig(), KVCacheManager(4, 4), max_model_len=100)
    big = Request(0, 0.0, 10, 20)           # 29 tokens of KV > 16 slots
    assert not sch.add_request(big, 0.0)
    assert big.status == RequestStatus.REJECTED and "needs 8 KV blocks" in big.reject_reason
    long_prompt = Request(1, 0.0, 100, 5)
    assert not sch.add_request(long_prompt, 0.0)
    assert "max_model_len" in long_prompt.reject_reason
    capped = Request(2, 0.0, 10, 95)
    sch2 = ContinuousScheduler(SchedulerConfig(), KVCacheManager(64, 4), max_model_len=100)
    assert sch2.add_request(capped, 0.0) and capped.output_len == 90 and sch2.num_truncated == 1


def test_requests_frame_latencies_by_hand():
    a = Request(0, 0.0, 10, 5)
    b = Request(1, 0.5, 20, 3)
    run([a, b], num_blocks=8, block_size=16)
    df = requests_frame([a, b]).set_index("req_id")
    # B arrives at 0.5 while A's prefill step (0..1) runs; B is admitted at step 2 (1..2)
    assert df.loc[1, "first_scheduled_s"] == 1.0
    assert df.loc[1, "ttft_s"] == 2.0 - 0.5
    assert df.loc[0, "tpot_s"] == (a.finish_s - 1.0) / 4
    assert math.isclose(df.loc[1, "e2e_s"], b.finish_s - 0.5)
