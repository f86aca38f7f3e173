"""Decode runs that go on past their requests' last tokens (nobody waiting): the batch shrinks as
requests finish inside the run. The single-step path is the reference: same results bit for bit.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from result_compare import assert_same
from test_multi_step import SWAP_GB, assert_same_outcomes, both_ways

import sim.sched.decode_run as decode_run
from sim.executors.cost_model import make_cost_model_executor
from sim.native import native
from sim.scenario import ExecutorConfig, scenario_from_dict
from sim.sched.decode_run_apply import boundary_events, boundary_steps

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)


@pytest.fixture
def through_count(monkeypatch) -> dict[str, int]:
    """Counts runs applied with finishes before their last step (and those finishes)."""
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS", 1)
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS_LARGE", 1)
    counts = {"runs": 0, "inner_finishes": 0}
    apply = decode_run.DecodeRunner._apply_through_finishes

    def counting(self, run):
        counts["runs"] += 1
        counts["inner_finishes"] += int((run.rem < run.k).sum())
        return apply(self, run)

    monkeypatch.setattr(decode_run.DecodeRunner, "_apply_through_finishes", counting)
    return counts


def test_shrinking_sums_count_each_request_until_its_last_step():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        c0 = rng.integers(1, 500, n)
        rem = rng.integers(1, 30, n)
        k = int(rng.integers(1, 35))
        seqs, ctx = decode_run._shrinking_sums(c0, rem, k)
        for j in range(k):   # by hand: request i computes token c0_i + j (context c0_i + j + 1) while j < rem_i
            alive = [i for i in range(n) if j < rem[i]]
            assert seqs[j] == len(alive)
            assert ctx[j] == sum(int(c0[i]) + j + 1 for i in alive)


def test_shrinking_segments_count_each_request_until_its_last_step():
    """The plain-Python stretches (a small batch) against the same count by hand."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        c0 = rng.integers(1, 500, n).tolist()
        k = int(rng.integers(1, 35))
        rem = rng.integers(1, 40, n).tolist()
        rem[int(rng.integers(0, n))] = k + int(rng.integers(0, 3))   # (some request computes in every step)
        sizes, lengths, bases = decode_run._shrinking_segments(c0, rem, k)
        assert sum(lengths) == k and min(lengths) > 0
        start = 0
        for size, length, base in zip(sizes, lengths, bases):
            for j in range(start, start + length):
                alive = [i for i in range(n) if j < rem[i]]
                assert size == len(alive)
                assert base == sum(c0[i] + 1 for i in alive)
            start += length


