"""The compiled engine core (sim/engine_core.py, sim/csrc/core.c) against the SimPy engine loop
(sim/engine.py) as the reference, where a prefix cache can be hit: requests that share content
(Mooncake hash ids, synthetic shared-prefix groups, inline requests with a prefix_group) under
kv_cache.prefix_caching. Each case runs twice, the loop then the core, and proves:

- the same results bit for bit (summary.json apart from wall_time_s, the per-step, per-request and
  timeline tables; a cluster's per-replica table too), with the integrity checks on where the loop's are
  affordable (the small caches; not the Mooncake slices' tens of thousands of blocks);
- that the core ran it (``profile["compiled_core"]``), not the SimPy loop in its place;
- that the case exercised what it is there for: prefix-cache hits, cached blocks evicted, preemptions
  (by recompute, after which a request finds its own blocks again; by swap, some falling back to
  recompute where the CPU space is short), under FCFS, priority and round-robin (quanta of 1 and 4
  steps), chunked prefill on and off, async scheduling on and off, one engine or colocated replicas
  behind routers that do not read the prefix caches.

Also: the shared-prefix workloads with the cache off (prefix groups then only feed the
prefix_kv_bytes_* summary keys) run in the core; fuzzed scenarios moved inside what the core covers,
shared prefixes kept, agree with the loop or fail the same way; and two small cases worked out by hand
give the hit rate and cached tokens the loop and the core both report."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_multi_step import STRESS

import sim.engine_core as engine_core
from sim.fuzz import draw_scenario
from sim.kv.manager import KVCacheManager
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")


def _both(monkeypatch, run):
    """(the SimPy loop's outcome, the core's) of ``run``."""
    return off_and_on(monkeypatch, engine_core, "enabled", run)


def _ran_in_core(res) -> None:
    assert res.profile["compiled_core"], "the core declined the run: the SimPy loop ran it"


# ---------------------------------------------------------------- 1. Mooncake conversation slices

MOONCAKE = ROOT / "scenarios" / "mooncake_conversation.yaml"
# H200 with Llama-3.1-8B: about 50,000 blocks of 16 tokens by default; 6,000 (96,000 tokens, a dozen of the
# trace's 8,000-token prompts) preempts and evicts much more. A whole-prompt run gets a 64k-token budget, so
# only the few prompts past it are refused (8,192, the file's, would refuse half the slice).
WHOLE_PROMPT_BUDGET = 65536


def _mooncake(blocks: int | None, chunked: bool, async_scheduling: bool, *more: str, path: Path = MOONCAKE,
              limit: int = 150):
    sets = [f"workload.limit={limit}", "output.plots=false", f"scheduler.chunked_prefill={str(chunked).lower()}",
            f"scheduler.async_scheduling={str(async_scheduling).lower()}", "kv_cache.prefix_caching=true", *more]
    if blocks is not None:
        sets.append(f"kv_cache.num_gpu_blocks={blocks}")
    if not chunked:
        sets.append(f"scheduler.max_num_batched_tokens={WHOLE_PROMPT_BUDGET}")
    # tens of thousands of blocks: the loop's integrity check after every step would take minutes
    return lambda: run_scenario(load_scenario(path, sets), check_integrity=False)


@pytest.mark.parametrize("blocks", [None, 6000], ids=["hbm-blocks", "6000-blocks"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_mooncake_conversations_equal(monkeypatch, blocks, async_scheduling, chunked):
    """The first 150 requests of the Mooncake conversation trace (FCFS, recompute): later turns hit the
    blocks of earlier ones' shared chunks, the cache evicts, requests are preempted and recomputed."""
    loop, core = _both(monkeypatch, _mooncake(blocks, chunked, async_scheduling))
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0 and s["prefix_cache_evictions"] > 0 and s["num_preemptions"] > 0
    assert (core.requests["num_cached_tokens"] > 0).sum() >= 5
    _ran_in_core(core)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_mooncake_conversations_preempted_by_swap_equal(monkeypatch, async_scheduling, chunked):
    """Preemption by swap on 6,000 blocks with 0.5 GiB of CPU space (256 blocks of 2 MiB, 4,096 tokens, less
    than most of the trace's prompts): short requests are swapped, the others fall back to recompute."""
    loop, core = _both(monkeypatch, _mooncake(6000, chunked, async_scheduling, "scheduler.preemption=swap",
                                              "kv_cache.swap_space_gb=0.5"))
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0 and s["prefix_cache_evictions"] > 0 and s["swapped_blocks"] > 0
    phases = core.timeline["phase"].value_counts()
    assert phases.get("swapped", 0) > 0 and phases.get("preempted", 0) > 0   # swapped, and fallen back
    assert phases["swapped"] + phases["preempted"] == s["num_preemptions"]
    assert core.steps["blocks_swapped_in"].sum() == core.steps["blocks_swapped_out"].sum() == s["swapped_blocks"]
    _ran_in_core(core)


