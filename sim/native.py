"""kvsim's optional compiled loops (sim/csrc/*.c, the extension ``sim._native`` that ``pip install``
builds): ``native`` is the module, or None where it was not built or ``KVSIM_NATIVE=0`` turns it off.
Every caller keeps a numpy or Python path with the same results bit for bit (tests/test_native.py
compares them); the compiled one saves the cost of numpy's calls on a decode run's short arrays and of
Python loops over its requests and blocks."""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("KVSIM_NATIVE", "1") == "0":
        return None
    try:
        from sim import _native
    except ImportError:
        return None
    return _native


native = _load()
