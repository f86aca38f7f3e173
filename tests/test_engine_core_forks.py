"""Parallel samples (n > 1) in the compiled core (sim/csrc/core.c: fork_group, allocate_group, release_group)
against the SimPy loop (sim/kv/sharing.py) as the reference: the same results bit for bit under memory
pressure, preemption by recompute (the group comes back as one sequence and forks again, its siblings
recomputing their own blocks) and by swap (a forked request is recomputed instead), with and without a
prefix cache (blocks by identity: shared prompts hit while groups hold them, evictions), every policy the
core covers, both pricing modes (copies priced), colocated clusters and fuzzed cases; and one request's
steps against the block arithmetic worked by hand."""

from __future__ import annotations

import copy
import random

import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_engine_core import PRESSURE, _assert_same_clusters, _scenario

import sim.engine_core as engine_core
import sim.kv.sharing as sharing
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")


def _both(monkeypatch, data: dict, check: bool = True):
    return off_and_on(monkeypatch, engine_core, "enabled",
                      lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=check))


def _sampling(data: dict, widths=(2, 3, 4), cache: bool = False, **scheduler) -> dict:
    """``data`` with each inline request asking for a width from ``widths`` in turn; ``cache``: a prefix
    cache, and the requests in two shared-prefix groups (prompts of up to 12 tokens in common)."""
    d = _scenario(data, **scheduler)
    for i, r in enumerate(d["workload"]["requests"]):
        r["n"] = widths[i % len(widths)]
        if cache and r["prompt_len"] < 1000:
            r.update(prefix_group=i % 2, prefix_len=min(12, r["prompt_len"] - 1))
    d["kv_cache"]["prefix_caching"] = cache
    return d


def _count_reforks(monkeypatch) -> dict:
    """Counts the SimPy loop's forks after a preemption (more than one token generated), and those whose
    siblings recompute their own blocks."""
    seen = {"refork": 0, "siblings_recompute": 0}
    fork = sharing.SharingMixin._fork

    def counting(self, req, k):
        seen["refork"] += req.num_generated > 1
        fork(self, req, k)
        seen["siblings_recompute"] += req.req_id in self.sibling_recompute
    monkeypatch.setattr(sharing.SharingMixin, "_fork", counting)
    return seen


def test_one_request_by_hand(monkeypatch):
    """Prompt of 6 tokens, blocks of 4, n = 3, 3 tokens out. Step 1 computes the prompt (2 blocks, the second
    holding 2 tokens) and forks: 3 tables share both. Step 2 writes token 7 into the shared partial block:
    two sequences copy it (2 copies, 2 new blocks: 4 in use), each sequence computes one token. Step 3 writes
    into each sequence's own block: nothing moves. Token slots after step 2: block 0 holds 4, and each
    sequence's second block 3 (2 copied + 1 new): 13."""
    data = {"name": "hand", "model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 4, "num_gpu_blocks": 20, "swap_space_gb": 0},
            "executor": {"calibration": "roofline"}, "output": {"plots": False},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 6, "output_len": 3, "n": 3}]}}
    loop, core = _both(monkeypatch, data)
    assert_same(loop, core)
    assert core.profile["compiled_core"]
    st = core.steps
    assert st["batch_size"].tolist() == [1, 3, 3]
    assert st["num_prefill_tokens"].tolist() == [6, 0, 0]
    assert st["num_decode_tokens"].tolist() == [0, 3, 3]
    assert st["blocks_copied"].tolist() == [0, 2, 0]
    # recorded after each step's update: step 3 finished the request and freed its blocks
    assert st["kv_blocks_used"].tolist() == [2, 4, 0]
    assert st["slots_token_states"].tolist() == [6, 13, 0]
    assert st["slots_free"].tolist() == [18 * 4, 16 * 4, 20 * 4]
    # used / unshared blocks summed over the steps (before the finish frees them): (2 + 4 + 4) / (6 + 6 + 6)
    assert core.summary["kv_sharing_saving"] == pytest.approx(1 - 10 / 18)
    # a copy reads and writes a block of tiny-llama's KV (4 tokens x 2 layers x K and V x 2 heads x 64 x 2 bytes) at
    # the A100's 2,039 GB/s
    assert st["time_copy_s"].tolist() == pytest.approx([0.0, 2 * 2 * 4096 / 2.039e12, 0.0])


@pytest.mark.parametrize("cache", [False, True], ids=["counts", "prefix-cache"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("victim", ["latest_arrival", "most_generated"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_pressure_with_samples_equal(monkeypatch, preemption, victim, chunked, cache):
    seen = _count_reforks(monkeypatch)
    data = _sampling(PRESSURE, cache=cache, preemption=preemption, victim=victim, chunked_prefill=chunked)
    loop, core = _both(monkeypatch, data)
    assert_same(loop, core)
    s = core.summary
    assert core.profile["compiled_core"] and s["num_preemptions"] >= 5 and s["num_rejected"] >= 1
    assert core.steps["blocks_copied"].sum() > 0
    assert seen["refork"] > 0 and seen["siblings_recompute"] > 0   # (counted in the loop's run)
    if cache:
        assert s["prefix_cache_hit_rate"] > 0 and s["prefix_cache_evictions"] > 0


@pytest.mark.parametrize("policy", ["round_robin", "priority", "longest_prefix_first"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_policies_with_samples_equal(monkeypatch, policy, async_scheduling):
    data = _sampling(PRESSURE, widths=(1, 2, 5), cache=policy == "longest_prefix_first", policy=policy,
                     async_scheduling=async_scheduling, rr_quantum_steps=3)
    for i, r in enumerate(data["workload"]["requests"]):
        r["priority"] = (5 * i) % 4
    loop, core = _both(monkeypatch, data)
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] >= 5


def test_engine_pricing_with_copies_equal(monkeypatch):
    """The H100's engine-level step model (the default calibration): copies priced after the GPU work."""
    data = {"name": "engine", "model": "llama-2-7b", "hardware": "h100-80gb", "seed": 4,
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 400},
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 512, "max_num_seqs": 64},
            "output": {"plots": False},
            "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 40.0},
                                       "prompt_len": {"dist": "uniform", "min": 20, "max": 600},
                                       "output_len": {"dist": "uniform", "min": 2, "max": 300}, "n": 4}}}
    loop, core = _both(monkeypatch, data, check=False)
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] > 0
    assert core.steps["blocks_copied"].sum() > 0