# ---------------------------------------------------------------- 2. synthetic shared prefixes

def _shared(length: int, caching: bool = True, **scheduler) -> dict:
    """80 requests of 3 shared-prefix groups (a prefix of ``length`` tokens, prompts of 40-200 tokens, so
    a prompt is at least the prefix and one token), priorities 0-3, arriving at 100 per second on 40 blocks
    of 16 tokens (640 slots) under 12 seats: requests are preempted again and again."""
    return {"name": "shared_prefix", "model": "tiny-llama", "hardware": "a100-80gb", "seed": 11,
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 40, "prefix_caching": caching, "swap_space_gb": 0.001},
            "executor": {"calibration": "roofline", "step_overhead_s": 0.001},
            "scheduler": {"max_num_seqs": 12, "max_num_batched_tokens": 256, **scheduler},
            "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 100.0},
                                       "prompt_len": {"dist": "uniform", "min": 40, "max": 200},
                                       "output_len": {"dist": "uniform", "min": 1, "max": 120},
                                       "shared_prefix": {"groups": 3, "length": length},
                                       "priority": {"dist": "uniform", "min": 0, "max": 3}}},
            "output": {"plots": False}}


def _counting_rehits(monkeypatch, data: dict):
    """(a run of ``data``, the list of its runs' counts of re-admissions that found their own blocks): in
    the SimPy loop's run (the core off), each admission of a request after its first one (preempted by
    recompute) that starts from cached blocks past its group's prefix, which only its own tokens fill, is
    counted; the core's run is left alone."""
    counts: list[int] = []
    real = KVCacheManager._allocate_cached

    def counting(self, req, num_new_tokens, cached, loaded=0):
        again = req.req_id in self._looked_up and len(cached) * self.block_size > req.prefix_len
        ok = real(self, req, num_new_tokens, cached, loaded)
        counts[-1] += bool(ok and again)
        return ok

    def run():
        counts.append(0)
        scn = scenario_from_dict(copy.deepcopy(data))
        if engine_core.enabled:
            return run_scenario(scn, check_integrity=True)
        with monkeypatch.context() as m:
            m.setattr(KVCacheManager, "_allocate_cached", counting)
            return run_scenario(scn, check_integrity=True)

    return run, counts


POLICIES = [("fcfs", 16), ("priority", 16), ("round_robin", 1), ("round_robin", 4), ("longest_prefix_first", 16)]


