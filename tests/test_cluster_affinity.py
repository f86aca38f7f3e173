"""prefix_affinity over replicas without prefix caches: it reads their loads only (every hit is 0), so
their decode runs go past arrivals routed elsewhere; the choices and results are those of the router
that reads every replica's state at every arrival."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import pytest
from result_compare import assert_same
from test_multi_step import cut_count  # noqa: F401  (a fixture, used by ``cuts``)

import sim.sched.decode_run as decode_run
from sim.cluster.config import RouterConfig
from sim.cluster.routers import PrefixAffinity
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


@dataclass
class FakeReplica:
    """A ReplicaView with a fixed load and a fixed number of cached prompt blocks; notes being asked."""

    loaded: int
    submitted: int = 0
    cache: bool = False
    hits: int = 0
    asked: bool = False
    block_size: int = 16

    def load(self) -> int:
        return self.loaded

    def kv_usage(self) -> float:
        raise AssertionError("prefix_affinity does not read KV usage")

    def has_prefix_cache(self) -> bool:
        return self.cache

    def cached_prefix_blocks(self, req: Request, hashes: list[int]) -> int:
        self.asked = True
        return self.hits


def _router(pool: list[FakeReplica]) -> PrefixAffinity:
    router = PrefixAffinity(RouterConfig(policy="prefix_affinity", load_slack=8), seed=0)
    router.attach(pool)
    return router


def test_without_caches_it_reads_loads_only() -> None:
    # loads 3, 1, 1, 12: replicas 0-2 are within 8 of the least loaded (1); every hit is 0, so the
    # least loaded wins, ties to the lower index (replica 1, although it was sent more requests)
    pool = [FakeReplica(3), FakeReplica(1, submitted=9), FakeReplica(1, submitted=2), FakeReplica(12)]
    router = _router(pool)
    assert not router.reads_state and not router.reads_memory and router.reads_load
    assert router.choose(Request(0, 0.0, 100, 5), pool) == 1
    assert not any(r.asked for r in pool)


def test_with_a_cache_it_reads_prefix_caches() -> None:
    # replica 2 holds 3 blocks of the prompt: it wins over the less loaded replicas 0 and 1 (one
    # cache in the pool is enough for every replica to be looked up)
    pool = [FakeReplica(1), FakeReplica(1), FakeReplica(4, cache=True, hits=3)]
    router = _router(pool)
    assert router.reads_state
    assert router.choose(Request(0, 0.0, 100, 5), pool) == 2
    assert all(r.asked for r in pool)


# a busy cluster of long decodes, no prefix caching; small pools (the integrity check is O(blocks))
BUSY = {"model": "tiny-llama", "hardware": "a100-80gb", "seed": 5, "output": {"plots": False},
        "kv_cache": {"block_size": 8, "num_gpu_blocks": 400},
        "scheduler": {"max_num_seqs": 24, "chunked_prefill": True, "max_num_batched_tokens": 256},
        "workload": {"synthetic": {
            "num_requests": 160, "arrival": {"process": "poisson", "rate": 400.0},
            "prompt_len": {"dist": "uniform", "min": 4, "max": 200},
            "output_len": {"dist": "uniform", "min": 1, "max": 300}}},
        "cluster": {"replicas": 4, "router": {"policy": "prefix_affinity"}}}


def _run(multi_step: bool):
    data = copy.deepcopy(BUSY)
    data["scheduler"]["multi_step"] = multi_step
    return run_scenario(scenario_from_dict(data, source="<test>"), check_integrity=True)


@pytest.fixture
def cuts(cut_count, monkeypatch) -> dict[str, int]:  # noqa: F811  (the imported fixture)
    """Counts decode runs cut by a request routed to their replica (runs that went past arrivals), runs
    of any length taken."""
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS", 1)
    monkeypatch.setattr(decode_run, "MIN_RUN_STEPS_LARGE", 1)
    return cut_count


def test_without_caches_runs_go_past_arrivals_with_the_same_results(cuts, monkeypatch, simpy_loop) -> None:
    lazy = _run(multi_step=True)
    assert cuts["cuts"] > 0
    assert_same(_run(multi_step=False), lazy)
    # the router reading every replica's state at every arrival (no attach): the same choices and results
    monkeypatch.setattr(PrefixAffinity, "attach", lambda self, replicas: None)
    observed = _run(multi_step=True)
    assert_same(observed, lazy)
    pd.testing.assert_frame_equal(observed.replicas, lazy.replicas, check_exact=True)
    assert lazy.requests["replica"].nunique() == 4
