"""The prefix cache's host tier (kv_cache.cpu_offload_gib, sim/kv/host_tier.py): an LRU of block hashes,
written through from the GPU cache, read after the GPU cache's run at a fresh admission; the request waits
aside for its load, then computes the rest.

The scenario, by hand (Llama-2-13B on an A100 80GB: 40 layers x 5,120 x 2 (K, V) x 2 bytes = 819,200 bytes
a token; blocks of 256 tokens = 209,715,200 bytes; 11 GPU blocks; one request at a time):
  A (t=0)  prompt 1,025 = shared prefix 0 (4 full blocks) + 1 token, 1 token out: GPU blocks 0-4, then freed
           tail first (free queue 5..10, 4, 3, 2, 1, 0); the GPU cache and the host tier hold A0..A3
  B (t=1)  prompt 2,560 of its own (10 blocks): takes 5..10, 4, 3, 2, 1 from the queue's head, evicting A3,
           A2, A1 from the GPU cache (A0, in block 0, stays); the host tier stores B0..B9 (14 stored)
  C (t=2)  prompt 1,025 = prefix 0 + 1 token: the GPU cache has A0 (1 block), the host tier A1..A3 (3 blocks)
           -> 1,024 tokens not computed (768 loaded), 1 token computed
The load: 3 blocks x (209,715,200 B / 32 GB/s host link + 10 us a block) = 19.6908 ms from C's admission
(its arrival plus the frontend's input latency, when the idle engine plans); the engine, idle, waits for
it, and C's one-token step starts when it ends.
With a tier of 12 blocks, storing B8 and B9 drops A0 and A1 (the least recent): C's host run from its
block 1 is empty, and it computes 769 tokens, as without a tier. Its lookup makes A2, A3 the most recent;
its computed A1 is stored again, dropping B0 (15 stored, 3 dropped)."""

from __future__ import annotations

import copy
import random

import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.fuzz import draw_scenario, drawn_model
from sim.kv.host_tier import HostTier
from sim.latency_breakdown import phase_means
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

BLOCK_BYTES = 256 * 2 * 40 * 5120 * 2
BLOCK_LOAD_S = BLOCK_BYTES / 32e9 + 1e-5   # the A100's host link, the calibration's swap latency a block
GiB = 1 << 30


def _scenario(host_blocks: float) -> dict:
    return {
        "name": "host-tier", "model": "llama-2-13b", "hardware": "a100-80gb",
        "kv_cache": {"block_size": 256, "num_gpu_blocks": 11, "prefix_caching": True,
                     "cpu_offload_gib": host_blocks * BLOCK_BYTES / GiB},
        "scheduler": {"max_num_batched_tokens": 4096, "chunked_prefill": False},
        "workload": {"requests": [
            {"arrival": 0.0, "prompt_len": 1025, "output_len": 1, "prefix_group": 0, "prefix_len": 1024},
            {"arrival": 1.0, "prompt_len": 2560, "output_len": 1},
            {"arrival": 2.0, "prompt_len": 1025, "output_len": 1, "prefix_group": 0, "prefix_len": 1024}]},
        "output": {"plots": False},
    }


def _run(host_blocks: float):
    return run_scenario(scenario_from_dict(_scenario(host_blocks)), check_integrity=True)


def test_lru_order_capacity_and_runs():
    tier = HostTier(3)
    tier.store([1, 2, 3])
    tier.touch([1])              # order 2, 3, 1
    tier.store([4])              # drops 2
    assert 2 not in tier and len(tier) == 3
    assert tier.run_from([1, 3, 2, 4], 0, 4) == 2   # 1, 3 held; 2 not: the run stops
    assert tier.run_from([1, 3, 2, 4], 3, 4) == 1
    tier.store([3, 5])           # 3 is held (no new copy); 5 drops the least recent, 1
    assert (tier.stored, tier.evicted) == (5, 2) and 1 not in tier and {3, 4, 5} == {h for h in (3, 4, 5) if h in tier}
    with pytest.raises(ValueError):
        HostTier(0)


