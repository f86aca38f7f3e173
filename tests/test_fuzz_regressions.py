"""Regressions found by the scenario fuzzer (sim/fuzz.py), each reduced to a minimal scenario.

A case whose fix belongs to code owned elsewhere is marked xfail with the reason until it lands (none
open now); every case must end with each request FINISHED, or REJECTED with a reason, never a deadlock.
"""

from __future__ import annotations

import pytest

from sim.errors import KvsimError
from sim.fuzz import check_outcome
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


def _run(scheduler: dict, requests: list[dict], **kv):
    data = {"model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 4, "num_gpu_blocks": 20, "swap_space_gb": 0.0, **kv},
            "scheduler": {"max_steps_without_progress": 100, **scheduler},
            "workload": {"requests": requests}}
    scn = scenario_from_dict(data)
    res = run_scenario(scn, check_integrity=True)
    assert check_outcome(res.requests, res.steps, res.summary, scn.kv_cache.num_gpu_blocks * 4) == []
    return res


# fuzz seed 2 case 1427: n parallel samples need n tokens per decode step; with n > max_num_batched_tokens the
# request was admitted but could never decode (engine deadlock). Fixed in sim/sched/base.py (rejected at arrival).
@pytest.mark.parametrize("scheduler, prompt", [({"max_num_batched_tokens": 1}, 1),
                                               ({"max_num_batched_tokens": 2, "chunked_prefill": True}, 6)])
def test_parallel_samples_wider_than_the_token_budget(scheduler, prompt):
    res = _run(scheduler, [{"arrival": 0.0, "prompt_len": prompt, "output_len": 3, "n": 3}])
    row = res.requests.iloc[0]
    budget = scheduler["max_num_batched_tokens"]
    # 3 sequences decode 3 tokens a step, more than the budget allows: refused at arrival, never run
    assert row["status"] == "REJECTED" and row["reject_reason"] == (
        f"3 parallel sequences need 3 tokens per decode step, above max_num_batched_tokens {budget}")
    assert res.summary["num_steps"] == 0


def test_parallel_samples_within_the_budget_finish():
    res = _run({"max_num_batched_tokens": 3}, [{"arrival": 0.0, "prompt_len": 2, "output_len": 3, "n": 3}])
    assert res.summary["num_finished"] == 1


# The fuzzer's token-count check: static batching and the contiguous allocators ran one sequence of an
# n > 1 request while the summary counted n x output tokens. Fixed in sim/runner.py: such a scenario is
# refused with a clear error naming the request and the settings.
@pytest.mark.parametrize("kv, scheduler", [({}, {"batching": "static"}),
                                           ({"allocator": "contiguous-oracle"}, {})])
def test_parallel_samples_outside_paged_continuous_are_refused(kv, scheduler):
    with pytest.raises(KvsimError) as err:
        _run(scheduler, [{"arrival": 0.0, "prompt_len": 8, "output_len": 5, "n": 3}], **kv)
    assert "n=3" in err.value.what and "paged" in err.value.what and "continuous" in err.value.what


def test_parallel_samples_fork_under_paged_continuous_batching():
    res = _run({}, [{"arrival": 0.0, "prompt_len": 8, "output_len": 5, "n": 3}])
    assert res.steps["num_prefill_tokens"].sum() + res.steps["num_decode_tokens"].sum() == 8 + 3 * 4
