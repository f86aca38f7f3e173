"""``cluster.replicas: 1`` is the single engine: the same summary.json, byte for byte (wall_time_s aside),
on every shipped scenario (each cut to its first requests to stay fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.output import summary_json
from sim.runner import run_scenario
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
# not compared: a sweep file (no workload of its own), the GPU executor on CPU, timed by the wall
# clock (two runs of it differ whatever the path); and a data-parallel engine, whose replicas are the ranks of
# one engine (one rank alone does not hold DeepSeek-V3: tests/test_data_parallel.py checks its ranks)
NOT_SCENARIOS = {"sweep_example.yaml", "quickstart_gpu_cpu.yaml", "data_parallel.yaml"}
SCENARIOS = sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml") if p.name not in NOT_SCENARIOS)
CUT = ["workload.limit=60"]


def _summary(name: str, extra: list[str]) -> str:
    scn = load_scenario(ROOT / "scenarios" / name, CUT + extra)
    summary = dict(run_scenario(scn, check_integrity=False).summary)   # speed: no per-step checks
    summary.pop("wall_time_s")
    return summary_json(summary)


@pytest.mark.parametrize("name", SCENARIOS)
def test_one_replica_is_the_single_engine(name: str) -> None:
    single = _summary(name, ["cluster=null"])             # the shipped cluster scenarios too, as one engine
    one = _summary(name, ["cluster={replicas: 1}"])
    assert one == single
    assert "cluster" not in json.loads(one)


def test_one_replica_with_router_overhead_delays_arrivals() -> None:
    """A router overhead only shifts when the engine sees each request: TTFT grows, never shrinks."""
    base = load_scenario(ROOT / "scenarios/quickstart.yaml", ["workload.limit=40", "cluster.replicas=1"])
    slow = load_scenario(ROOT / "scenarios/quickstart.yaml", ["workload.limit=40", "cluster.replicas=1",
                                                               "cluster.router.overhead_s=0.5"])
    a, b = run_scenario(base).requests, run_scenario(slow).requests
    assert (b["ttft_s"] >= a["ttft_s"] + 0.5 - 1e-9).all()


@pytest.mark.parametrize("name", ["cluster_round_robin.yaml", "cluster_prefix_affinity.yaml",
                                  "cluster_disaggregated.yaml"])
def test_replicas_sharing_one_cost_model_give_the_same_results(name: str, monkeypatch) -> None:
    """The replicas of a pool share one cost-model executor (a pure pricer: only its price memos are
    shared); results are those of one executor a replica, byte for byte."""
    from sim.cluster import replica
    from sim.executors.cost_model import CostModelExecutor

    built = []
    build = replica.build_replica

    def counting(*args, **kwargs):
        rep = build(*args, **kwargs)
        built.append(rep)
        return rep

    monkeypatch.setattr(replica, "build_replica", counting)
    shared = _summary(name, [])
    pools = {r.role: {id(p.engine.executor) for p in built if p.role == r.role} for r in built}
    assert all(len(ids) == 1 for ids in pools.values()) and len(built) > len(pools)
    built.clear()
    monkeypatch.setattr(CostModelExecutor, "shareable", False)
    assert _summary(name, []) == shared
    assert len({id(p.engine.executor) for p in built}) == len(built)   # (one each)


def test_one_replica_has_the_single_engines_timeline_frontend_included():
    """The timeline too: each request's frontend interval (arrival to arrival + the frontend's input
    latency) comes first, then the same states, in a cluster of one replica as in the single engine."""
    quick = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"
    scn = load_scenario(quick, ["workload.limit=200"])
    one = run_scenario(scn).timeline
    cluster = run_scenario(load_scenario(quick, ["workload.limit=200", "cluster={replicas: 1}"])).timeline
    assert one.equals(cluster)
    front = one[one["phase"] == "frontend"]
    fe_in = scn.frontend.latencies()[0]
    assert fe_in > 0 and len(front) == 200
    assert ((front["end_s"] - front["start_s"]) - fe_in).abs().max() < 1e-12