def test_a_prefix_evicted_from_the_gpu_comes_back_from_host_memory():
    r = _run(16)
    s, reqs, steps = r.summary, r.requests, r.steps
    c = reqs.set_index("req_id").loc[2]
    assert c.num_cached_tokens == 1024                      # 256 from the GPU cache, 768 loaded
    queried = 1025 + 2560 + 1025
    assert s["prefix_cache_hit_rate"] == pytest.approx(256 / queried)
    assert s["host_cache_hit_rate"] == pytest.approx(768 / queried)
    assert (s["host_loaded_tokens"], s["host_stored_blocks"], s["host_evicted_blocks"], s["host_cache_blocks"]) \
        == (768, 14, 0, 16)
    last, before = steps.iloc[-1], steps.iloc[-2]
    assert (last.num_prefill_tokens + last.num_decode_tokens) == 1          # one token computed
    admitted = before.start_s + 1.0                                          # (arrivals 1 s apart, idle engine)
    assert last.start_s == pytest.approx(admitted + 3 * BLOCK_LOAD_S, rel=1e-12)   # after the load
    assert c.first_scheduled_s == last.start_s
    tl = r.timeline[r.timeline.req_id == 2].set_index("phase")   # the load shows in C's timeline
    assert tl.loc["host_load", "start_s"] == pytest.approx(admitted, rel=1e-12)
    assert tl.loc["host_load", "end_s"] - tl.loc["host_load", "start_s"] == pytest.approx(3 * BLOCK_LOAD_S, rel=1e-9)
    assert list(tl.index) == ["frontend", "waiting", "host_load", "waiting", "prefill", "decode", "done"]
    assert phase_means(r.timeline, reqs)["host_load"] == pytest.approx(3 * BLOCK_LOAD_S / 3, rel=1e-9)


def test_a_client_that_gives_up_during_the_load_aborts_it_there(monkeypatch):
    """C's client gives up 10 ms after sending it, while its 3 blocks come from host memory (19.7 ms): the
    engine, idle until the load's end, aborts C as it plans then (its blocks freed; the link was busy until
    then anyway); A and B, one step each, finish first. The same in the SimPy loop and in the core."""
    plain = _run(16)
    data = _scenario(16)
    data["workload"]["timeout_s"] = 0.01
    loop, timed = off_and_on(monkeypatch, engine_core, "enabled",
                             lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, timed)
    admitted = plain.steps.iloc[-2].start_s + 1.0                      # (as above: arrivals 1 s apart)
    reqs = timed.requests.set_index("req_id")
    assert list(reqs["status"]) == ["FINISHED", "FINISHED", "ABORTED"]
    assert reqs.loc[2, "finish_s"] == pytest.approx(admitted + 3 * BLOCK_LOAD_S, rel=1e-12)
    assert reqs.loc[2, "reject_reason"] == "client timeout after 0.01 s (loading, 0 tokens out)"
    assert timed.summary["num_aborted"] == 1 and timed.summary["num_steps"] == 2   # C never computes
    assert timed.profile["compiled_core"] == (native is not None) and not loop.profile["compiled_core"]


def test_a_tier_too_small_to_keep_the_prefix_loads_nothing():
    small, none = _run(12.5), _run(0)
    assert (small.summary["host_stored_blocks"], small.summary["host_evicted_blocks"],
            small.summary["host_loaded_tokens"]) == (15, 3, 0)
    for r in (small, none):
        c = r.requests.set_index("req_id").loc[2]
        assert c.num_cached_tokens == 256
        assert r.steps.iloc[-1].num_prefill_tokens == 769
    assert small.steps.duration_s.tolist() == none.steps.duration_s.tolist()


@pytest.mark.skipif(native is None, reason="sim._native is not built")
@pytest.mark.parametrize("host_blocks", [12.5, 16])
def test_the_core_equals_the_simpy_loop(monkeypatch, host_blocks):
    loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda: _run(host_blocks))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]


def test_bad_settings_are_refused():
    data = _scenario(16)
    data["kv_cache"]["prefix_caching"] = False
    with pytest.raises(KvsimError, match="cpu_offload_gib.*prefix_caching"):
        scenario_from_dict(data)
    with pytest.raises(KvsimError, match="holds no block"):
        _run(0.5)


