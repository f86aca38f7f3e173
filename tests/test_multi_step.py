"""Multi-step decode equals single stepping: the single-step path is the reference.

For every shipped scenario (trimmed), a few hand-made stress scenarios and a few hundred fuzzer cases,
the run with ``scheduler.multi_step: true`` and the run with ``false`` give the same summary.json (apart
from wall_time_s), the same per-step table, per-request table and timeline, bit for bit.
"""

from __future__ import annotations

import copy
import glob
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from result_compare import assert_same

import sim.sched.decode_run as decode_run
from sim.engine import delay_to
from sim.fuzz import draw_scenario
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario, scenario_from_dict

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
NOT_COMPARABLE = {"quickstart_gpu_cpu.yaml": "times real kernels: two runs differ anyway",
                  "sweep_example.yaml": "a sweep file, not a scenario"}


@pytest.fixture
def run_count(monkeypatch) -> dict[str, int]:
    """Counts decode runs (and the steps inside them) taken by the multi-step path; runs of any length
    are taken (MIN_RUN_STEPS = 1) so that short runs are compared too."""
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS", 1)
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS_LARGE", 1)
    counts = {"runs": 0, "steps": 0}
    apply = decode_run.DecodeRunner.apply

    def counting(self, run):
        counts["runs"] += 1
        counts["steps"] += run.k
        return apply(self, run)

    monkeypatch.setattr(decode_run.DecodeRunner, "apply", counting)
    return counts


def both_ways(data: dict, check: bool = False) -> tuple[Result, Result]:
    out = []
    for multi in (False, True):
        d = copy.deepcopy(data)
        d.setdefault("scheduler", {})["multi_step"] = multi
        out.append(run_scenario(scenario_from_dict(d, source="<test>"), check_integrity=check))
    return out[0], out[1]


def test_cumsum_adds_left_to_right():
    rng = np.random.default_rng(0)
    d = rng.uniform(1e-4, 0.1, 5000)
    ends = np.cumsum(np.concatenate(([1234.5678], d)))
    t = 1234.5678
    for j, x in enumerate(d.tolist()):
        t += x
        assert ends[j + 1] == t


def test_delay_to_lands_exactly_or_says_none():
    rng = random.Random(1)
    for _ in range(2000):
        now = rng.uniform(0, 5000)
        target = now + rng.uniform(1e-3, 50)
        d = delay_to(now, target)
        assert d is None or now + d == target
    assert delay_to(1.1247835230440482, 3.1886921078366988) is None   # ties to even miss an odd target


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml"))), ids=lambda p: Path(p).name)
def test_shipped_scenarios_equal(path, run_count):
    if Path(path).name in NOT_COMPARABLE:
        pytest.skip(NOT_COMPARABLE[Path(path).name])
    results = []
    for multi in ("false", "true"):
        scn = load_scenario(path, [f"scheduler.multi_step={multi}", "workload.limit=250"])
        results.append(run_scenario(scn, check_integrity=False))   # big caches: the check is slow
    assert_same(*results)


# Scenarios that preempt by recompute never use the CPU swap space, but its integrity check after every
# step costs O(swap blocks) (sim/kv/swap.py reads the whole ref-count array), and the default 4 GB is
# 0.5-1 million tiny-llama blocks: a small space (still one, so the same checks run) keeps them fast.
SWAP_GB = 0.001

