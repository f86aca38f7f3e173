"""run_scenario(keep_steps=False): no per-step table, and the same summary to the bit (read from the few columns
it needs), the same requests and replicas tables, on the compiled core and the SimPy loop, single engines and
clusters (colocated, disaggregated, behind a client)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import sim.engine_core as engine_core
from sim.output import summary_json
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCN = Path(__file__).resolve().parents[1] / "scenarios"


def _same_without_steps(path: Path, *overrides: str) -> None:
    kept, bare = (run_scenario(load_scenario(path, list(overrides)), check_integrity=False, keep_steps=keep)
                  for keep in (True, False))
    assert bare.steps is None and kept.steps is not None and len(kept.steps) == kept.summary["num_steps"]
    a, b = dict(kept.summary), dict(bare.summary)
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert summary_json(a) == summary_json(b)
    pd.testing.assert_frame_equal(kept.requests, bare.requests, check_exact=True)
    if getattr(kept, "replicas", None) is not None:
        pd.testing.assert_frame_equal(kept.replicas, bare.replicas, check_exact=True)


@pytest.mark.parametrize("name, overrides", [
    ("quickstart.yaml", ["workload.limit=400"]),                                   # one engine, in the core
    ("cpu_offload.yaml", ["workload.limit=60"]),                                   # a host tier
    ("cluster_round_robin.yaml", ["workload.limit=400"]),                          # replicas, in the core
    ("cluster_disaggregated.yaml", ["workload.limit=200"]),                        # pools, in the core
    ("concurrency_sweep.yaml", ["workload.synthetic.num_requests=200", "cluster.replicas=2"]),   # a client
])
def test_the_summary_is_the_same_without_the_step_table(name, overrides):
    _same_without_steps(SCN / name, "output.plots=false", *overrides)


def test_the_simpy_loop_too(monkeypatch):
    monkeypatch.setattr(engine_core, "enabled", False)
    _same_without_steps(SCN / "quickstart.yaml", "output.plots=false", "workload.limit=200")
    _same_without_steps(SCN / "beam_search.yaml", "output.plots=false", "workload.synthetic.num_requests=40")
