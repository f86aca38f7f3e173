"""Replicas behind a router: each policy's choices checked by hand on small workloads, the
quickstart's round-robin split, and determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
        "frontend": {"enabled": False}}


def _inline(reqs: list[tuple[float, int, int]], cluster: dict, **extra) -> dict:
    work = [{"arrival": a, "prompt_len": p, "output_len": o, **({"prefix_group": g, "prefix_len": 64} if g >= 0 else {})}
            for a, p, o, g in [(*r, -1) if len(r) == 3 else r for r in reqs]]
    return {**TINY, "kv_cache": {"block_size": 16, "num_gpu_blocks": 400, **extra.pop("kv", {})},
            "workload": {"requests": work}, "cluster": cluster, **extra}


def _replicas(data: dict) -> list[int]:
    res = run_scenario(scenario_from_dict(data))
    return res.requests.sort_values("req_id")["replica"].tolist()


def test_round_robin_is_index_mod_n() -> None:
    reqs = [(0.01 * i, 20, 5) for i in range(10)]
    assert _replicas(_inline(reqs, {"replicas": 4})) == [i % 4 for i in range(10)]


def test_least_requests_spreads_a_burst_lowest_index_first() -> None:
    # 8 requests at once: each sees the loads left by the previous ones: 0,1,2,3 then 0,1,2,3
    reqs = [(0.0, 20, 50)] * 8
    assert _replicas(_inline(reqs, {"replicas": 4, "router": {"policy": "least_requests"}})) == [0, 1, 2, 3] * 2


def test_least_kv_prefers_the_emptier_cache() -> None:
    # a long request holds 63+ blocks of replica 0 while it decodes; requests 1 and 2 (one block each)
    # both go to replica 1, whose cache stays the emptier, where least_requests would alternate
    reqs = [(0.0, 1000, 2000), (0.5, 16, 400), (0.6, 16, 400)]
    assert _replicas(_inline(reqs, {"replicas": 2, "router": {"policy": "least_kv"}})) == [0, 1, 1]
    assert _replicas(_inline(reqs, {"replicas": 2, "router": {"policy": "least_requests"}})) == [0, 1, 0]


class _Usage:
    """A ReplicaView with a fixed KV usage and load; notes whether its load was read."""

    def __init__(self, usage: float, loaded: int) -> None:
        self.usage, self.loaded, self.load_read, self.submitted = usage, loaded, False, 0

    def kv_usage(self) -> float:
        return self.usage

    def load(self) -> int:
        self.load_read = True
        return self.loaded


def test_least_kv_breaks_a_tie_in_usage_by_load_then_index() -> None:
    from sim.cluster.config import RouterConfig
    from sim.cluster.routers import LeastKV

    router = LeastKV(RouterConfig(policy="least_kv"), seed=0)
    pool = [_Usage(0.5, 0), _Usage(0.25, 9), _Usage(0.75, 0)]
    assert router.choose(None, pool) == 1                  # the lowest usage, whatever its load
    assert not any(r.load_read for r in pool)              # no tie: no load is read
    pool = [_Usage(0.5, 0), _Usage(0.25, 3), _Usage(0.25, 2), _Usage(0.25, 2)]
    assert router.choose(None, pool) == 2                  # tied at 0.25: load 2 beats 3, then index 2 < 3
    assert not pool[0].load_read and all(r.load_read for r in pool[1:])


def test_power_of_two_reads_two_distinct_replicas_uniformly_and_takes_the_less_loaded() -> None:
    from collections import Counter

    from sim.cluster.config import RouterConfig
    from sim.cluster.routers import PowerOfTwo

    router = PowerOfTwo(RouterConfig(policy="power_of_two"), seed=3)
    pool = [_Usage(0.0, load) for load in (5, 1, 3, 1)]
    pairs = Counter()
    for _ in range(6000):   # spans several blocks of drawn pairs
        for r in pool:
            r.load_read = False
        chosen = router.choose(None, pool)
        read = tuple(i for i, r in enumerate(pool) if r.load_read)
        assert len(read) == 2
        # the less loaded of the two; equal loads (replicas 1 and 3): the lower index
        assert chosen == min(read, key=lambda i: (pool[i].loaded, i))
        pairs[read] += 1
    # each of the 6 pairs 1000 times expected; 5 standard deviations (sqrt(6000 * 1/6 * 5/6) = 29) apart at most
    assert sorted(pairs) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert all(abs(c - 1000) < 5 * 29 for c in pairs.values()), pairs


def test_random_and_power_of_two_are_seeded() -> None:
    reqs = [(0.001 * i, 20, 5) for i in range(40)]
    for policy in ("random", "power_of_two"):
        a = _replicas(_inline(reqs, {"replicas": 4, "router": {"policy": policy}}, seed=1))
        b = _replicas(_inline(reqs, {"replicas": 4, "router": {"policy": policy}}, seed=1))
        c = _replicas(_inline(reqs, {"replicas": 4, "router": {"policy": policy}}, seed=2))
        assert a == b and a != c and set(a) == {0, 1, 2, 3}


def test_prefix_affinity_follows_the_cached_prefix() -> None:
    # groups 0 and 1 land on replicas 0 and 1 (a burst: least loaded); later, with both idle, group 1's
    # request comes first: round robin would send it to replica 0, prefix affinity to replica 1
    reqs = [(0.0, 100, 3, 0), (0.0, 100, 3, 1), (5.0, 100, 3, 1), (5.1, 100, 3, 0)]
    pa = _inline(reqs, {"replicas": 2, "router": {"policy": "prefix_affinity"}}, kv={"prefix_caching": True})
    rr = _inline(reqs, {"replicas": 2, "router": {"policy": "round_robin"}}, kv={"prefix_caching": True})
    assert _replicas(pa) == [0, 1, 1, 0]
    assert _replicas(rr) == [0, 1, 0, 1]
    summary = run_scenario(scenario_from_dict(pa)).summary
    # hits: each later request reuses its group's 64-token prefix (4 blocks) of a 100-token prompt
    assert summary["prefix_cache_hit_rate"] == pytest.approx(2 * 64 / 400)


def test_session_keeps_a_conversation_on_its_replica(tmp_path: Path) -> None:
    rows = [  # (ms, input, output, hash ids): conversations A (ids 0,1,2..) and B (0,5,6..); turn 2s later
        (0, 1200, 3, [0, 1, 2]), (0, 1200, 3, [0, 5, 6]),
        (10_000, 2200, 3, [0, 5, 6, 7, 8]), (10_100, 2200, 3, [0, 1, 2, 3, 4]), (10_200, 1200, 3, [0, 9, 10])]
    trace = tmp_path / "conv.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                             for t, i, o, h in rows))
    data = {**TINY, "kv_cache": {"num_gpu_blocks": 1000},
            "workload": {"trace": str(trace), "format": "mooncake"},
            "cluster": {"replicas": 2, "router": {"policy": "session"}}}
    # B's second turn goes to B's replica (1), A's to A's (0); a new conversation to the least loaded (0)
    assert _replicas(data) == [0, 1, 1, 0, 0]


def test_quickstart_four_round_robin_replicas_split_evenly_and_cut_ttft() -> None:
    path = ROOT / "scenarios/quickstart.yaml"
    one = run_scenario(load_scenario(path), check_integrity=False)
    four = run_scenario(load_scenario(path, ["cluster.replicas=4"]), check_integrity=False)
    counts = four.summary["cluster"]["requests_per_replica"]
    assert sum(counts) == 2000
    assert all(abs(c - 500) <= 5 for c in counts)       # within 1% of a quarter
    assert list(four.replicas["requests"]) == counts
    assert four.requests.groupby("replica").size().tolist() == counts
    assert four.summary["ttft_s"]["mean"] * 4 < one.summary["ttft_s"]["mean"]
    assert four.summary["cluster"]["load_imbalance"] == pytest.approx(max(counts) / 500)


def test_cluster_runs_are_deterministic() -> None:
    reqs = [(0.003 * i, 30 + 7 * (i % 5), 10 + i % 7) for i in range(60)]
    data = _inline(reqs, {"replicas": 3, "router": {"policy": "power_of_two"}}, seed=4)
    a, b = run_scenario(scenario_from_dict(data)), run_scenario(scenario_from_dict(data))
    a.summary.pop("wall_time_s")
    b.summary.pop("wall_time_s")
    assert a.summary == b.summary
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)


def test_cluster_runs_match_across_processes(tmp_path: Path) -> None:
    """The seeded and hashing routers give the same requests.csv in processes with different hash seeds."""
    import os
    import subprocess
    import sys

    import yaml

    rows = [(i * 50, 600 + 500 * (i % 3), 5, list(range(i % 4 * 10, i % 4 * 10 + 2 + i % 3))) for i in range(24)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h}) + "\n"
                             for t, n, o, h in rows))
    outs = []
    for policy in ("session", "power_of_two", "prefix_affinity"):
        for seed in ("1", "2"):
            data = {**TINY, "kv_cache": {"num_gpu_blocks": 600, "prefix_caching": True},
                    "workload": {"trace": str(trace), "format": "mooncake"},
                    "cluster": {"replicas": 3, "router": {"policy": policy}}}
            scn = tmp_path / f"{policy}.yaml"
            scn.write_text(yaml.safe_dump(data))
            out = tmp_path / f"{policy}-{seed}"
            env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
            subprocess.run([sys.executable, "-m", "sim.cli", "run", str(scn), "--out", str(out), "--no-plots"],
                           check=True, env=env, capture_output=True)
            outs.append(out)
    for a, b in zip(outs[::2], outs[1::2]):
        assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
        assert (a / "replicas.csv").read_bytes() == (b / "replicas.csv").read_bytes()
