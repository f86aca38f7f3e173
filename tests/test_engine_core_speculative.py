"""Speculative decoding in the compiled core (sim/csrc/core.c, sim/csrc/speculate.c) against the SimPy loop
(sim/engine.py) as the reference: the same results bit for bit (summary.json apart from wall_time_s, the
per-step table with its draft part, the requests' table with their drafts, the timeline) under memory
pressure, preemption by recompute and by swap, prefix caching with shared prefixes, every scheduling policy
the core covers, every drafter and both pricing modes, colocated clusters and fuzzed cases; and the
acceptance draws continue from where the core left the generator."""

from __future__ import annotations

import copy
import random

import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_engine_core import PRESSURE, _assert_same_clusters, _into_core, _scenario
from test_multi_step import STRESS

import sim.engine_core as engine_core
import sim.fuzz as fuzz
from sim.native import native
from sim.runner import build_parts, cpu_blocks, gpu_blocks, run_scenario
from sim.scenario import scenario_from_dict
from sim.workload import build_workload

pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")

RATES = [0.9, 0.6, 0.3]   # (some drafts rejected at every depth: the slots given back, blocks trimmed)
DRAFTERS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": RATES},
    "eagle": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": RATES},
}


def _speculating(data: dict, drafter: dict) -> dict:
    d = _scenario(data)
    d["speculative"] = copy.deepcopy(drafter)
    return d


def _both(monkeypatch, data: dict, check: bool = True):
    return off_and_on(monkeypatch, engine_core, "enabled",
                      lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=check))


def _assert_speculated_in_the_core(loop, core) -> None:
    assert core.profile["compiled_core"] and not loop.profile["compiled_core"]
    spec = core.summary["speculative"]
    assert 0 < spec["accepted_tokens"] < spec["draft_tokens"], spec
    assert (core.steps["time_draft_s"] >= 0).all()


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("case", ["tight_pool", "full_batch_priority", "blocked_head", "blocked_head_chunked",
                                  "round_robin", "pressure"])
def test_speculating_engines_equal(monkeypatch, case, drafter):
    """Prefix caching with shared prefixes and swap space, priorities with swap preemption, a memory-bound
    queue (whole prompts and chunked), round-robin turns, a pool under pressure with refusals: the drafts,
    their draws, trims and prices as the loop's, the integrity checks on after every step."""
    data = _speculating(PRESSURE if case == "pressure" else STRESS[case], DRAFTERS[drafter])
    loop, core = _both(monkeypatch, data)
    assert_same(loop, core)
    _assert_speculated_in_the_core(loop, core)


@pytest.mark.parametrize("calibration", [None, "roofline"], ids=["engine", "roofline"])
def test_a_draft_model_is_priced_alike_in_both_modes(monkeypatch, calibration):
    """Llama-3-8B drafted for by Llama-3.2-1B (the same vocabulary): its k passes priced from its own size
    terms and constants, on the H100's engine calibration and on the plain roofline."""
    data = _speculating(STRESS["long_decodes"], {"method": "draft_model", "model": "llama-3.2-1b",
                                                 "num_speculative_tokens": 4, "acceptance_rate": 0.7})
    data["workload"]["synthetic"]["num_requests"] = 120
    if calibration:
        data["executor"] = {"calibration": calibration}
    loop, core = _both(monkeypatch, data, check=False)
    assert_same(loop, core)
    _assert_speculated_in_the_core(loop, core)
    assert core.steps["time_draft_s"].max() > 0


@pytest.mark.parametrize("policy", ["round_robin", "least_kv", "power_of_two", "session"])
def test_speculating_clusters_equal(monkeypatch, policy):
    """Three replicas, each drawing from its own stream (the scenario's seed and the replica), behind routers
    whose choices are made ahead, by the core's rules, or by reading the replicas."""
    data = _speculating(PRESSURE, DRAFTERS["eagle"])
    data["cluster"] = {"replicas": 3, "router": {"policy": policy}}
    loop, core = _both(monkeypatch, data)
    _assert_same_clusters(loop, core)
    assert core.summary["speculative"]["verifications"] > 0


def test_the_draws_continue_where_the_core_left_the_generator():
    """After a run in the core, the engine's generator is where the verifications' draws left it (one
    ``random()`` each, from a generator seeded as sim/speculative.py seeds it), and its counts are its
    requests' counts summed."""
    scn = scenario_from_dict(_speculating(PRESSURE, DRAFTERS["eagle"]))
    num_gpu, num_cpu = gpu_blocks(scn), cpu_blocks(scn)
    manager, scheduler, executor, recorder = build_parts(scn, num_gpu, num_cpu)
    workload = build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source)
    assert engine_core.core_supported(scheduler, manager, executor, workload.requests)
    engine_core.run_core(workload.requests, scheduler, executor, recorder, arrival_delay_s=0.0,
                         async_scheduling=True, max_stall=1000, check_integrity=True)
    spec = scheduler.speculation
    assert spec.verifications > 100
    fresh = random.Random(f"speculative/{scn.seed}/0")
    for _ in range(spec.verifications):
        fresh.random()
    assert spec.stream.getstate() == fresh.getstate()
    assert spec.drafted == sum(d for d, _ in spec.by_request.values())
    assert spec.accepted == sum(a for _, a in spec.by_request.values())
    assert spec.accepted < spec.drafted


def _forced(i: int) -> dict:
    """Fuzz case ``i`` moved inside the core, speculating: its own draw where it has one, else 1 to 5 drafts
    (ngram, or an EAGLE or EAGLE-3 head where the block count is given), any acceptance from none to all."""
    data = _into_core(fuzz.draw_scenario(random.Random(f"engine-core-spec:{i}"), i), samples=False)
    data.pop("lora", None)   # (LoRA and pipeline stages are refused with speculative decoding)
    if isinstance(data.get("hardware"), dict):
        for key in ("pipeline_parallel", "pipeline_link"):
            data["hardware"].pop(key, None)
    if "speculative" not in data:
        rng = random.Random(f"engine-core-spec-force:{i}")
        k = rng.randint(1, 5)
        data["speculative"] = {
            "method": rng.choice(["ngram", "eagle", "eagle3"]) if "num_gpu_blocks" in data["kv_cache"] else "ngram",
            "num_speculative_tokens": k,
            "acceptance_rate": rng.choice([0.0, 1.0, round(rng.random(), 3), [round(rng.random(), 3) for _ in range(k)]])}
    return data


@pytest.mark.parametrize("part", range(2))   # 2 x 15 cases: parallel test workers share them
def test_fuzzed_speculating_cases_equal(monkeypatch, part):
    covered = 0
    for i in range(15 * part, 15 * part + 15):
        data = _forced(i)
        loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        covered += not isinstance(core, str) and bool(core.profile.get("compiled_core")) \
            and "speculative" in core.summary
    assert covered >= 12, f"only {covered} of 15 speculating fuzz runs ran in the core"
