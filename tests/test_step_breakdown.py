"""benchmarks/step_breakdown.py counts what the engine did (one apply a decode run, one free a finished
request) and leaves the timed classes as they were."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import step_breakdown  # noqa: E402
from engine_bench import synthetic_scenario  # noqa: E402

from sim.sched.continuous import ContinuousScheduler  # noqa: E402
from sim.sched.decode_run_apply import DecodeRunApplier  # noqa: E402


def test_counts_match_the_run_and_the_classes_are_restored():
    before = {(cls, name): cls.__dict__[name] for _, cls, name in step_breakdown.TIMED}
    data = synthetic_scenario(300, 2.0)   # light load: decode runs between arrivals, no preemption
    plain, wrapped, steps, runs, rows = step_breakdown.breakdown(data)
    calls = {name: n for _, name, n, _ in rows}
    assert runs > 0 and calls["DecodeRunApplier.apply"] == runs
    assert calls["KVCacheManager.free"] == 300             # each request's blocks freed once, when it finishes
    # every step is a single step (schedule) or a step of a run; a run has at least one step
    assert 0 < calls["ContinuousScheduler.schedule"] <= steps - runs
    assert plain > 0 and wrapped > 0 and all(secs >= 0 for *_, secs in rows)
    assert {(cls, name): cls.__dict__[name] for _, cls, name in step_breakdown.TIMED} == before
    assert not hasattr(ContinuousScheduler.schedule, "__wrapped__")
    assert not hasattr(DecodeRunApplier.apply, "__wrapped__")
