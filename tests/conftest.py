"""Test-wide settings: every simulation checks all KV invariants after every step."""

import gc
import os

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