def test_a_load_waits_aside_while_others_run():
    """D decodes from t=1.5 (its own 16-token prompt takes block 0 from the free queue's head, evicting A0), so
    C finds nothing in the GPU cache and A0..A3 in the host tier: it is admitted to load at the first step
    start after its arrival (scheduling in step, not ahead), takes no part in the steps while its 4 blocks
    come over the link, and computes from the first step start after the load has ended."""
    data = _scenario(16)
    data["scheduler"]["async_scheduling"] = False
    data["workload"]["requests"].append({"arrival": 1.5, "prompt_len": 16, "output_len": 200})
    data["workload"]["requests"].sort(key=lambda r: r["arrival"])
    runs = off_and_on(pytest.MonkeyPatch(), engine_core, "enabled",
                      lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(*runs)
    r = runs[1]
    reqs = r.requests.set_index("req_id")
    c = reqs[reqs.prompt_tokens == 1025].iloc[-1]
    starts = r.steps.start_s.to_numpy()
    admitted = starts[starts >= c.arrival_s + (reqs.loc[0].first_scheduled_s - reqs.loc[0].arrival_s)].min()
    ready = admitted + 4 * BLOCK_LOAD_S
    assert c.num_cached_tokens == 1024 and r.summary["host_loaded_tokens"] == 1024
    assert c.first_scheduled_s == starts[starts >= ready].min()
    during = r.steps[(r.steps.start_s >= admitted) & (r.steps.start_s < c.first_scheduled_s)]
    assert len(during) >= 1 and (during.batch_size == 1).all() and (during.num_prefill_tokens == 0).all()


def test_an_arrival_during_a_load_is_served_at_once():
    """E (16 tokens of its own, 1 out) arrives 2 ms after C, while C's 3 blocks come over the link and
    nothing runs: the idle engine plans at E's arrival (plus the frontend's input latency, as for every
    arrival at an idle engine), not at the load's end; C computes from the first step start after its load."""
    data = _scenario(16)
    data["workload"]["requests"].append({"arrival": 2.002, "prompt_len": 16, "output_len": 1})
    runs = off_and_on(pytest.MonkeyPatch(), engine_core, "enabled",
                      lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(*runs)
    r = runs[1]
    reqs = r.requests.set_index("req_id")
    lag = reqs.loc[0].first_scheduled_s - reqs.loc[0].arrival_s   # the idle engine plans an arrival then
    c, e = reqs.loc[2], reqs.loc[3]
    assert c.num_cached_tokens == 1024 and r.summary["host_loaded_tokens"] == 768
    ready = c.arrival_s + lag + 3 * BLOCK_LOAD_S
    assert e.first_scheduled_s == pytest.approx(e.arrival_s + lag, rel=1e-12) and e.first_scheduled_s < ready
    starts = r.steps.start_s.to_numpy()
    assert c.first_scheduled_s == pytest.approx(starts[starts >= ready - 1e-12].min(), rel=1e-12)


def _host_heavy(i: int) -> dict:
    """A fuzz case with a prefix cache, a host tier of 1 to 64 blocks and requests of a few shared prefixes
    coming back at random (so that prefixes leave the GPU cache and come back from the host tier)."""
    rng = random.Random(f"host-heavy:{i}")
    d = draw_scenario(rng, i)
    kv = d["kv_cache"]
    kv.update(allocator="paged", prefix_caching=True)
    d["scheduler"]["batching"] = "continuous"
    hw = d["hardware"]
    tp = hw.get("tensor_parallel", 1) if isinstance(hw, dict) else 1
    block = drawn_model(d).kv_bytes_per_block(kv.get("block_size", 16), kv.get("dtype")) * tp
    kv["cpu_offload_gib"] = (rng.randint(1, 64) + 0.5) * block / GiB
    bs, cap = kv.get("block_size", 16), kv.get("num_gpu_blocks", 64)
    reqs = []
    for _ in range(rng.randint(5, 60)):
        g = rng.randint(-1, 4)
        prefix = bs * rng.randint(1, max(1, cap // 2)) if g >= 0 else 0
        reqs.append({"arrival": round(rng.uniform(0, 3), 3), "prompt_len": prefix + rng.randint(1, 3 * bs),
                     "output_len": rng.randint(1, 40), "prefix_group": g, "prefix_len": prefix})
    d["workload"] = {"requests": sorted(reqs, key=lambda r: r["arrival"])}
    return d


@pytest.mark.skipif(native is None, reason="sim._native is not built")
def test_fuzzed_host_tier_cases_equal_and_finish(monkeypatch):
    """40 random host-heavy cases, every invariant checked after every step: the core and the SimPy loop agree,
    and every case that is not refused finishes (requests back from their loads that hold the memory while
    nothing runs give it back: no deadlock)."""
    loads = 0
    for i in range(40):
        data = _host_heavy(i)
        loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        assert isinstance(core, str) is False or "deadlock" not in core, f"case {i}: {core}"
        if not isinstance(core, str):
            loads += core.summary.get("host_loaded_tokens", 0) > 0
    assert loads >= 10, f"only {loads} of 40 cases loaded anything from the host tier"