def test_boundary_events_are_the_steps_where_a_table_overflows():
    """Request i allocates at step j when it computes token c0_i + j, a multiple of the block size at or
    past its table's capacity, before its last step; the plain-Python events and the numpy ones agree."""
    rng = np.random.default_rng(6)
    for _ in range(300):
        n, bs, k = int(rng.integers(1, 10)), int(rng.choice([1, 4, 16])), int(rng.integers(1, 60))
        c0 = rng.integers(1, 300, n)
        l0 = -(-c0 // bs) + rng.integers(0, 2, n)   # a table covers what was computed (a block ahead at most)
        rem = rng.integers(1, 80, n)
        by_hand = sorted((j, i) for i in range(n) for j in range(min(int(rem[i]), k))
                         if (c0[i] + j) % bs == 0 and (c0[i] + j) // bs >= l0[i])
        finals: list[tuple[int, int]] = []
        pos, steps = boundary_events(c0.tolist(), l0.tolist(), rem.tolist(), k, bs, finals)
        assert list(zip(steps, pos)) == by_hand
        # a table is final once it covers the request's most KV tokens, c0 + rem (its last token computed
        # is c0 + rem - 1); noted where it gets there in the run with slots to spare
        expect = []
        for i in range(n):
            length = int(l0[i])
            for j in range(min(int(rem[i]), k)):
                if (c0[i] + j) % bs == 0 and (c0[i] + j) // bs >= length:
                    length += 1
                    if length * bs >= c0[i] + rem[i] and length * bs > c0[i] + rem[i]:
                        expect.append((j, i))
        assert sorted(finals) == sorted(expect)
        pos_np, steps_np = boundary_steps(c0, l0, rem, k, bs)
        assert sorted(zip(steps_np.tolist(), pos_np.tolist())) == by_hand
        if native is not None:   # the compiled events: the same lists, finals in request order
            assert native.boundary_events(c0, l0, rem, k, bs) == (pos, steps, finals)


@pytest.mark.parametrize("calibration", [None, "roofline"])
def test_profile_prices_equal_one_step_prices(calibration):
    """Entry j of ``execute_decode_profile`` is ``execute_decode_sums`` of step j alone, bit for bit, on the
    engine-level calibration and on the plain roofline."""
    scn = scenario_from_dict({"model": "llama-2-7b", "hardware": "h100-80gb",
                              "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]}})
    config = ExecutorConfig(calibration=calibration) if calibration else scn.executor
    exe = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=config,
                                   scheduler=scn.scheduler)
    assert (exe.engine is None) == (calibration == "roofline")
    seqs = np.array([40, 40, 39, 39, 39, 12, 3, 1, 12, 40], dtype=np.int64)   # (any order of sizes)
    ctx = np.array([9000, 9040, 8900, 8939, 8978, 4000, 1200, 700, 3000, 7000], dtype=np.int64)
    prof = exe.execute_decode_profile(seqs, ctx)
    sizes = [40, 39, 12, 3, 1, 12, 40]   # the same steps, as stretches of equal sizes
    lengths = [2, 3, 1, 1, 1, 1, 1]
    stretched = exe.execute_decode_profile(seqs, ctx, (sizes, lengths))
    assert (stretched.durations == prof.durations).all()
    assert all((stretched.breakdown[key] == v).all() for key, v in prof.breakdown.items())
    for j in range(len(seqs)):
        one = exe.execute_decode_sums(int(seqs[j]), int(ctx[j]), 1)
        assert prof.durations[j] == one.durations[0]
        assert set(prof.breakdown) == set(one.breakdown)
        assert all(prof.breakdown[key][j] == v[0] for key, v in one.breakdown.items())


BASE = {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 4,
        "kv_cache": {"block_size": 4, "num_gpu_blocks": 400, "swap_space_gb": SWAP_GB},
        "scheduler": {"max_num_seqs": 32},
        "output": {"plots": False},
        "workload": {"synthetic": {
            "num_requests": 60, "arrival": {"process": "poisson", "rate": 40.0},
            "prompt_len": {"dist": "uniform", "min": 4, "max": 60},
            "output_len": {"dist": "uniform", "min": 1, "max": 200}}}}


def _variant(name: str) -> dict:
    data = copy.deepcopy(BASE)
    if name == "tight_pool":   # the pool bound ends runs (then preemption by recompute)
        data["kv_cache"]["num_gpu_blocks"] = 90
    elif name == "shared_prefix":   # blocks shared by a prefix group: a finish frees only its own blocks
        data["workload"]["synthetic"]["shared_prefix"] = {"groups": 2, "length": 16}
    elif name == "sync_scheduling":
        data["scheduler"]["async_scheduling"] = False
    elif name == "priority":
        data["scheduler"]["policy"] = "priority"
        data["workload"]["synthetic"]["priority"] = {"dist": "uniform", "min": 0, "max": 3}
    return data


@pytest.mark.parametrize("name", ["plain", "tight_pool", "shared_prefix", "sync_scheduling", "priority"])
def test_runs_through_finishes_equal_single_stepping(name, through_count):
    single, multi = both_ways(_variant(name), check=True)
    assert_same(single, multi)
    assert through_count["runs"] > 0 and through_count["inner_finishes"] > through_count["runs"]


def test_prefix_caching_keeps_runs_ending_at_finishes(through_count):
    """A prefix cache takes freed blocks (eviction order): runs end with the first finish there."""
    data = _variant("plain")
    data["kv_cache"]["prefix_caching"] = True
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    assert through_count["runs"] == 0


@pytest.mark.parametrize("policy", ["least_requests", "power_of_two", "least_kv"])
def test_cluster_routers_see_finishes_inside_runs(policy, through_count):
    """Behind a router that reads loads or KV usage, a replica's run goes on through finishes and past
    arrivals; the load the router reads counts the finishes made by then (Engine.pending_finished), the
    KV usage the blocks taken by then less the tables of those finishes (Engine.pending_blocks), so every
    choice is single stepping's."""
    data = _variant("plain")
    data["workload"]["synthetic"]["num_requests"] = 120
    data["cluster"] = {"replicas": 3, "router": {"policy": policy}}
    single, multi = both_ways(data, check=True)
    assert_same(single, multi)
    assert (single.requests["replica"] == multi.requests["replica"]).all()
    assert through_count["runs"] > 0


def _random_case(rng: random.Random) -> dict:
    """A small random engine: block sizes, pool sizes, batch limits, policies, preemption modes, sync or
    async scheduling, shared prefixes and both calibrations."""
    data = {"model": rng.choice(["tiny-llama", "llama-3-8b"]), "hardware": rng.choice(["a100-80gb", "h100-80gb"]),
            "seed": rng.randrange(100),
            "kv_cache": {"block_size": rng.choice([1, 2, 4, 8, 16]), "num_gpu_blocks": rng.choice([40, 90, 200, 600]),
                         "swap_space_gb": SWAP_GB},
            "scheduler": {"max_num_seqs": rng.choice([2, 4, 8, 32]), "policy": rng.choice(["fcfs", "priority", "round_robin"]),
                          "chunked_prefill": rng.random() < 0.5, "async_scheduling": rng.random() < 0.5,
                          "preemption": rng.choice(["recompute", "swap"])},
            "output": {"plots": False},
            "workload": {"synthetic": {
                "num_requests": rng.choice([20, 60]),
                "arrival": {"process": "poisson", "rate": rng.choice([2.0, 20.0, 200.0])},
                "prompt_len": {"dist": "uniform", "min": 1, "max": rng.choice([8, 60, 200])},
                "output_len": {"dist": "uniform", "min": 1, "max": rng.choice([5, 50, 300])}}}}
    if data["scheduler"]["policy"] == "priority":
        data["workload"]["synthetic"]["priority"] = {"dist": "uniform", "min": 0, "max": 3}
    if rng.random() < 0.3:
        data["workload"]["synthetic"]["shared_prefix"] = {"groups": 2, "length": rng.choice([4, 16])}
    if rng.random() < 0.2:
        data["executor"] = {"calibration": "roofline"}
    return data


def test_random_engines_equal_single_stepping(through_count):
    """A few dozen random small engines (the fuzzer's cases rarely run with nobody waiting)."""
    for i in range(24):
        assert_same_outcomes(_random_case(random.Random(f"through-finishes-{i}")), f"case {i}")
    assert through_count["runs"] > 24
