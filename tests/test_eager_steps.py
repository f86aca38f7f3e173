"""Eager single steps (sim/engine.py): a step that ends before the next arrival is applied without a SimPy
event. The engine waits on fewer events, and the results are those of one timeout per step, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import simpy
from result_compare import assert_same

from sim.cluster.replica import build_replica
from sim.engine import Engine
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def run_both(path: Path, overrides: list[str], monkeypatch) -> tuple[Result, Result]:
    """The scenario with eager steps on, then off."""
    out = []
    for eager in (True, False):
        monkeypatch.setattr(Engine, "eager_steps", eager)
        out.append(run_scenario(load_scenario(path, overrides), check_integrity=True))
    return out[0], out[1]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("multi_step", [False, True])
def test_eager_steps_change_nothing(multi_step, async_scheduling, monkeypatch):
    eager, plain = run_both(ROOT / "scenarios" / "quickstart.yaml",
                            ["workload.limit=120", f"scheduler.multi_step={multi_step}",
                             f"scheduler.async_scheduling={async_scheduling}"], monkeypatch)
    assert_same(eager, plain)
    waits, plain_waits = eager.profile["engine_waits"], plain.profile["engine_waits"]
    if multi_step:
        assert waits < plain_waits   # chains of runs that end before the next arrival wait on nothing
    else:
        assert plain_waits == plain.profile["steps"]   # one timeout per step
        assert waits < plain_waits // 2   # most steps took none


@pytest.mark.parametrize("policy", ["round_robin", "least_requests"])
def test_cluster_eager_steps_change_nothing(policy, monkeypatch):
    path = ROOT / "scenarios" / "cluster_round_robin.yaml"
    # 1,500 blocks a replica, not the 3,617 the memory gives (the check after every step is O(blocks)): the
    # busiest replica peaks near 1,000, so nothing is preempted and only the KV usage columns change
    eager, plain = run_both(path, ["workload.limit=150", "scheduler.multi_step=false", "kv_cache.num_gpu_blocks=1500",
                                   f"cluster.router.policy={policy}"], monkeypatch)
    assert eager.summary["num_preemptions"] == 0 and eager.replicas["kv_usage_max"].max() > 0.5
    assert_same(eager, plain)
    pd.testing.assert_frame_equal(eager.replicas, plain.replicas, check_exact=True)


def test_disaggregated_pools_step_with_events():
    scn = load_scenario(ROOT / "scenarios" / "cluster_round_robin.yaml", ["workload.limit=10"])
    env = simpy.Environment()
    roles = {role: build_replica(scn, 0, role, env, False, 0.0).engine.eager_steps
             for role in ("colocated", "prefill", "decode")}
    assert roles == {"colocated": True, "prefill": False, "decode": False}