STRESS = {
    # long decodes with poisson arrivals: runs cut by arrivals, finishes, block boundaries
    "long_decodes": {"model": "llama-3-8b", "hardware": "h100-80gb", "seed": 5,
                     "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 2048},
                     "workload": {"synthetic": {
                         "num_requests": 300, "arrival": {"process": "poisson", "rate": 20.0},
                         "prompt_len": {"dist": "lognormal", "mean": 300, "std": 200, "min": 4, "max": 2000},
                         "output_len": {"dist": "lognormal", "mean": 200, "std": 150, "min": 1, "max": 1500}}}},
    # a cache that runs full inside decode runs (pool bound, then preemption), prefix caching on
    "tight_pool": {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 7,
                   "kv_cache": {"block_size": 4, "num_gpu_blocks": 60, "prefix_caching": True, "swap_space_gb": SWAP_GB},
                   "scheduler": {"max_num_seqs": 8, "async_scheduling": False},
                   "workload": {"synthetic": {
                       "num_requests": 80, "arrival": {"process": "poisson", "rate": 200.0},
                       "prompt_len": {"dist": "uniform", "min": 4, "max": 40},
                       "output_len": {"dist": "uniform", "min": 1, "max": 120},
                       "shared_prefix": {"groups": 2, "length": 8}}}},
    # a full batch with a queue (admissions impossible), priorities, swap preemption
    "full_batch_priority": {"model": "tiny-llama", "hardware": "h100-80gb", "seed": 9,
                            "kv_cache": {"block_size": 8, "num_gpu_blocks": 80, "swap_space_gb": 0.01},
                            "scheduler": {"policy": "priority", "max_num_seqs": 4, "preemption": "swap"},
                            "workload": {"synthetic": {
                                "num_requests": 60, "arrival": {"process": "poisson", "rate": 500.0},
                                "prompt_len": {"dist": "uniform", "min": 4, "max": 30},
                                "output_len": {"dist": "uniform", "min": 1, "max": 90},
                                "priority": {"dist": "uniform", "min": 0, "max": 3}}}},
    # a memory-bound queue: seats free, the head of the queue does not fit (FCFS, chunked and not)
    "blocked_head": {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 8,
                     "kv_cache": {"block_size": 4, "num_gpu_blocks": 40, "swap_space_gb": SWAP_GB},
                     "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 48},
                     "workload": {"synthetic": {
                         "num_requests": 80, "arrival": {"process": "poisson", "rate": 300.0},
                         "prompt_len": {"dist": "uniform", "min": 4, "max": 40},
                         "output_len": {"dist": "uniform", "min": 1, "max": 80}}}},
    "blocked_head_chunked": {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 10,
                             "kv_cache": {"block_size": 8, "num_gpu_blocks": 24, "swap_space_gb": SWAP_GB},
                             "scheduler": {"max_num_seqs": 64, "chunked_prefill": True,
                                           "max_num_batched_tokens": 16, "policy": "priority"},
                             "workload": {"synthetic": {
                                 "num_requests": 80, "arrival": {"process": "poisson", "rate": 300.0},
                                 "prompt_len": {"dist": "uniform", "min": 4, "max": 60},
                                 "output_len": {"dist": "uniform", "min": 1, "max": 80},
                                 "priority": {"dist": "uniform", "min": 0, "max": 2}}}},
    # round robin with a frontend delay
    "round_robin": {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 4,
                    "kv_cache": {"block_size": 4, "num_gpu_blocks": 50, "swap_space_gb": SWAP_GB},
                    "scheduler": {"policy": "round_robin", "rr_quantum_steps": 3, "max_num_seqs": 4},
                    "workload": {"synthetic": {
                        "num_requests": 50, "arrival": {"process": "poisson", "rate": 100.0},
                        "prompt_len": {"dist": "uniform", "min": 4, "max": 30},
                        "output_len": {"dist": "uniform", "min": 1, "max": 60}}}},
}


@pytest.mark.parametrize("name", sorted(STRESS))
@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("min_steps", [1, 4])
def test_stress_scenarios_equal(name, async_scheduling, min_steps, run_count, monkeypatch):
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS", min_steps)
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS_LARGE", min_steps)
    data = copy.deepcopy(STRESS[name])
    data["scheduler"]["async_scheduling"] = async_scheduling
    data["output"] = {"plots": False}
    single, multi = both_ways(data, check=name != "long_decodes")
    assert_same(single, multi)
    assert run_count["runs"] > 0 and run_count["steps"] > run_count["runs"], "no multi-step run was taken"


def _outcome(data: dict, multi: bool) -> Result | str:
    d = copy.deepcopy(data)
    d.setdefault("scheduler", {})["multi_step"] = multi
    try:
        return run_scenario(scenario_from_dict(d, source="<fuzz>"), check_integrity=True)
    except Exception as e:  # noqa: BLE001 - a case that fails must fail the same way both ways
        return f"{type(e).__name__}: {e}"


def assert_same_outcomes(data: dict, case: str) -> None:
    """Single stepping and multi-step give the same results, or fail with the same error."""
    single, multi = _outcome(data, False), _outcome(data, True)
    if isinstance(single, str) or isinstance(multi, str):
        assert single == multi, case
    else:
        assert_same(single, multi)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_cases_equal(seed, run_count):
    for i in range(100):
        assert_same_outcomes(draw_scenario(random.Random(f"multi-step-{seed}:{i}"), i), f"case {i}")
    assert run_count["runs"] > 0


