"""Where the SimPy engine loop's time goes: wall time per call of the functions a step or a decode run goes
through (the loop that runs what the compiled core, sim/engine_core.py, does not cover; the core is off here).

    python benchmarks/step_breakdown.py                         # the Azure conversation hour (engine_bench's)
    python benchmarks/step_breakdown.py --workload quickstart   # the quickstart settings over the hour
    python benchmarks/step_breakdown.py --synthetic 20000       # synthetic requests at --rate (req/s)

Runs the scenario twice in this process: once plain (the simulate time to compare with), once with a timer
wrapped around each function below. Times are inclusive (a function's callees count in it too; the
rows are grouped by where they are called from) and carry the wrappers' own cost, a fraction of a
microsecond a call: the wrapped run's simulate time shows how much.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from engine_bench import ROOT, add_workload_args, workload_data

import sim.engine_core as engine_core
from sim import run_scenario, scenario_from_dict
from sim.executors.cost_model import CostModelExecutor
from sim.kv.manager import KVCacheManager
from sim.metrics import Recorder
from sim.sched.base import SchedulerBase
from sim.sched.continuous import ContinuousScheduler
from sim.sched.decode_run import DecodeRunner
from sim.sched.decode_run_apply import DecodeRunApplier

# (group, class, method): the single step's parts, a decode run's, and pieces both use
TIMED: list[tuple[str, type, str]] = [
    ("single step", ContinuousScheduler, "schedule"),
    ("single step", ContinuousScheduler, "_take_lane"),
    ("single step", ContinuousScheduler, "_admit"),
    ("single step", CostModelExecutor, "execute"),
    ("single step", SchedulerBase, "update"),
    ("single step", SchedulerBase, "_update_lane"),
    ("single step", Recorder, "record_step"),
    ("decode run", DecodeRunner, "plan"),
    ("decode run", DecodeRunner, "plan_next"),
    ("decode run", DecodeRunner, "_price_steps"),
    ("decode run", DecodeRunApplier, "apply"),
    ("decode run", DecodeRunApplier, "_allocate_blocks"),
    ("decode run", DecodeRunApplier, "_gaps"),
    ("decode run", Recorder, "record_run"),
    ("either", ContinuousScheduler, "_finish"),
    ("either", KVCacheManager, "allocate_slots"),
    ("either", KVCacheManager, "free"),
]


def _timed(fn: Callable, tally: list[float]) -> Callable:
    """``fn`` with its calls counted and their wall time summed into ``tally`` ([calls, seconds])."""
    clock = time.perf_counter

    def wrapper(*args, **kwargs):
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            tally[0] += 1
            tally[1] += clock() - t

    wrapper.__wrapped__ = fn
    return wrapper


def breakdown(data: dict) -> tuple[float, float, int, int, list[tuple[str, str, int, float]]]:
    """(plain simulate s, wrapped simulate s, steps, decode runs, [(group, function, calls, seconds)]), the
    compiled core off."""
    def simulate() -> dict:
        core, engine_core.enabled = engine_core.enabled, False
        try:
            return run_scenario(scenario_from_dict(data, base_dir=ROOT / "scenarios"), check_integrity=False).profile
        finally:
            engine_core.enabled = core

    plain = simulate()["simulate_s"]
    tallies: list[list[float]] = []
    originals = []
    for _, cls, name in TIMED:
        fn = cls.__dict__[name]
        tally = [0, 0.0]
        tallies.append(tally)
        originals.append((cls, name, fn))
        setattr(cls, name, _timed(fn, tally))
    try:
        profile = simulate()
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
    rows = [(group, f"{cls.__name__}.{name}", int(t[0]), t[1]) for (group, cls, name), t in zip(TIMED, tallies)]
    return plain, profile["simulate_s"], profile["steps"], profile["decode_runs"], rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    args = ap.parse_args()
    data = workload_data(args)
    plain, wrapped, steps, runs, rows = breakdown(data)
    print(f"{data['name']}: {steps:,} steps, {runs:,} decode runs; simulate {plain:.2f} s plain, "
          f"{wrapped:.2f} s with the timers")
    print(f"{'group':<12} {'function':<38} {'calls':>9} {'total s':>8} {'us/call':>8} {'share':>6}")
    for group, name, calls, secs in rows:
        per = secs / calls * 1e6 if calls else 0.0
        print(f"{group:<12} {name:<38} {calls:>9,} {secs:>8.3f} {per:>8.1f} {secs / wrapped:>6.1%}")


if __name__ == "__main__":
    main()