def test_rejections_of_wide_requests_equal(monkeypatch):
    """A request whose n sequences need more tokens a step than the budget, or more blocks than the cache
    (its own blocks once, the n - 1 others past the prompt's full blocks), is refused with its reason."""
    data = {"name": "wide", "model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 4, "num_gpu_blocks": 30, "swap_space_gb": 0},
            "executor": {"calibration": "roofline"}, "output": {"plots": False},
            "scheduler": {"max_num_batched_tokens": 8, "max_num_seqs": 16, "chunked_prefill": True},
            "workload": {"requests": [
                {"arrival": 0.0, "prompt_len": 6, "output_len": 3, "n": 9},     # 9 tokens a decode > 8
                {"arrival": 0.0, "prompt_len": 40, "output_len": 30, "n": 4},   # 18 + 3 x 8 = 42 blocks > 30
                {"arrival": 0.0, "prompt_len": 40, "output_len": 30, "n": 2},   # 18 + 8 = 26 blocks: fits
                {"arrival": 0.1, "prompt_len": 6, "output_len": 5, "n": 8}]}}
    loop, core = _both(monkeypatch, data)
    assert_same(loop, core)
    assert core.profile["compiled_core"]
    reasons = core.requests.set_index("req_id")["reject_reason"]
    assert "above max_num_batched_tokens 8" in reasons[0] and "needs 42 KV blocks" in reasons[1]
    assert core.summary["num_finished"] == 2


def test_colocated_cluster_with_samples_equal(monkeypatch):
    data = _sampling(PRESSURE, widths=(3, 1, 2))
    data["cluster"] = {"replicas": 3, "router": {"policy": "least_kv"}}
    loop, core = _both(monkeypatch, data)
    _assert_same_clusters(loop, core)


def test_beams_stay_in_the_loop(monkeypatch):
    beams = _scenario(PRESSURE)
    beams["workload"]["requests"][0]["beam_width"] = 2
    loop, core = _both(monkeypatch, beams)
    assert_same(loop, core)
    assert not core.profile.get("compiled_core")


def _draw(i: int, rng: random.Random) -> dict:
    """A random engine with parallel samples under pressure: block sizes, a small pool, swap or not, a prefix
    cache or not (shared prefixes or not), every policy, chunked or whole prompts, sometimes a cluster."""
    bs = rng.choice([1, 2, 4, 16])
    d = {"name": f"forks-{i}", "seed": i, "model": "llama-2-7b", "hardware": rng.choice(["a100-80gb", "h100-80gb"]),
         "kv_cache": {"block_size": bs, "num_gpu_blocks": rng.randint(20, 200) * (16 // bs),
                      "swap_space_gb": rng.choice([0, 0.5, 4]), "prefix_caching": rng.random() < 0.6},
         "scheduler": {"max_num_seqs": rng.choice([4, 8, 32, 256]), "chunked_prefill": rng.random() < 0.5,
                       "max_num_batched_tokens": rng.choice([16, 64, 512, 2048]),
                       "policy": rng.choice(["fcfs", "priority", "round_robin", "longest_prefix_first"]),
                       "preemption": rng.choice(["recompute", "swap"]),
                       "victim": rng.choice(["latest_arrival", "most_generated"]),
                       "async_scheduling": rng.random() < 0.5},
         "workload": {"synthetic": {
             "num_requests": rng.randint(5, 40), "arrival": {"process": "poisson", "rate": rng.choice([2.0, 50.0, 1000.0])},
             "prompt_len": {"dist": "uniform", "min": 1, "max": rng.choice([40, 300, 900])},
             "output_len": {"dist": "uniform", "min": 1, "max": rng.choice([20, 200])}, "n": rng.randint(2, 5),
             "priority": {"dist": "uniform", "min": 0, "max": 3}}},
         "output": {"plots": False}}
    if not d["scheduler"]["chunked_prefill"]:
        d["scheduler"]["max_num_batched_tokens"] = max(d["scheduler"]["max_num_batched_tokens"], 1024)
    if rng.random() < 0.5:
        d["workload"]["synthetic"]["shared_prefix"] = {"groups": rng.randint(1, 3), "length": rng.choice([4, 16, 40])}
    if rng.random() < 0.3:
        d["cluster"] = {"replicas": rng.randint(2, 3),
                        "router": {"policy": rng.choice(["round_robin", "least_requests", "least_kv"])}}
    return d


@pytest.mark.parametrize("part", range(2))
def test_fuzzed_samples_equal(monkeypatch, part):
    covered = preempted = hit = 0
    for i in range(20 * part, 20 * part + 20):
        data = _draw(i, random.Random(f"forks:{i}"))
        loop, core = _both(monkeypatch, data)
        assert_same_outcome(loop, core, f"case {i}")
        assert not isinstance(core, str), core
        covered += bool(core.profile.get("compiled_core"))
        preempted += core.summary["num_preemptions"] > 0
        hit += core.summary.get("prefix_cache_hit_rate", 0) > 0
    assert covered == 20 and preempted >= 3 and hit >= 3
