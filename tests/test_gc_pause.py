"""The cyclic collector is off while kvsim runs a scenario (sim/gc_pause.py), and as it was after."""

from __future__ import annotations

import gc
import threading

import pytest

from sim.gc_pause import gc_paused


@pytest.fixture
def collector():
    """Restores the collector's state however a test leaves it."""
    before = gc.isenabled()
    yield
    (gc.enable if before else gc.disable)()


@pytest.mark.parametrize("before", [True, False])
def test_off_inside_and_as_it_was_after_even_on_an_error(collector, before):
    (gc.enable if before else gc.disable)()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is before
    with pytest.raises(KeyError), gc_paused():
        {}["missing"]
    assert gc.isenabled() is before


def test_an_explicit_collection_still_collects_inside(collector):
    gc.enable()
    with gc_paused():
        a: list = []
        a.append(a)   # a cycle only the collector can free
        del a
        assert gc.collect() >= 1


def test_overlapping_blocks_switch_it_back_once_the_last_one_ends(collector):
    """Two runs in threads, the first to start ends first: the collector stays off until the second
    ends (a plain save-and-restore in each would switch it on under the second run)."""
    gc.enable()
    second_in, first_out, seen = threading.Event(), threading.Event(), []

    def second():
        with gc_paused():
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())   # the first block has ended; this one is still open

    t = threading.Thread(target=second)
    with gc_paused():
        t.start()
        second_in.wait()
    first_out.set()
    t.join()
    assert seen == [False] and gc.isenabled()


@pytest.mark.parametrize("core", [True, False], ids=["compiled-core", "simpy-loop"])
def test_run_scenario_runs_its_engine_without_the_collector(collector, monkeypatch, tmp_path, core):
    import sim.engine_core
    import sim.runner
    from sim import run_scenario, scenario_from_dict
    from sim.engine import Engine

    monkeypatch.setattr(sim.engine_core, "enabled", core)
    gc.enable()
    seen = []

    def watched(run):
        def wrapper(*args, **kwargs):
            seen.append(gc.isenabled())
            return run(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(Engine, "run", watched(Engine.run))
    monkeypatch.setattr(sim.runner, "run_core", watched(sim.runner.run_core))
    scn = scenario_from_dict({"name": "t", "model": "llama-2-7b", "hardware": "a100-80gb", "workload": {
        "synthetic": {"num_requests": 4, "prompt_len": {"dist": "fixed", "value": 32},
                      "output_len": {"dist": "fixed", "value": 8}}}}, base_dir=tmp_path)
    result = run_scenario(scn, check_integrity=False)
    assert seen == [False] and gc.isenabled()
    assert result.summary["num_finished"] == 4 and result.profile["compiled_core"] is core


def test_the_runs_cycles_are_freed_before_it_returns(collector, simpy_loop, tmp_path):
    """The engine and its SimPy processes refer to each other; the run frees them itself (a young
    collection: everything it made is young, the collector having been off), even for a caller that
    keeps the collector off."""
    import simpy

    from sim import run_scenario, scenario_from_dict

    gc.collect()
    gc.disable()

    def environments() -> int:   # (another test of this process may hold one of its own)
        return sum(isinstance(o, simpy.Environment) for o in gc.get_objects())

    before = environments()
    scn = scenario_from_dict({"name": "t", "model": "llama-2-7b", "hardware": "a100-80gb", "workload": {
        "synthetic": {"num_requests": 6, "prompt_len": {"dist": "fixed", "value": 32},
                      "output_len": {"dist": "fixed", "value": 8}}}}, base_dir=tmp_path)
    result = run_scenario(scn, check_integrity=False)
    assert result.summary["num_finished"] == 6 and not result.profile["compiled_core"]
    assert environments() == before