@pytest.mark.parametrize("length", [48, 40], ids=["prefix-48", "prefix-40"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
@pytest.mark.parametrize("policy, quantum", POLICIES, ids=["fcfs", "priority", "rr-1", "rr-4", "lpf"])
def test_shared_prefixes_preempted_by_recompute_equal(monkeypatch, policy, quantum, chunked, length):
    """Prefixes of 3 whole blocks (48 tokens) and of 2.5 (40: the third block mixes the prefix and a
    request's own tokens, so only 2 are shared); preempted requests come back and hit their blocks again."""
    data = _shared(length, policy=policy, rr_quantum_steps=quantum, chunked_prefill=chunked)
    run, rehits = _counting_rehits(monkeypatch, data)
    loop, core = _both(monkeypatch, run)
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0.15 and s["prefix_cache_evictions"] > 0 and s["num_preemptions"] >= 20
    assert rehits[0] >= 10, "preempted requests did not find their own blocks again"
    _ran_in_core(core)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
@pytest.mark.parametrize("policy, quantum", [("fcfs", 16), ("priority", 16), ("round_robin", 4)],
                         ids=["fcfs", "priority", "rr-4"])
def test_shared_prefixes_preempted_by_swap_equal(monkeypatch, policy, quantum, chunked):
    """Preemption by swap into 0.0001 GiB (6 of tiny-llama's 16-token blocks of 16 KiB, 96 tokens): some
    requests are swapped out and back, the others fall back to recompute (and to the cache)."""
    data = _shared(40, policy=policy, rr_quantum_steps=quantum, chunked_prefill=chunked, preemption="swap")
    data["kv_cache"]["swap_space_gb"] = 0.0001
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0.15 and s["prefix_cache_evictions"] > 0 and s["swapped_blocks"] > 0
    phases = core.timeline["phase"].value_counts()
    assert phases.get("swapped", 0) > 0 and phases.get("preempted", 0) > 0
    _ran_in_core(core)


@pytest.mark.parametrize("victim", ["latest_arrival", "most_generated"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_the_tight_pool_equals(monkeypatch, victim, async_scheduling):
    """tests/test_multi_step.py's tight pool: 2 groups sharing 8 tokens (2 blocks of 4), 60 blocks, 8 seats."""
    data = copy.deepcopy(STRESS["tight_pool"])
    data["scheduler"].update(victim=victim, async_scheduling=async_scheduling)
    data["output"] = {"plots": False}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0 and s["prefix_cache_evictions"] > 0 and s["num_preemptions"] > 0
    _ran_in_core(core)


# ---------------------------------------------------------------- 3. the same workloads, the cache off

@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
@pytest.mark.parametrize("policy, quantum", [("fcfs", 16), ("priority", 16), ("round_robin", 4)],
                         ids=["fcfs", "priority", "rr-4"])
def test_shared_prefixes_without_a_cache_equal(monkeypatch, policy, quantum, chunked, preemption):
    """Without prefix caching a group's prefix is stored once per request: the groups only feed the
    prefix_kv_bytes_* keys (each request's full prefix blocks, counted physically and once per request,
    equal here since nothing is shared)."""
    data = _shared(40, caching=False, policy=policy, rr_quantum_steps=quantum, chunked_prefill=chunked,
                   preemption=preemption)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert s["prefix_cache_hit_rate"] == 0 and s["prefix_cache_evictions"] == 0 and s["num_preemptions"] > 0
    assert s["prefix_kv_bytes_peak"] == s["prefix_kv_bytes_unshared_peak"] > 0
    assert (core.requests["num_cached_tokens"] == 0).all()
    _ran_in_core(core)


# ---------------------------------------------------------------- 4. colocated clusters

@pytest.mark.parametrize("router", ["round_robin", "least_requests", "least_kv", "prefix_affinity"])
@pytest.mark.parametrize("workload", ["mooncake", "shared-prefix"])
def test_clusters_with_prefix_caches_equal(monkeypatch, router, workload):
    """Replicas with prefix caches behind routers that read their loads and KV usage, or (prefix_affinity,
    whose rule the core applies) their prefix caches: 4 H200 replicas of 3,000 blocks over 200 Mooncake
    requests (scenarios/cluster_prefix_affinity.yaml, its router as given), or 3 replicas of 40 blocks over
    the shared-prefix workload arriving at 300 per second."""
    if workload == "mooncake":
        run = _mooncake(3000, True, True, f"cluster.router.policy={router}",
                        path=ROOT / "scenarios" / "cluster_prefix_affinity.yaml", limit=200)
    else:
        data = _shared(40)
        data["workload"]["synthetic"]["arrival"]["rate"] = 300.0
        data["cluster"] = {"replicas": 3, "router": {"policy": router}}

        def run():
            return run_scenario(scenario_from_dict(data), check_integrity=True)

    loop, core = _both(monkeypatch, run)
    assert_same(loop, core)
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)
    s = core.summary
    assert s["prefix_cache_hit_rate"] > 0 and s["prefix_cache_evictions"] > 0 and s["num_preemptions"] > 0
    assert (core.replicas["requests"] > 0).all() and (core.replicas["prefix_hit_rate"] > 0).all()
    _ran_in_core(core)


# ---------------------------------------------------------------- 5. fuzzed cases

def _into_core(data: dict, index: int) -> dict:
    """A fuzz case moved inside what the extended core covers: FCFS, priority, round-robin or
    longest-prefix-first (the rest become FCFS), continuous batching, the paged manager with prefix
    caching, one sequence a request (n and beam_width dropped); shared prefixes, prefix groups and Mooncake
    hash ids are kept. The fuzzer gives few cases shared content (about 1 in 20 hits the cache), so where
    the draw has none a second seeded draw gives most of them some: a synthetic workload a shared prefix,
    inline requests prefix groups."""
    d = copy.deepcopy(data)
    if d["scheduler"].get("policy") not in ("fcfs", "priority", "round_robin", "longest_prefix_first"):
        d["scheduler"]["policy"] = "fcfs"
    d["scheduler"]["batching"] = "continuous"
    d["kv_cache"].update(allocator="paged", prefix_caching=True)
    # (pipeline stages as drawn: the core runs them too)
    # (LoRA serving as drawn: the core runs it too, its adapters keying the cache's hashes)
    d["workload"].pop("timeout_s", None)   # (client timeouts: tests/test_timeouts.py)
    work = d["workload"]   # (a client limit, as drawn: the core runs it too)
    for r in work.get("requests", []):
        for key in ("n", "beam_width"):
            r.pop(key, None)
    for key in ("n", "beam_width"):
        work.get("synthetic", {}).pop(key, None)
    share = random.Random(f"engine-core-prefix-share:{index}")
    syn = work.get("synthetic")
    if syn is not None and "shared_prefix" not in syn and share.random() < 0.7:
        longest = syn["prompt_len"].get("max") or syn["prompt_len"].get("value") or 64
        syn["shared_prefix"] = {"groups": share.randint(1, 3), "length": share.randint(1, max(1, int(longest)))}
    for r in work.get("requests", []):
        if r.get("prefix_group", -1) < 0 and r["prompt_len"] > 1 and share.random() < 0.7:
            r["prefix_group"] = share.randint(0, 1)
            r["prefix_len"] = share.randint(1, r["prompt_len"] - 1)
    return d


FUZZ_PART = 20


@pytest.mark.parametrize("part", range(4))   # 4 x 20 cases: parallel test workers share them
def test_fuzz_cases_with_shared_prefixes_equal(monkeypatch, part):
    covered = hit = 0
    for i in range(FUZZ_PART * part, FUZZ_PART * part + FUZZ_PART):
        data = _into_core(draw_scenario(random.Random(f"engine-core-prefix:{i}"), i), i)
        loop, core = _both(monkeypatch, lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        if not isinstance(core, str):
            covered += bool(core.profile.get("compiled_core"))
            hit += core.summary["prefix_cache_hit_rate"] > 0
    assert hit >= 3, f"only {hit} of {FUZZ_PART} fuzz cases hit the prefix cache"
    assert covered >= FUZZ_PART - 2, f"only {covered} of {FUZZ_PART} fuzz runs ran in the core"


# ---------------------------------------------------------------- 6. worked by hand

def test_hits_of_one_prefix_group_by_hand(monkeypatch):
    """Five requests, each arriving after the one before finished (steps take milliseconds, arrivals are 5 s
    apart), blocks of 16 tokens, 4 output tokens each (a finished request held 103 or 93 tokens of KV; its
    full blocks stay cached when freed), 64 blocks: no eviction (the 24 fresh blocks all come from the never
    used head of the free queue). A token's id depends on its prefix group and position inside the group's
    prefix (sim/workload/tokens.py), not on prefix_len; a block mixing prefix and own tokens is its own.

        request  group  prefix_len  prompt  cached at its first admission
        A        0      64          100     nothing: 0
        B        0      64          100     A's blocks 0-3 (tokens 0-63); block 4 is B's own: 4 x 16 = 64
        C        0      40          100     blocks 0-1; block 2 (tokens 32-47) mixes 8 prefix and 8 own: 32
        D        1      64          90      group 1 was never computed: 0
        E        0      70          100     blocks 0-3; block 4 (64-79) mixes 6 prefix and 10 own: 64

    (a first lookup may reuse at most (prompt - 1) // 16 blocks, 6 or 5 here: never binding, since a prompt
    is longer than its prefix). The hit rate counts prompt tokens over first admissions:
    (0 + 64 + 32 + 0 + 64) / (100 + 100 + 100 + 90 + 100) = 160 / 490; each prefill computes the rest."""
    reqs = [{"arrival": 0.0, "prompt_len": 100, "output_len": 4, "prefix_group": 0, "prefix_len": 64},
            {"arrival": 5.0, "prompt_len": 100, "output_len": 4, "prefix_group": 0, "prefix_len": 64},
            {"arrival": 10.0, "prompt_len": 100, "output_len": 4, "prefix_group": 0, "prefix_len": 40},
            {"arrival": 15.0, "prompt_len": 90, "output_len": 4, "prefix_group": 1, "prefix_len": 64},
            {"arrival": 20.0, "prompt_len": 100, "output_len": 4, "prefix_group": 0, "prefix_len": 70}]
    data = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 64, "prefix_caching": True},
            "workload": {"requests": reqs}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    for res in (loop, core):
        s = res.summary
        assert s["num_finished"] == 5 and s["num_preemptions"] == 0 and s["prefix_cache_evictions"] == 0
        assert s["prefix_cache_hit_rate"] == 160 / 490
        assert res.requests["num_cached_tokens"].tolist() == [0, 64, 32, 0, 64]
        prefills = res.steps["num_prefill_tokens"]
        assert prefills[prefills > 0].tolist() == [100, 36, 68, 90, 36]
    assert_same(loop, core)
    _ran_in_core(core)


def test_a_whole_cached_prompt_leaves_a_block_to_compute_by_hand(monkeypatch, tmp_path):
    """Mooncake requests share 512-token chunks by hash id. A: 64 tokens of chunk 7 (3 output tokens: 66
    tokens of KV, full blocks 0-3 cached when freed); B, later, the same 64 tokens: all 4 of its blocks are
    cached, but a first lookup reuses at most (64 - 1) // 16 = 3 (one token at least is computed, here the
    whole block 3): 48 hit tokens, 16 computed; C, later, chunks 7 and 8 (600 tokens): blocks 0-3 are A's
    (block 3 computed again by B stays private: A's holds the hash), block 4 was never full: 64 hit tokens.
    Hit rate (0 + 48 + 64) / (64 + 64 + 600) = 112 / 728."""
    trace = tmp_path / "shared_chunks.jsonl"
    rows = [{"timestamp": 0, "input_length": 64, "output_length": 3, "hash_ids": [7]},
            {"timestamp": 5000, "input_length": 64, "output_length": 3, "hash_ids": [7]},
            {"timestamp": 10000, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 64, "prefix_caching": True},
            "workload": {"trace": str(trace), "format": "mooncake"}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    for res in (loop, core):
        s = res.summary
        assert s["num_finished"] == 3 and s["num_preemptions"] == 0 and s["prefix_cache_evictions"] == 0
        assert s["prefix_cache_hit_rate"] == 112 / 728
        assert res.requests["num_cached_tokens"].tolist() == [0, 48, 64]
        prefills = res.steps["num_prefill_tokens"]
        assert prefills[prefills > 0].tolist() == [64, 16, 536]
    assert_same(loop, core)
    _ran_in_core(core)


def test_longest_prefix_first_overtakes_in_the_core(monkeypatch):
    """Longest-prefix-first over the prefix cache (sim/sched/queues.py LongestPrefixQueue, in core.c's
    waiting queue): requests whose group's prefix is cached are admitted ahead of earlier arrivals, at most
    32 times past one front request; the same admissions and results as the loop."""
    data = _shared(48, policy="longest_prefix_first", chunked_prefill=True)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    reqs = core.requests.sort_values("arrival_s")
    first = reqs["first_scheduled_s"].to_numpy()
    assert (first[1:] < first[:-1]).any(), "no request was admitted ahead of an earlier arrival"
    _ran_in_core(core)
