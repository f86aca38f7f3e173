"""The compiled engine core (sim/engine_core.py, sim/csrc/core.c) against the SimPy engine loop
(sim/engine.py) as the reference: the same results bit for bit (summary.json apart from wall_time_s, the
per-step, per-request and timeline tables) on every shipped scenario, on stress cases that preempt,
reject, truncate and chunk, and on the fuzzer's cases, with the integrity checks on where the loop's
are affordable; and what the core does not cover runs the loop."""

from __future__ import annotations

import copy
import glob
import random
from pathlib import Path

import numpy as np
import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on, same_cluster_outcome
from test_multi_step import NOT_COMPARABLE, STRESS

import sim.engine_core as engine_core
from sim.fuzz import draw_scenario
from sim.metrics import Columns
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")


def _both(monkeypatch, run):
    """(the SimPy loop's outcome, the core's) of ``run``."""
    return off_and_on(monkeypatch, engine_core, "enabled", run)


def _assert_same_clusters(loop, core) -> None:
    """A cluster's run in the SimPy loop and in the core: the same results and replicas table, each where
    it should have run, every replica used."""
    import pandas as pd

    assert_same(loop, core)
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert (core.replicas["requests"] > 0).all()


def _scenario(data: dict, **scheduler) -> dict:
    d = copy.deepcopy(data)
    d.setdefault("scheduler", {}).update(scheduler)
    d["output"] = {"plots": False}
    return d


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml"))), ids=lambda p: Path(p).name)
def test_shipped_scenarios_equal(path, monkeypatch):
    if Path(path).name in NOT_COMPARABLE:
        pytest.skip(NOT_COMPARABLE[Path(path).name])
    loop, core = _both(monkeypatch, lambda: run_scenario(load_scenario(path, ["workload.limit=250"]),
                                                         check_integrity=False))   # big caches: the check is slow
    assert_same(loop, core)
    assert not loop.profile.get("compiled_core")


def test_the_azure_hour_settings_run_in_the_core_and_equal(monkeypatch):
    """engine_bench.py's workload (Llama-3.1-8B on an H100, chunked prefill, async scheduling, the
    frontend's latencies) over the trace's first 2,000 requests."""
    data = {"name": "azure", "model": "llama-3.1-8b", "hardware": "h100-80gb", "kv_cache": {"block_size": 16},
            "scheduler": {"chunked_prefill": True, "max_num_seqs": 256, "max_num_batched_tokens": 2048},
            "workload": {"trace": str(ROOT / "scenarios" / "traces" / "azure_llm_2023_conv.csv"), "format": "azure",
                         "limit": 2000}, "output": {"plots": False}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=False))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_finished"] == 2000


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_long_decodes_equal(monkeypatch, async_scheduling, chunked):
    data = _scenario(STRESS["long_decodes"], async_scheduling=async_scheduling, chunked_prefill=chunked)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"]



