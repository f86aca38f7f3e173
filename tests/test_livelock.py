"""Livelock and starvation: kvsim makes progress (or rejects with a reason) within a bounded number of
steps, and the watchdog turns a run without progress into a clear error, never a hang."""

from __future__ import annotations

import pytest
import yaml

from sim.errors import KvsimError
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


def _scenario(blocks: int, requests: list[dict], block_size: int = 4, swap_gb: float = 0.0, **sched) -> dict:
    return {"model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": block_size, "num_gpu_blocks": blocks, "swap_space_gb": swap_gb},
            "scheduler": {"max_steps_without_progress": 200, **sched},
            "workload": {"requests": requests}}


def _run(data: dict):
    return run_scenario(scenario_from_dict(data), check_integrity=True)


def _serial_steps(requests: list[dict]) -> int:
    """Steps to serve the requests one at a time: a prefill, then output - 1 decodes each."""
    return sum(r["output_len"] for r in requests)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["fcfs", "priority", "round_robin"])
def test_cache_barely_larger_than_one_request_with_many_arrivals(preemption, policy):
    # each request holds 10 + 14 - 1 = 23 tokens of KV at most: 6 blocks of 4; the cache has 7
    reqs = [{"arrival": 0.01 * i, "prompt_len": 10, "output_len": 14, "priority": i % 3} for i in range(25)]
    res = _run(_scenario(7, reqs, swap_gb=0.0001, preemption=preemption, policy=policy))
    s = res.summary
    assert s["num_finished"] == 25 and s["num_rejected"] == 0
    # bound: every request served alone, plus one recompute of 24 tokens per preemption, twice over
    assert s["num_steps"] <= 2 * (_serial_steps(reqs) + s["num_preemptions"] * 24)


@pytest.mark.parametrize("allocator", ["contiguous-oracle", "contiguous-pow2"])
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_tight_cache_with_other_batching_and_allocators(batching, allocator):
    # 12 blocks of 4 = 48 slots; each request reserves at most 23 (oracle) or 32 (pow2) tokens
    reqs = [{"arrival": 0.01 * i, "prompt_len": 10, "output_len": 14} for i in range(12)]
    data = _scenario(12, reqs, batching=batching)
    data["kv_cache"]["allocator"] = allocator
    s = _run(data).summary
    assert s["num_finished"] == 12
    assert s["num_steps"] <= 2 * (_serial_steps(reqs) + s["num_preemptions"] * 24)


