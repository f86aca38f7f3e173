"""A waiting head that cannot get its blocks is not tried again until its blocks could be there
(``ContinuousScheduler._blocked_head``): the plans and results must equal trying at every step, bit for
bit. A saturated engine (the quickstart: memory full, a queue waiting) meets it at most steps."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_multi_step import STRESS

import sim.sched.continuous as continuous
from sim.fuzz import draw_scenario
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def skipped(monkeypatch) -> list[int]:
    """Counts the admissions that stopped at once on a remembered head (with the memory on)."""
    admit = continuous.ContinuousScheduler._admit
    count = [0]

    def counting(self, now, scheduled, batch, budget, stats, **kwargs):
        before, planned, tables = self._blocked_head, len(scheduled), len(self.manager.block_tables)
        admit(self, now, scheduled, batch, budget, stats, **kwargs)
        count[0] += before is not None and self._blocked_head is before and len(scheduled) == planned \
            and len(self.manager.block_tables) == tables
    monkeypatch.setattr(continuous.ContinuousScheduler, "_admit", counting)
    return count


def _both(monkeypatch, run):
    return off_and_on(monkeypatch, continuous.ContinuousScheduler, "remember_blocked_head", run)


def test_a_blocked_head_is_tried_once_until_blocks_are_freed(monkeypatch):
    """Three requests of 40 prompt tokens into 8 blocks of 16 tokens (no chunking): the first two take
    3 blocks each (and one more each as they decode); the third needs 3 and finds at most 2 free until
    one of them finishes. Its allocation is attempted once while blocked, then once more after the
    frees; with the memory off, at every step in between."""
    data = {"name": "blocked", "seed": 0, "model": "llama-2-7b", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 8},
            "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "multi_step": False},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 40, "output_len": 20},
                                      {"arrival": 0.0, "prompt_len": 40, "output_len": 30},
                                      {"arrival": 0.001, "prompt_len": 40, "output_len": 5}]},
            "output": {"plots": False}}
    tries = {False: 0, True: 0}
    allocate = continuous.KVCacheManager.allocate_slots
    on = [False]

    def counting(self, req, num_new, cached=None):
        tries[on[0]] += req.req_id == 2 and num_new == 40
        return allocate(self, req, num_new, cached)
    monkeypatch.setattr(continuous.KVCacheManager, "allocate_slots", counting)
    results = []
    for flag in (False, True):
        on[0] = flag
        monkeypatch.setattr(continuous.ContinuousScheduler, "remember_blocked_head", flag)
        results.append(run_scenario(scenario_from_dict(copy.deepcopy(data), source="<t>"), check_integrity=True))
    assert_same(*results)
    assert tries[True] == 2                      # blocked once, admitted after the first finish
    assert tries[False] > tries[True] + 10       # tried at every step of the first request's 20 decodes
    req2 = results[1].requests.set_index("req_id").loc[2]
    first_finish = results[1].requests.set_index("req_id").loc[0, "finish_s"]
    assert req2["first_scheduled_s"] >= first_finish


def test_quickstart_and_stress_scenarios_equal(skipped, monkeypatch):
    off, on = _both(monkeypatch, lambda: run_scenario(
        load_scenario(str(ROOT / "scenarios" / "quickstart.yaml"), ["workload.limit=600"]), check_integrity=False))
    assert_same(off, on)
    assert skipped[0] > 100, "the saturated quickstart never met a remembered head"
    for name, data in STRESS.items():
        data = copy.deepcopy(data)
        data["output"] = {"plots": False}
        off, on = _both(monkeypatch, lambda d=data, c=name != "long_decodes": run_scenario(scenario_from_dict(copy.deepcopy(d), source="<t>"),
                                                                 check_integrity=c))
        assert_same(off, on)


def _saturated(rng: random.Random, i: int) -> dict:
    """A fuzzer case made to queue: continuous batching, no prefix cache, and a burst of requests that
    overfills its blocks (each request fits alone)."""
    data = draw_scenario(rng, i)
    data["scheduler"] = {**data.get("scheduler", {}), "batching": "continuous"}
    kv = data.setdefault("kv_cache", {})
    kv["prefix_caching"] = False
    kv.pop("gpu_memory_utilization", None)
    kv.pop("activation_reserve_gb", None)
    bs = kv.get("block_size", 16)
    blocks = kv["num_gpu_blocks"] = rng.randint(6, 40)
    cap = blocks * bs
    reqs = []
    for _ in range(rng.randint(10, 30)):
        prompt = rng.randint(1, max(1, cap // 3))
        reqs.append({"arrival": round(rng.uniform(0, 0.05), 4), "prompt_len": prompt,
                     "output_len": rng.randint(1, max(1, min(60, cap - prompt)))})
    data["workload"] = {"requests": reqs}
    return data


def test_saturated_fuzz_cases_equal(skipped, monkeypatch):
    for i in range(40):
        data = _saturated(random.Random(f"blocked-head:{i}"), i)
        off, on = _both(monkeypatch, lambda d=data: run_scenario(scenario_from_dict(copy.deepcopy(d), source="<fuzz>"),
                                                                 check_integrity=True))
        assert_same_outcome(off, on, f"case {i}")
    assert skipped[0] > 100, "the saturated cases seldom met a remembered head"
