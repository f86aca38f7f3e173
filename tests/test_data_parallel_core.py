"""Data-parallel engines in the compiled core (sim/csrc/core/lockstep.inc): the same results as the SimPy
loop's LockstepGroup, bit for bit, for one engine and fleets, every router the core takes, preemption by
recompute and swap, prefix caching, client timeouts, a client with a concurrency limit, parallel samples,
prefill and decode pools; the lockstep counts recomputed from the step table."""

from __future__ import annotations

import numpy as np
import pytest
from result_compare import assert_same

from sim import engine_core
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

BASE = {
    "name": "dp-core", "seed": 5, "model": "mixtral-8x7b", "hardware": {"name": "h100-80gb"},
    "output": {"plots": False},
    "kv_cache": {"num_gpu_blocks": 400},   # (a small cache: the SimPy loop's integrity checks stay cheap)
    "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "chunked_prefill": True},
    "cluster": {"replicas": 4, "data_parallel": True},
    "workload": {"synthetic": {"num_requests": 160, "arrival": {"process": "poisson", "rate": 30},
                               "prompt_len": {"dist": "uniform", "min": 20, "max": 1500},
                               "output_len": {"dist": "uniform", "min": 2, "max": 120}}},
}


def _scenario(**sections) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def _both(data: dict):
    """(the run in the compiled core, the run in the SimPy loop)."""
    core = run_scenario(scenario_from_dict(data), check_integrity=True)
    before, engine_core.enabled = engine_core.enabled, False
    try:
        loop = run_scenario(scenario_from_dict(data), check_integrity=True)
    finally:
        engine_core.enabled = before
    return core, loop