@pytest.mark.parametrize("victim", ["latest_arrival", "most_generated"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_ping_pong_between_two_long_requests(victim, preemption):
    # two requests of 4 + 60 tokens (16 blocks of 4 at the end each) in a cache of 20 blocks: both
    # start, both grow, one must give way; whoever is preempted keeps its generated tokens
    reqs = [{"arrival": 0.0, "prompt_len": 4, "output_len": 61}, {"arrival": 0.0, "prompt_len": 4, "output_len": 61}]
    res = _run(_scenario(20, reqs, swap_gb=0.001, preemption=preemption, victim=victim))
    s = res.summary
    assert s["num_finished"] == 2
    assert s["num_preemptions"] <= 4
    assert s["num_steps"] <= 2 * _serial_steps(reqs) + 2 * s["num_preemptions"]


def test_swap_space_full_falls_back_and_finishes():
    # the swap space holds 2 blocks of this tiny model (kv bytes a block: 2*2*2*64*2*4 = 4096), too few
    # for any preempted request: the scheduler must fall back to recompute and still finish everyone
    reqs = [{"arrival": 0.0, "prompt_len": 12, "output_len": 20} for _ in range(6)]
    swap_gb = 2 * 4096 / 1024**3
    res = _run(_scenario(12, reqs, swap_gb=swap_gb, preemption="swap"))
    s = res.summary
    assert s["num_finished"] == 6 and s["num_preemptions"] > 0
    assert s["num_steps"] <= 2 * (_serial_steps(reqs) + s["num_preemptions"] * 31)


def test_requests_that_never_fit_are_rejected_with_reasons_while_others_run():
    reqs = [{"arrival": 0.0, "prompt_len": 40, "output_len": 5},   # 44 tokens: 11 blocks > 8
            {"arrival": 0.0, "prompt_len": 8, "output_len": 5},
            {"arrival": 0.0, "prompt_len": 20, "output_len": 20}]  # 39 tokens: 10 blocks > 8
    res = _run(_scenario(8, reqs))
    st = res.requests.set_index("req_id")
    assert list(st["status"]) == ["REJECTED", "FINISHED", "REJECTED"]
    assert "11 KV blocks" in st.loc[0, "reject_reason"] and "10 KV blocks" in st.loc[2, "reject_reason"]
    assert res.summary["num_steps"] == 5


class _Thrash:
    """A scheduler stub that recomputes the same 8-token prompt every step and never samples: a livelock."""

    def __init__(self) -> None:
        from sim.sched.base import StepStats

        self.stats = StepStats()
        self.running: list = []

    def has_work(self) -> bool:
        return True

    def num_waiting(self) -> int:
        return 1

    def add_request(self, req, now) -> bool:
        return True

    def schedule(self, now):
        from sim.sched.plan import ScheduledRequest, StepPlan

        return StepPlan(scheduled=[ScheduledRequest(0, 8, 0, [0, 1])])

    def update(self, plan, result, now) -> list:
        return []


class _Const:
    def execute(self, plan):
        from sim.sched.plan import StepResult

        return StepResult(duration_s=0.001)


class _NoRecord:
    def record_step(self, *args) -> None:
        pass


def test_watchdog_turns_a_real_livelock_into_an_error():
    from sim.engine import Engine

    engine = Engine([], _Thrash(), _Const(), _NoRecord(), max_steps_without_progress=10)
    with pytest.raises(KvsimError) as err:
        engine.run()
    # step 1 computes tokens 0..8 for the first time (progress); steps 2..11 only redo them
    assert err.value.where == "engine" and "no progress for 10 steps at t=0.011s" in err.value.what
    assert "livelock" in err.value.what


def test_watchdog_error_is_one_line_on_the_cli(tmp_path, monkeypatch, capsys, simpy_loop):
    import sim.engine
    from sim.cli import main as kvsim_main

    monkeypatch.setattr(sim.engine.Engine, "_advanced", lambda self, plan: False)  # progress only by samples
    data = _scenario(20, [{"arrival": 0.0, "prompt_len": 40, "output_len": 3}], chunked_prefill=True,
                     max_num_batched_tokens=1, max_steps_without_progress=10)
    path = tmp_path / "stall.yaml"
    path.write_text(yaml.safe_dump(data))
    assert kvsim_main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: engine: no progress for 10 steps") and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_prompt_prefilled_one_token_a_step_is_progress():
    # a 40-token prompt with a budget of 1 token a step samples nothing for 40 steps, yet advances every step
    data = _scenario(20, [{"arrival": 0.0, "prompt_len": 40, "output_len": 3}], chunked_prefill=True,
                     max_num_batched_tokens=1, max_steps_without_progress=2)
    s = _run(data).summary
    assert s["num_finished"] == 1 and s["num_steps"] == 40 + 2  # 40 prefill chunks, then 2 decodes


def test_a_long_prompt_with_a_tiny_budget_is_not_a_livelock():
    data = _scenario(800, [{"arrival": 0.0, "prompt_len": 3000, "output_len": 2}], chunked_prefill=True,
                     max_num_batched_tokens=1, max_steps_without_progress=1)
    s = _run(data).summary
    assert s["num_finished"] == 1 and s["num_steps"] == 3000 + 1


def test_would_reject_predicts_add_request_without_changing_the_request():
    """The predicate a cut decode run asks before handing a staged request over: the same verdict as
    ``add_request`` (including its truncation of outputs at max_model_len), the request untouched."""
    from sim.kv import make_kv_manager
    from sim.request import Request
    from sim.scenario import KVCacheConfig, SchedulerConfig
    from sim.sched import make_scheduler

    # 10 blocks of 4 tokens: a request fits when its prompt + output - 1 tokens take at most 10 blocks;
    # a prompt of max_model_len tokens or more never fits; an output past max_model_len is cut there
    cases = [(64, 8, 5, False), (64, 30, 20, True),     # 49 tokens: 13 blocks
             (64, 20, 15, False), (64, 64, 4, True),    # 34 tokens: 9 blocks; the prompt alone too long
             (64, 30, 100, True),                       # cut to 34: 63 tokens, 16 blocks
             (32, 20, 40, False), (32, 39, 2, True)]    # cut to 12: 31 tokens, 8 blocks (uncut: 15)
    for max_len, prompt, output, rejected in cases:
        mgr = make_kv_manager(KVCacheConfig(block_size=4), 10, 0, max_len)
        sch = make_scheduler(SchedulerConfig(), mgr, max_len)
        req = Request(0, 0.0, prompt, output)
        assert sch.would_reject(req) is rejected
        assert req.output_len == output   # untouched
        assert sch.add_request(req, 0.0) is not rejected