def test_a_mixture_of_experts_eager_steps_count_its_router_kernels(monkeypatch, tmp_path):
    """A step beyond the captured graphs runs eagerly, and a mixture of experts' layer dispatches its router
    and the fused MoE kernel's small kernels besides a dense layer's ops: with the CPU not hidden under the
    GPU and a millisecond an op, the CPU sets such a step's time, and the core must count those ops as the
    loop does (it once counted a dense layer's)."""
    import json

    doc = json.loads((ROOT / "sim" / "data" / "calibration" / "h100-80gb.json").read_text())
    doc["engine"].update(overlap_cpu=False, eager_op_s=1e-3)
    (tmp_path / "slow_cpu.json").write_text(json.dumps(doc))
    data = {"name": "moe-eager", "model": "mixtral-8x7b", "hardware": {"name": "h100-80gb", "tensor_parallel": 2},
            "executor": {"calibration": str(tmp_path / "slow_cpu.json")},
            "scheduler": {"chunked_prefill": False, "max_num_batched_tokens": 16384},
            "workload": {"requests": [{"arrival": 0.1 * i, "prompt_len": 600 + 97 * i, "output_len": 20}
                                      for i in range(12)]}, "output": {"plots": False}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    # 32 layers x (14 + 1 router + 3 small kernels) ops at 1 ms: a prompt step's CPU side is 0.576 s or more
    assert core.profile["compiled_core"] and core.steps["duration_s"].max() >= 32 * 18 * 1e-3

# a cache of 48 blocks of 4 tokens under 12 seats: requests are preempted (recompute) again and again, some
# are refused (a prompt longer than the model's context, one that cannot fit the cache) or cut (output past
# the context), arrivals coincide with step ends (whole-second arrivals, whole-millisecond steps)
PRESSURE = {"name": "pressure", "model": "tiny-llama", "hardware": "a100-80gb", "seed": 3,
            "kv_cache": {"block_size": 4, "num_gpu_blocks": 48, "swap_space_gb": 0.0001},
            "executor": {"calibration": "roofline", "step_overhead_s": 0.001},
            "scheduler": {"max_num_seqs": 12, "max_num_batched_tokens": 64},
            "workload": {"requests": [
                {"arrival": float(i // 3), "prompt_len": 5 + (7 * i) % 60, "output_len": 3 + (11 * i) % 70}
                for i in range(60)] + [
                {"arrival": 2.0, "prompt_len": 5000, "output_len": 4},     # past max_model_len: refused
                {"arrival": 2.0, "prompt_len": 150, "output_len": 200},    # never fits 48 x 4 slots: refused
                {"arrival": 3.0, "prompt_len": 4090, "output_len": 30}]}}  # cut at the context (4,096), then refused


@pytest.mark.parametrize("victim", ["latest_arrival", "most_generated"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_preemption_rejection_and_ties_equal(monkeypatch, victim, async_scheduling, chunked):
    data = _scenario(PRESSURE, victim=victim, async_scheduling=async_scheduling, chunked_prefill=chunked)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert core.profile["compiled_core"] and s["num_preemptions"] >= 5 and s["num_rejected"] >= 1
    assert (core.requests.status == "REJECTED").sum() == s["num_rejected"] == 3 and s["num_truncated"] == 1


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_static_batching_equals(monkeypatch, policy, async_scheduling):
    """Static batching on the pressure case: batches formed in queue order while their prompt + output
    reservations fit, finished members idle with their blocks until the batch's last one finishes, the same
    refusals and cut; the queue in priority order under the priority policy."""
    data = _scenario(PRESSURE, batching="static", chunked_prefill=False, policy=policy,
                     async_scheduling=async_scheduling)
    for i, r in enumerate(data["workload"]["requests"]):
        r["priority"] = (5 * i) % 4
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert s["num_rejected"] == 3 and s["num_truncated"] == 1 and s["num_finished"] == 60
    assert (core.timeline.phase == "idle").sum() >= 20   # members that waited for their batch's last one


def _static(data: dict) -> dict:
    """A fuzz case under static batching (whole prompts, FCFS or priority, no prefix cache), in the core."""
    d = _into_core(data, samples=False)   # (static batching forks no tables)
    d["scheduler"].update(batching="static", chunked_prefill=False)
    if d["scheduler"].get("policy") not in ("fcfs", "priority"):
        d["scheduler"]["policy"] = "fcfs"
    d["kv_cache"]["prefix_caching"] = False
    d["kv_cache"].pop("cpu_offload_gib", None)
    d.pop("lora", None)   # (LoRA with static batching is refused)
    return d


def test_fuzzed_static_batching_equals(monkeypatch):
    """40 fuzz cases under static batching, alone and on 2 to 6 replicas behind every router: the core and the
    SimPy loop agree."""
    def draw(i: int, rng: random.Random) -> dict:
        data = _static(draw_scenario(rng, i))
        if i % 2:
            data["cluster"] = {"replicas": rng.randint(2, 6), "router": {"policy": ROUTERS[i % len(ROUTERS)]}}
        return data

    covered = _fuzz_equal(monkeypatch, "static-core", draw)
    assert covered >= 36, f"only {covered} of 40 static fuzz runs ran in the core"


ROUTERS = ["round_robin", "random", "least_requests", "least_kv", "power_of_two", "session", "prefix_affinity",
           "lora_affinity"]


def _fuzz_equal(monkeypatch, key: str, draw, count: int = 40) -> int:
    """Cases ``draw(i, rng)`` (rng seeded by ``key`` and i) run by the SimPy loop and the core: the same
    outcome each. Returns how many ran in the core."""
    covered = 0
    for i in range(count):
        data = draw(i, random.Random(f"{key}:{i}"))
        loop, core = _both(monkeypatch, lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        covered += not isinstance(core, str) and bool(core.profile.get("compiled_core"))
    return covered


# blocks of 4 tokens for each allocator on the pressure case: a few regions at a time (a max-length region is
# 1,024 blocks), so that first fit leaves holes and admissions wait for a region to fit
CONTIGUOUS_BLOCKS = {"contiguous-max": 3100, "contiguous-pow2": 150, "contiguous-oracle": 90}


@pytest.mark.parametrize("allocator", sorted(CONTIGUOUS_BLOCKS))
@pytest.mark.parametrize("mode", ["fcfs", "round_robin", "static"])
def test_contiguous_allocators_equal(monkeypatch, allocator, mode):
    """The pre-paging baselines on the pressure case: one region a request, reserved first fit over the free
    extents at its admission and merged back at its end (round-robin's rotations free and re-reserve them;
    static batching keeps a finished member's region until its batch ends); refusals by region size."""
    static = mode == "static"
    data = _scenario(PRESSURE, policy="fcfs" if static else mode, batching="static" if static else "continuous",
                     chunked_prefill=not static)
    data["kv_cache"].update(allocator=allocator, num_gpu_blocks=CONTIGUOUS_BLOCKS[allocator])
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    steps = core.steps
    assert (steps.slots_internal_frag > 0).any() and (steps.num_waiting > 0).any()
    if not static:   # (a static batch's regions are all given back at once: no hole outlives it)
        assert (steps.slots_external_frag > 0).any()
    if mode == "round_robin":
        assert core.summary["num_preemptions"] >= 2


def test_fuzzed_contiguous_allocators_equal(monkeypatch):
    """40 fuzz cases under the three contiguous allocators, continuous or static, a quarter of them clusters:
    the core and the SimPy loop agree."""
    def draw(i: int, rng: random.Random) -> dict:
        data = _static(draw_scenario(rng, i)) if i % 2 else _into_core(draw_scenario(rng, i), samples=False)
        if data["scheduler"].get("policy") == "longest_prefix_first":
            data["scheduler"]["policy"] = "fcfs"
        data["kv_cache"].update(allocator=sorted(CONTIGUOUS_BLOCKS)[i % 3], prefix_caching=False)
        data["kv_cache"].pop("cpu_offload_gib", None)
        if i % 4 == 3:
            data["cluster"] = {"replicas": rng.randint(2, 5), "router": {"policy": ROUTERS[i % len(ROUTERS)]}}
        return data

    covered = _fuzz_equal(monkeypatch, "contig-core", draw)
    assert covered >= 36, f"only {covered} of 40 contiguous fuzz runs ran in the core"


def test_longest_prefix_first_without_a_cache_is_fcfs_in_the_core(monkeypatch):
    """Without a prefix cache every match is empty, so longest-prefix-first admits in FCFS order: the
    core runs it as FCFS, with the SimPy loop's results."""
    data = _scenario(PRESSURE, policy="longest_prefix_first")
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] >= 5


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("quantum", [1, 4])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_round_robin_equals(monkeypatch, preemption, quantum, chunked):
    """Round-robin's time slice on the pressure case: expired turns rotate to the back of the queue (by
    swap or recompute), a swapped request comes back at its turn, memory preemptions as under FCFS."""
    data = _scenario(PRESSURE, policy="round_robin", rr_quantum_steps=quantum, preemption=preemption,
                     chunked_prefill=chunked)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] >= 20


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_the_priority_policy_equals(monkeypatch, preemption, chunked):
    """Priorities 0-3 on the pressure case: the batch sorted by priority each step, the waiting queue a
    heap, the worst-ranked running request preempted, swapped requests back in rank order."""
    data = _scenario(PRESSURE, policy="priority", preemption=preemption, chunked_prefill=chunked)
    for i, r in enumerate(data["workload"]["requests"]):
        r["priority"] = (5 * i) % 4
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] >= 5


@pytest.mark.parametrize("swap_gb", [0.0001, 0.00006], ids=["room", "a-few-blocks"])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_preemption_by_swap_equals(monkeypatch, swap_gb, async_scheduling, chunked):
    """Preemption by swap (26 CPU blocks of 4 KiB, or 15: then most fall back to recompute), swap-ins
    before admissions, the blocks copied priced and recorded."""
    data = _scenario(PRESSURE, preemption="swap", async_scheduling=async_scheduling, chunked_prefill=chunked)
    data["kv_cache"]["swap_space_gb"] = swap_gb
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert core.profile["compiled_core"] and s["swapped_blocks"] > 0 and s["num_preemptions"] >= 5
    assert core.steps["blocks_swapped_in"].sum() == core.steps["blocks_swapped_out"].sum() == s["swapped_blocks"]


def _into_core(data: dict, samples: bool = True) -> dict:
    """A fuzz case moved inside what the core covers: FCFS, round-robin or priority, continuous batching, the paged
    manager (with a prefix cache as drawn, hit only by a preempted request's own blocks: no shared prefixes
    here; tests/test_engine_core_prefix.py fuzzes those), requests of one sequence or parallel samples as
    drawn (no beams; ``samples`` False: none), outside shared-prefix groups; local-attention models as drawn."""
    d = copy.deepcopy(data)
    if d["scheduler"].get("policy") not in ("fcfs", "priority", "round_robin", "longest_prefix_first"):
        d["scheduler"]["policy"] = "fcfs"
    d["scheduler"]["batching"] = "continuous"
    d["kv_cache"].update(allocator="paged")   # prefix caching as drawn: unhit without shared prefixes
    # (pipeline stages as drawn: the core runs them too)
    # (LoRA serving as drawn: the core runs it too)
    work = d["workload"]   # (a client limit, as drawn: the core runs it too)
    work.pop("timeout_s", None)   # (client timeouts: tests/test_timeouts.py; a client limit below refuses them)
    for r in work.get("requests", []):
        for key in ("beam_width", "prefix_group", "prefix_len", *(() if samples else ("n",))):
            r.pop(key, None)
    for key in ("beam_width", "shared_prefix", *(() if samples else ("n",))):
        work.get("synthetic", {}).pop(key, None)
    return d


@pytest.mark.parametrize("part", range(4))   # 4 x 30 cases: parallel test workers share them
def test_fuzz_cases_equal(monkeypatch, part):
    covered = 0
    for i in range(30 * part, 30 * part + 30):
        drawn = draw_scenario(random.Random(f"engine-core:{i}"), i)
        for data in (drawn, _into_core(drawn)):
            loop, core = _both(monkeypatch, lambda d=data: run_scenario(
                scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
            assert_same_outcome(loop, core, f"case {i}")
            covered += not isinstance(core, str) and bool(core.profile.get("compiled_core"))
    assert covered >= 25, f"only {covered} of 60 fuzz runs ran in the core"


@pytest.mark.parametrize("part", range(2))   # 2 x 30 cases: parallel test workers share them
def test_fuzzed_clients_equal(monkeypatch, part):
    """Fuzz cases moved inside the core with a client always in front (one to 40 slots or two stages of
    limits, fixed or exponential pauses), every third on 2 to 4 replicas: the core and the SimPy loop agree."""
    covered = 0
    for i in range(30 * part, 30 * part + 30):
        rng = random.Random(f"engine-core-clients:{i}")
        data = _into_core(draw_scenario(rng, i))
        data["scheduler"]["parallel_sampling"] = "fork"   # (a client counts requests: fanout is refused with one)
        work = data["workload"]
        work["max_concurrency"] = rng.choice([1, 2, 3, 5, 40]) if i % 4 else \
            [{"from_s": 0, "limit": rng.randint(1, 3)}, {"from_s": rng.choice([0.5, 5.0]), "limit": rng.randint(1, 6)}]
        work["think_time_s"] = rng.choice([0.0, 0.002, 0.1])
        work["think_time_dist"] = rng.choice(["fixed", "exponential"])
        if i % 3 == 0:
            data["cluster"] = {"replicas": rng.randint(2, 4), "router": {"policy": ROUTERS[i % len(ROUTERS)]}}
        loop, core = _both(monkeypatch, lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        covered += not isinstance(core, str) and bool(core.profile.get("compiled_core"))
    assert covered >= 25, f"only {covered} of 30 client fuzz runs ran in the core"


def test_fuzzed_clusters_equal(monkeypatch):
    """Fuzz cases moved inside the core, on 2 to 6 replicas behind every router (the routing rules the core
    applies itself included, sim/cluster/routers.py ``core_rule``): the core and the SimPy loop agree."""

    policies = ["round_robin", "random", "least_requests", "least_kv", "power_of_two", "session", "prefix_affinity",
                "lora_affinity"]
    covered = 0
    for i in range(42):
        rng = random.Random(f"cluster-core:{i}")
        data = _into_core(draw_scenario(rng, i))
        data["cluster"] = {"replicas": rng.randint(2, 6),
                           "router": {"policy": policies[i % len(policies)], "load_slack": rng.randint(0, 3)}}
        loop, core = _both(monkeypatch, lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        covered += same_cluster_outcome(loop, core, f"case {i}")
    assert covered >= 36, f"only {covered} fuzzed clusters ran in the core"


def test_rows_handed_over_in_many_chunks_equal(monkeypatch, tmp_path):
    """Chunks of 64 rows: the core hands the recorder many (and the step table is streamed to disk as they
    fill, as ``kvsim run --out`` does)."""
    monkeypatch.setattr(Columns, "CHUNK_ROWS", 64)
    data = _scenario(STRESS["long_decodes"])
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=False))
    assert_same(loop, core)
    assert core.summary["num_steps"] > 20 * 64


def test_progress_is_reported_every_few_hundred_steps(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(engine_core, "PROGRESS_EVERY", 50)
    data = _scenario(STRESS["long_decodes"])
    scn = scenario_from_dict(data)
    import sim.runner as runner

    class Bar:   # the progress bar's interface (sim/progress_bar.py ProgressBar)
        def __init__(self, total, after_s=0.0):
            self.total = total

        def at(self, done):
            calls.append(done)

        def close(self):
            pass

    monkeypatch.setattr(runner, "ProgressBar", Bar)
    res = run_scenario(scn, progress=True, check_integrity=False)
    steps = res.summary["num_steps"]
    assert len(calls) == steps // 50
    assert calls == sorted(calls) and 0 < calls[-1] <= 300   # requests finished or rejected so far


def test_what_the_core_does_not_cover_runs_the_loop():
    base = _scenario(STRESS["long_decodes"])
    base["workload"]["synthetic"]["num_requests"] = 20
    cases = {
        "beam search": {"workload": {"synthetic": {"beam_width": 2}}},
    }
    assert run_scenario(scenario_from_dict(base), check_integrity=False).profile["compiled_core"]
    for label, change in cases.items():
        d = copy.deepcopy(base)
        for section, values in change.items():
            for key, value in values.items():
                if isinstance(value, dict):
                    d[section][key].update(value)
                else:
                    d.setdefault(section, {})[key] = value
        res = run_scenario(scenario_from_dict(d), check_integrity=False)
        assert not res.profile["compiled_core"], label


def _unhit(**kv) -> dict:
    """PRESSURE's requests (no shared content) under a prefix cache: no hit but a preempted request's own."""
    data = _scenario(PRESSURE)
    data["kv_cache"].update(prefix_caching=True, **kv)
    return data


def test_an_unhit_prefix_cache_runs_in_the_core_and_counts_its_evictions(monkeypatch):
    # room for everything: nothing preempted, so the cache changes nothing but the evictions it counts
    data = _unhit(num_gpu_blocks=400)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] == 0
    assert core.summary["prefix_cache_evictions"] > 100 and core.summary["prefix_cache_hit_rate"] == 0


def test_a_preempted_request_finds_its_own_blocks_in_the_core(monkeypatch):
    # 48 blocks: preemptions by recompute, after which a request finds its own blocks still cached (the
    # hit rate counts first admissions only: it stays 0, while the steps' prefill tokens fall)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(_unhit()), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] > 0
    off = run_scenario(scenario_from_dict(_scenario(PRESSURE)), check_integrity=False)
    assert core.steps["num_prefill_tokens"].sum() < off.steps["num_prefill_tokens"].sum()


@pytest.mark.parametrize("blocks", [None, 300])
def test_a_cluster_with_an_unhit_prefix_cache(monkeypatch, blocks):
    # 4 replicas behind round-robin over the Azure trace; with 300 blocks a replica preempts
    sets = ["kv_cache.prefix_caching=true", "workload.limit=400", "output.plots=false"]
    if blocks:
        sets.append(f"kv_cache.num_gpu_blocks={blocks}")
    scn = ROOT / "scenarios" / "cluster_round_robin.yaml"
    loop, core = _both(monkeypatch, lambda: run_scenario(load_scenario(scn, sets), check_integrity=False))
    assert_same(loop, core)
    import pandas as pd

    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)
    assert core.profile["compiled_core"] and core.summary["prefix_cache_evictions"] > 0
    assert (core.summary["num_preemptions"] > 0) == bool(blocks)


@pytest.mark.parametrize("core_on", [False, True])
def test_evictions_of_an_unhit_prefix_cache_by_hand(monkeypatch, core_on):
    """Three requests one after another, 40 prompt tokens and 2 output tokens each (41 tokens of KV: 3 blocks
    of 16, the first 2 full and cached when freed, tail first), on 4 blocks: the free queue (head first)
    starts [4 free]; r0 takes 3 of them, frees 1 uncached + 2 cached: [1, 1, 2c]; r1 takes 1, 1 and 1 cached
    (1 evicted), frees [1c, 1, 2c, 1, 2c]; r2 takes 1 cached, 1 and 1 cached (2 evicted): 3 in all."""
    monkeypatch.setattr(engine_core, "enabled", core_on)
    data = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 4, "prefix_caching": True},
            "workload": {"requests": [{"arrival": float(i), "prompt_len": 40, "output_len": 2} for i in range(3)]}}
    res = run_scenario(scenario_from_dict(data), check_integrity=True)
    assert res.profile["compiled_core"] == core_on and res.summary["num_finished"] == 3
    assert res.summary["prefix_cache_evictions"] == 3


def test_an_integrity_check_failure_is_an_assertion(monkeypatch):
    """The core's own checks (check_integrity) see a corrupted counter: here every block the pool hands
    out is counted twice as free, through a pool that starts with more free blocks than it has."""
    data = _scenario(STRESS["long_decodes"])
    data["workload"]["synthetic"]["num_requests"] = 5
    scn = scenario_from_dict(data)
    from sim.kv.block_pool import BlockPool

    monkeypatch.setattr(BlockPool, "num_free", property(lambda self: int(np.count_nonzero(self.refs == 0)) + 1))
    with pytest.raises(AssertionError, match="engine core: free \\+ held blocks is not the pool"):
        run_scenario(scn, check_integrity=True)


CLIENTS = {   # workload keys of a client with a concurrency limit (sim/clients.py)
    "one_slot": {"max_concurrency": 1},
    "three_slots_fixed_pause": {"max_concurrency": 3, "think_time_s": 0.05},
    "exponential_pauses": {"max_concurrency": 2, "think_time_s": 0.2, "think_time_dist": "exponential"},
    "stages": {"max_concurrency": [{"from_s": 0, "limit": 2}, {"from_s": 4.0, "limit": 9}, {"from_s": 8.0, "limit": 1}]},
}
CLIENT_SETTINGS = {   # the scheduler and cache settings of the pressure case the client runs against
    "fcfs-async": {"async_scheduling": True},
    "fcfs-sync-whole-prompts": {"async_scheduling": False, "chunked_prefill": False},
    "priority-swap": {"policy": "priority", "preemption": "swap"},
    "round_robin": {"policy": "round_robin", "rr_quantum_steps": 2},
    "static": {"batching": "static", "chunked_prefill": False},
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("settings", sorted(CLIENT_SETTINGS))
def test_a_client_runs_in_the_core_and_equals(monkeypatch, client, settings):
    """A client with a concurrency limit in front of the pressure case (preemptions, refusals at hand-over,
    async staging, priorities, static batches; the frontend's latencies on): sends, hand-overs, slot
    releases and pauses in SimPy's event order, the same tables and summary bit for bit."""
    data = _scenario(PRESSURE, **CLIENT_SETTINGS[settings])
    for i, r in enumerate(data["workload"]["requests"]):
        r["priority"] = (5 * i) % 4
    data["workload"].update(CLIENTS[client])
    data["frontend"] = {"input_latency_s": 0.002, "output_latency_s": 0.001, "token_latency_s": 0.0001}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert core.summary["num_rejected"] == 3
    open_loop = run_scenario(scenario_from_dict({**data, "workload": PRESSURE["workload"]}), check_integrity=False)
    assert not core.requests["arrival_s"].equals(open_loop.requests["arrival_s"])   # (the client held some back)


@pytest.mark.parametrize("policy", ["round_robin", "random", "least_requests", "least_kv", "power_of_two", "session",
                                    "prefix_affinity"])
def test_a_client_in_front_of_a_cluster_runs_in_the_core_and_equals(monkeypatch, policy):
    """4 replicas behind every router the core covers, 7 slots with exponential pauses over the long decodes
    (a burst of 300 at rate 300/s): each request routed as it reaches the pool, as the SimPy loop's client does."""
    data = _scenario(STRESS["long_decodes"])
    data["workload"]["synthetic"]["arrival"]["rate"] = 300.0
    data["workload"].update(max_concurrency=7, think_time_s=0.01, think_time_dist="exponential")
    data["cluster"] = {"replicas": 4, "router": {"policy": policy}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=False))
    _assert_same_clusters(loop, core)


@pytest.mark.parametrize("policy", ["round_robin", "random", "least_requests", "least_kv", "power_of_two", "session",
                                    "prefix_affinity"])
@pytest.mark.parametrize("case", ["long_decodes", "pressure"])
def test_clusters_run_in_the_core_and_equal(monkeypatch, policy, case):
    """Replicas behind every router that reads at most their loads and KV usage: one arrival process feeds
    every replica's engine in SimPy's event order (arrivals tied with other replicas' step ends included),
    the router called at each arrival (or its choices made ahead)."""
    data = _scenario(STRESS["long_decodes"] if case == "long_decodes" else PRESSURE)
    if case == "long_decodes":
        data["workload"]["synthetic"]["arrival"]["rate"] = 60.0
    data["cluster"] = {"replicas": 3, "router": {"policy": policy}}
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    _assert_same_clusters(loop, core)


@pytest.mark.parametrize("policy", ["least_requests", "least_kv", "power_of_two", "prefix_affinity", "session"])
@pytest.mark.parametrize("case", ["long_decodes", "pressure", "conversations"])
def test_routing_rules_applied_by_the_core_equal_the_routers_calls(monkeypatch, policy, case):
    """The routers with a ``core_rule`` are applied by the core itself (sim/csrc/core.c ``rule_choice``): 8
    replicas, a burst of arrivals at one instant (every load tied, then the submitted counts), a pool
    under memory pressure (KV usage apart), prefix_affinity with a slack of 1 and prompts of one block and
    less, and the Mooncake conversations (session follows earlier turns): the same results as calling the
    router at each arrival, and the rule is what ran."""
    import pandas as pd

    from sim.cluster import routers

    cluster = {"replicas": 8, "router": {"policy": policy, "load_slack": 1}}
    data = _scenario(STRESS["long_decodes"] if case == "long_decodes" else PRESSURE)
    data["cluster"] = cluster
    if case == "long_decodes":
        data["workload"]["synthetic"]["arrival"]["rate"] = 200.0
    elif case == "pressure":
        data["workload"]["requests"] += [{"arrival": 1.0, "prompt_len": 1 + i % 6, "output_len": 9} for i in range(40)]

    def scenario():
        if case != "conversations":
            return scenario_from_dict(data)
        return load_scenario(ROOT / "scenarios/mooncake_conversation.yaml", [
            "kv_cache.prefix_caching=false", "workload.limit=300", "output.plots=false",
            *(f"cluster.{k}={v}" for k, v in [("replicas", 8), ("router.policy", policy), ("router.load_slack", 1)])])

    applied = []
    real = engine_core.run_engines

    def spy(*args, **kwargs):
        applied.append(kwargs.get("rule"))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_core, "run_engines", spy)
    monkeypatch.setattr("sim.cluster.runner.run_engines", spy)
    by_rule = run_scenario(scenario(), check_integrity=True)
    monkeypatch.setattr(routers.ROUTERS[policy], "core_rule", lambda self, n, m: None)
    by_call = run_scenario(scenario(), check_integrity=True)
    assert applied[0] is not None and applied[1] is None
    assert by_rule.profile["compiled_core"] and by_call.profile["compiled_core"]
    assert_same(by_call, by_rule)
    pd.testing.assert_frame_equal(by_call.replicas, by_rule.replicas, check_exact=True)
    assert (by_rule.replicas["requests"] > 0).sum() >= 4


def test_power_of_two_hands_the_core_the_pairs_its_calls_would_read():
    """``PowerOfTwo.core_rule`` draws the pairs ``choose`` would read, request by request, across blocks of
    drawn pairs, and leaves the rest of the last block to later calls as ``choose`` would."""
    from sim.cluster import routers
    from sim.cluster.config import RouterConfig

    n = 2 * routers.PowerOfTwo.BLOCK + 37
    ahead = routers.PowerOfTwo(RouterConfig(policy="power_of_two"), seed=11)
    called = routers.PowerOfTwo(RouterConfig(policy="power_of_two"), seed=11)
    rule = ahead.core_rule([None] * n, 5)
    read = []
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setattr(routers, "least_loaded", lambda replicas, among=None, loads=None: read.append(among) or among[0])
        for _ in range(n + 10):
            called.choose(None, [None] * 5)
        later = []
        m.setattr(routers, "least_loaded", lambda replicas, among=None, loads=None: later.append(among) or among[0])
        for _ in range(10):
            ahead.choose(None, [None] * 5)
    assert rule.kind == routers.CoreRule.PAIR and rule.choices.shape == (n, 2)
    assert [tuple(p) for p in rule.choices.tolist()] == read[:n]
    assert later == read[n:]
    assert all(a < b for a, b in read)


def test_a_router_reading_prefix_caches_runs_the_loop(monkeypatch):
    """A router of one's own that reads the replicas' prefix caches in ``choose`` (the core has no rule for
    it): the SimPy loop; prefix_affinity's rule reads them in the core (tests/test_engine_core_prefix.py)."""
    from sim.cluster import routers

    class Greedy(routers.PrefixAffinity):
        rule_reads_caches = False

        def core_rule(self, requests, num_replicas):
            return None

    monkeypatch.setitem(routers.ROUTERS, "prefix_affinity", Greedy)
    data = _scenario(STRESS["long_decodes"])
    data["workload"]["synthetic"]["num_requests"] = 30
    data["kv_cache"] = {"prefix_caching": True}
    data["cluster"] = {"replicas": 2, "router": {"policy": "prefix_affinity"}}
    assert not run_scenario(scenario_from_dict(data), check_integrity=False).profile["compiled_core"]


def test_a_non_positive_step_time_is_the_same_error(monkeypatch):
    """The per-operator model's GEMM time made negative for steps of 1,000 tokens or more (prefill steps,
    which the SimPy loop prices one at a time): both loops stop at the same step with the same message."""
    from sim.executors.cost_model import CostModelExecutor

    linear = CostModelExecutor._linear

    def broken(self, tokens):
        lin, comm = linear(self, tokens)
        return (-1.0, comm) if tokens >= 1000 else (lin, comm)

    data = _scenario(STRESS["long_decodes"])
    data["executor"] = {"calibration": "roofline"}
    monkeypatch.setattr(CostModelExecutor, "_linear", broken)
    loop, core = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(data), check_integrity=False))
    assert isinstance(loop, str) and "returned a non-positive duration" in loop
    assert loop == core