def test_executors_without_the_flag_step_one_at_a_time(run_count):
    from sim.engine import Engine
    from sim.kv.manager import KVCacheManager
    from sim.metrics import Recorder
    from sim.request import Request
    from sim.scenario import SchedulerConfig
    from sim.sched.continuous import ContinuousScheduler
    from sim.sched.plan import StepResult

    class Fixed:  # no supports_decode_runs: a real executor must see every step
        def __init__(self):
            self.calls = 0

        def execute(self, plan):
            self.calls += 1
            return StepResult(1.0, {})

    mgr = KVCacheManager(64, 4)
    sched = ContinuousScheduler(SchedulerConfig(), mgr, 4096)
    ex = Fixed()
    engine = Engine([Request(0, 0.0, 5, 20)], sched, ex, Recorder(64, 256), multi_step=True)
    engine.run()
    assert ex.calls == 20 and run_count["runs"] == 0 and not engine.multi_step
    assert math.isclose(sched.finished[0].finish_s, 20.0)


@pytest.mark.parametrize("policy", ["round_robin", "random", "least_requests", "least_kv", "prefix_affinity"])
def test_cluster_replicas_equal(policy, run_count):
    """Replicas take decode runs (and chains of them) up to their next request (a router that reads no
    state: known ahead) or up to the next request of the cluster (the router reads every replica then).
    Either way the cluster's results equal single stepping's."""
    data = copy.deepcopy(STRESS["long_decodes"])
    data["workload"]["synthetic"]["arrival"]["rate"] = 60.0
    if policy == "prefix_affinity":
        data["kv_cache"] = {"prefix_caching": True}
        data["workload"]["synthetic"]["shared_prefix"] = {"groups": 3, "length": 64}
    data["output"] = {"plots": False}
    # a pool of 4,000 blocks a replica (still room for every request): the check after every step is O(blocks)
    data.setdefault("kv_cache", {})["num_gpu_blocks"] = 4000
    data["cluster"] = {"replicas": 3, "router": {"policy": policy}}
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    pd.testing.assert_frame_equal(single.replicas, multi.replicas, check_exact=True)
    assert run_count["runs"] > 0 and run_count["steps"] > 2 * run_count["runs"]


@pytest.fixture
def cut_count(monkeypatch) -> dict[str, int]:
    """Counts decode runs cut by a request routed to their replica (lazily cut runs)."""
    counts = {"cuts": 0}
    cut = decode_run.DecodeRunner.cut

    def counting(self, run, now):
        counts["cuts"] += 1
        return cut(self, run, now)

    monkeypatch.setattr(decode_run.DecodeRunner, "cut", counting)
    return counts


# small pools (the integrity check after every step is O(blocks)), long decodes, a busy cluster
LAZY = {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 11, "output": {"plots": False},
        "kv_cache": {"block_size": 8, "num_gpu_blocks": 400, "swap_space_gb": SWAP_GB},
        "scheduler": {"max_num_seqs": 24, "chunked_prefill": True, "max_num_batched_tokens": 256},
        "workload": {"synthetic": {
            "num_requests": 160, "arrival": {"process": "poisson", "rate": 400.0},
            "prompt_len": {"dist": "uniform", "min": 4, "max": 200},
            "output_len": {"dist": "uniform", "min": 1, "max": 300}}}}


@pytest.mark.parametrize("policy", ["least_requests", "power_of_two", "session", "least_kv"])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_load_routers_cut_runs_lazily(policy, async_scheduling, run_count, cut_count):
    """Behind a router that reads only loads or KV usage, a replica's decode runs go past arrivals
    routed elsewhere (the KV usage read then counts the blocks the run has taken so far) and are cut
    when one is routed to it: results still equal single stepping's, and cuts happen."""
    data = copy.deepcopy(LAZY)
    data["scheduler"]["async_scheduling"] = async_scheduling
    data["cluster"] = {"replicas": 4, "router": {"policy": policy}}
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    pd.testing.assert_frame_equal(single.replicas, multi.replicas, check_exact=True)
    assert run_count["runs"] > 0 and cut_count["cuts"] > 0