CASES = {
    "dp_balance": {},
    "least_requests": {"cluster": {"router": {"policy": "least_requests"}}},
    "fleet of two engines, least_kv gateway": {"cluster": {"replicas": 4, "data_parallel_size": 2,
                                                           "router": {"policy": "least_kv"}}},
    "fleet of two engines, round_robin gateway": {"cluster": {"replicas": 6, "data_parallel_size": 2,
                                                              "router": {"policy": "round_robin"}}},
    "recompute under memory pressure": {"kv_cache": {"num_gpu_blocks": 160}},
    "swap under memory pressure": {"kv_cache": {"num_gpu_blocks": 160, "swap_space_gb": 4},
                                   "scheduler": {"preemption": "swap"}},
    "prefix caching": {"kv_cache": {"prefix_caching": True},
                       "workload": {"synthetic": {**BASE["workload"]["synthetic"],
                                                  "shared_prefix": {"groups": 3, "length": 400},
                                                  "prompt_len": {"dist": "uniform", "min": 420, "max": 1500}}}},
    "prefix_affinity over the ranks' prefix caches (its rule reads them)": {
        "kv_cache": {"prefix_caching": True}, "cluster": {"router": {"policy": "prefix_affinity"}},
        "workload": {"synthetic": {**BASE["workload"]["synthetic"], "shared_prefix": {"groups": 3, "length": 400},
                                   "prompt_len": {"dist": "uniform", "min": 420, "max": 1500}}}},
    "client timeouts": {"workload": {"timeout_s": 1.5}},
    "a client of 6 slots in front": {"workload": {"max_concurrency": 6}},
    "a client of 12 slots in front of a fleet": {"workload": {"max_concurrency": 12},
                                                 "cluster": {"replicas": 4, "data_parallel_size": 2}},
    "parallel samples under memory pressure (forks, preempted groups)": {
        "kv_cache": {"num_gpu_blocks": 90},
        "workload": {"synthetic": {**BASE["workload"]["synthetic"], "num_requests": 120, "n": 3,
                                   "output_len": {"dist": "uniform", "min": 2, "max": 60}}}},
    "parallel samples on a fleet of two engines": {
        "cluster": {"replicas": 4, "data_parallel_size": 2, "router": {"policy": "least_kv"}},
        "workload": {"synthetic": {**BASE["workload"]["synthetic"], "num_requests": 120, "n": 4,
                                   "output_len": {"dist": "uniform", "min": 2, "max": 60}}}},
    "expert parallel, no chunked prefill": {"hardware": {"expert_parallel": True},
                                            "scheduler": {"chunked_prefill": False,
                                                          "max_num_batched_tokens": 2048}},
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_core_gives_the_loops_results(name: str) -> None:
    core, loop = _both(_scenario(**CASES[name]))
    assert core.profile["compiled_core"] is True and loop.profile["compiled_core"] is False
    assert_same(core, loop)


def test_the_cases_reach_what_they_are_named_for() -> None:
    """(so that the comparisons above cover preemption, swaps, aborts and prefix hits)"""
    s = run_scenario(scenario_from_dict(_scenario(**CASES["recompute under memory pressure"]))).summary
    assert s["num_preemptions"] > 0
    s = run_scenario(scenario_from_dict(_scenario(**CASES["parallel samples under memory pressure (forks, "
                                                           "preempted groups)"]))).summary
    assert s["num_preemptions"] > 0
    s = run_scenario(scenario_from_dict(_scenario(**CASES["swap under memory pressure"]))).summary
    assert s["swapped_blocks"] > 0
    reqs = run_scenario(scenario_from_dict(_scenario(**CASES["client timeouts"]))).requests
    assert (reqs["status"] == "ABORTED").sum() > 0
    s = run_scenario(scenario_from_dict(_scenario(**CASES["prefix caching"]))).summary
    assert s["prefix_cache_hit_rate"] > 0


@pytest.mark.parametrize("replicas,size", [(4, 4), (6, 2)])
def test_the_lockstep_counts_match_the_step_table(replicas: int, size: int) -> None:
    """padding_share, group_steps and dummy passes recomputed from the per-step rows: a group step is the
    rows of one engine's ranks that start together; its slots are ranks x the largest rank's tokens."""
    res = run_scenario(scenario_from_dict(_scenario(cluster={"replicas": replicas, "data_parallel_size": size})))
    assert res.profile["compiled_core"] is True
    steps = res.steps
    tokens = steps["num_prefill_tokens"] + steps["num_decode_tokens"]
    engine = steps["replica"] // size
    per_step = tokens.groupby([engine, steps["start_s"]])
    largest, rows = per_step.max(), per_step.size()
    dp = res.summary["cluster"]["data_parallel"]
    assert dp["engines"] == replicas // size and dp["ranks"] == size
    assert dp["group_steps"] == len(largest)
    assert dp["dummy_rank_steps"] == int((size - rows).sum())
    assert dp["padding_share"] == pytest.approx(1.0 - tokens.sum() / (size * largest.sum()), abs=1e-12)
    # every rank of a group step lasts as long
    durations = steps["duration_s"].groupby([engine, steps["start_s"]])
    assert np.all(durations.max() == durations.min())


@pytest.mark.parametrize("clients", [None, 10])
def test_plain_replicas_behind_dp_balance_run_in_the_core(clients: int | None) -> None:
    """dp_balance reads each replica's running requests and the clock: the core's views carry both."""
    data = _scenario(cluster={"replicas": 3, "data_parallel": False, "router": {"policy": "dp_balance"}},
                     workload={"max_concurrency": clients})
    core, loop = _both(data)
    assert core.profile["compiled_core"] is True and loop.profile["compiled_core"] is False
    assert_same(core, loop)


POOLS = {
    "a data-parallel decode pool, pulled KV": {"prefill": {"replicas": 2},
                                               "decode": {"replicas": 4, "data_parallel": True}},
    "a data-parallel prefill pool, pushed KV": {"prefill": {"replicas": 4, "data_parallel": True},
                                                "decode": {"replicas": 2}, "kv_transfer": {"mode": "push"}},
    "both pools fleets of two engines, layer-wise push": {
        "prefill": {"replicas": 4, "data_parallel": True, "data_parallel_size": 2},
        "decode": {"replicas": 4, "data_parallel": True, "data_parallel_size": 2},
        "kv_transfer": {"mode": "push", "layerwise": True}, "router": {"policy": "dp_balance"}},
}


@pytest.mark.parametrize("name", list(POOLS))
@pytest.mark.parametrize("workload", [{}, {"timeout_s": 1.5}, {"max_concurrency": 8}])
def test_data_parallel_pools_in_the_core_give_the_loops_results(name: str, workload: dict) -> None:
    data = _scenario(workload=workload)
    data["cluster"] = POOLS[name]
    core, loop = _both(data)
    assert core.profile["compiled_core"] is True and loop.profile["compiled_core"] is False
    assert_same(core, loop)
    assert set(core.summary["cluster"]["data_parallel"]) == {role for role in ("prefill", "decode")
                                                              if POOLS[name][role].get("data_parallel")}


@pytest.mark.parametrize("policy", ["lora_affinity", "session"])
def test_a_fleet_pool_behind_a_gateway_reading_adapters_or_sessions_runs_in_the_core(policy: str) -> None:
    """(found by the cluster fuzzer, seed 10501 case 39: the gateway's views of the ranks answered no adapter
    question) with no adapter or session anywhere, the gateway reads loads alone, in the core as in the loop"""
    data = _scenario()
    data["cluster"] = {"prefill": {"replicas": 4, "data_parallel": True, "data_parallel_size": 2},
                       "decode": {"replicas": 2, "data_parallel": True}, "router": {"policy": policy}}
    core, loop = _both(data)
    assert core.profile["compiled_core"] is True
    assert_same(core, loop)


SHARED = {"synthetic": {**BASE["workload"]["synthetic"], "num_requests": 200, "shared_prefix": {"groups": 5, "length": 600},
                         "prompt_len": {"dist": "uniform", "min": 620, "max": 1500}}}


@pytest.mark.parametrize("where", ["colocated", "prefill pool", "decode pool"])
def test_a_fleets_prefix_aware_gateway_reads_the_ranks_caches_in_the_core(where: str) -> None:
    """The gateway's views carry each rank's hits for the request being routed (core.c counts them): the same
    choices as the loop's, and not the least loaded engine's (the hits decide many of them)."""
    fleet = {"replicas": 4, "data_parallel": True, "data_parallel_size": 2}
    router = {"policy": "prefix_affinity", "load_slack": 4}

    def scenario(policy: str) -> dict:
        data = _scenario(kv_cache={"prefix_caching": True}, workload=SHARED)
        if where == "colocated":
            data["cluster"] = {**fleet, "router": {**router, "policy": policy}}
        else:
            data["cluster"] = {"prefill": fleet if where == "prefill pool" else {"replicas": 2},
                               "decode": fleet if where == "decode pool" else {"replicas": 2},
                               "router": {**router, "policy": policy}}
        return data

    core, loop = _both(scenario("prefix_affinity"))
    assert core.profile["compiled_core"] is True
    assert_same(core, loop)
    assert core.summary["prefix_cache_hit_rate"] > 0.3
    if where == "colocated":   # (a pool's choice of engine is the hand-off's or the arrivals', either way)
        by_load = run_scenario(scenario_from_dict(scenario("least_requests")))
        assert (core.requests["replica"] != by_load.requests["replica"]).sum() > 20
