"""Test-wide settings: every simulation checks all KV invariants after every step."""

import gc
import os

import pytest

os.environ.setdefault("KVSIM_CHECK_INTEGRITY", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_finish(session):
    """Keep the cyclic garbage collector off the objects the collected test modules imported (torch,
    triton, pandas, matplotlib: ~300,000 of them): every full collection would walk them all, and the
    simulations trigger thousands (a fuzz batch ran 3x slower after collection than alone)."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session, exitstatus):
    """Hand the frozen objects back, so that the interpreter's exit frees them as usual."""
    gc.unfreeze()
    gc.collect()


@pytest.fixture
def simpy_loop(monkeypatch):
    """Every scenario runs the SimPy engine loop (sim/engine.py), the compiled core off
    (sim/engine_core.py): for the tests of the loop's own paths (decode runs, the decode lane, eager
    steps, the blocked head, the compiled loops), which the core would otherwise stand in for."""
    import sim.engine_core

    monkeypatch.setattr(sim.engine_core, "enabled", False)