@pytest.mark.parametrize("policy", ["least_requests", "session"])
def test_lazy_cuts_hand_staged_requests_over_as_single_stepping_does(policy, run_count, cut_count):
    """With async scheduling a cut run goes on through the step after the arrival's (planned without it);
    the request is handed over as that step starts, where single stepping hands it over. Some prompts can
    never fit and are rejected on hand-over: a load read during that step sees the rejection then."""
    data = copy.deepcopy(LAZY)
    data["scheduler"]["async_scheduling"] = True
    data["workload"]["synthetic"]["prompt_len"] = {"dist": "uniform", "min": 4, "max": 4800}
    data["cluster"] = {"replicas": 4, "router": {"policy": policy}}
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    pd.testing.assert_frame_equal(single.replicas, multi.replicas, check_exact=True)
    assert run_count["runs"] > 0 and cut_count["cuts"] > 0
    assert single.summary["num_rejected"] > 10


def test_disaggregated_prefill_pool_behind_least_requests_equal(run_count):
    data = copy.deepcopy(LAZY)
    data["cluster"] = {"prefill": {"replicas": 2}, "decode": {"replicas": 2},
                       "kv_transfer": {"link": "infiniband-400g"}, "router": {"policy": "least_requests"}}
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    pd.testing.assert_frame_equal(single.replicas, multi.replicas, check_exact=True)


def _run(ends: list[float], k: int) -> decode_run.PendingRun:
    e = np.array(ends)
    return decode_run.PendingRun(k, [], [], [], np.full(1, 100), np.diff(e), e)


def test_lazy_runs_never_end_a_step_at_an_arrival():
    """Steps end at 1, 2, 3, 4: an arrival process waking at 2.0 (exactly a step's end) leaves the run
    one step (the step ending then is single stepped); one waking at 2.5 cuts nothing when planning."""
    ends = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    runner = decode_run.DecodeRunner(None, None, None, arrival_times=np.array([2.0, 9.0]))
    assert runner._before_tie(ends, 4) == 1
    runner.arrival_times = np.array([0.0, 2.5, 4.5])
    assert runner._before_tie(ends, 4) == 4
    runner.arrival_times = np.array([4.0])
    assert runner._before_tie(ends, 4) == 3 and runner._before_tie(ends, 2) == 2


def test_a_cut_run_ends_with_the_step_the_arrival_falls_in():
    runner = decode_run.DecodeRunner(None, None, None, arrival_times=np.array([]))
    run = _run([0.0, 1.0, 2.0, 3.0, 4.0], 4)
    runner.cut(run, 2.5)                      # inside step 2 (2.0 .. 3.0): steps 0, 1, 2 remain
    assert run.k == 3 and run.end == 3.0 and list(run.ends) == [0.0, 1.0, 2.0, 3.0]
    run = _run([0.0, 1.0, 2.0, 3.0, 4.0], 4)
    runner.cut(run, 0.5)
    assert run.k == 1 and run.end == 1.0
    with pytest.raises(AssertionError):
        runner.cut(_run([0.0, 1.0, 2.0], 2), 1.0)   # exactly at a step's end: planning excludes it


def test_with_async_scheduling_a_cut_run_goes_on_through_the_next_step_if_priced():
    """The step after the arrival's is planned before the request is handed over: the run keeps it."""
    runner = decode_run.DecodeRunner(None, None, None, arrival_times=np.array([]), staging=True)
    run = _run([0.0, 1.0, 2.0, 3.0, 4.0], 4)
    assert runner.cut(run, 1.5)               # inside step 1: steps 0, 1 and 2 remain
    assert run.k == 3 and list(run.ends) == [0.0, 1.0, 2.0, 3.0]
    run = _run([0.0, 1.0, 2.0, 3.0, 4.0], 4)
    assert not runner.cut(run, 3.5)           # inside the last priced step: nothing after it to keep
    assert run.k == 4 and run.end == 4.0


def test_a_cut_run_lands_on_its_end_even_where_no_single_delay_does():
    """A cut run waits from the arrival's time (off the step grid) to its new end; where no float delay
    lands there (ties to even), the wait goes through a point in between and still lands exactly."""
    import simpy

    from sim.engine import Engine

    now, target = 1.1247835230440482, 3.1886921078366988   # delay_to(now, target) is None
    for start in (now, 0.5):
        waiter = type("W", (), {})()
        waiter.env, waiter.num_waits = simpy.Environment(initial_time=start), 0
        waiter.env.process(Engine._wait_until(waiter, target))
        waiter.env.run()
        assert waiter.env.now == target
        assert waiter.num_waits == (2 if start == now else 1)
