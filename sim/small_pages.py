"""Large numpy arrays on ordinary pages while kvsim builds its result tables.

numpy asks Linux for transparent huge pages on every array of 4 MiB or more (``madvise``). Where the
kernel then compacts memory to find 2 MiB pages (``defrag: madvise``, the common default), filling fresh
arrays gets several times slower and erratic: the per-step tables of an 8-replica cluster took 0.5-0.7 s
to build instead of 0.2 s (benchmarks/cluster_bench.py). Inside ``small_pages()`` numpy does not ask;
its setting is restored when the last block open in the process is left (runs in several threads
overlap: the first one in saves the setting, the last one out restores it). A user's own
``NUMPY_MADVISE_HUGEPAGE`` is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from sim.process_switch import ProcessSwitch


def _switch():
    """numpy's huge-page switch (it returns the previous setting), or None where this numpy has none."""
    return getattr(getattr(np, "_core", np).multiarray, "_set_madvise_hugepage", None)


# numpy's setting before the first block is kept and restored after the last (sim/process_switch.py)
_advice = ProcessSwitch(lambda: _switch()(False), lambda saved: _switch()(saved))


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's huge-page advice off inside the block (where this numpy has the switch and the user has
    not chosen through ``NUMPY_MADVISE_HUGEPAGE``)."""
    if _switch() is None or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        yield
        return
    with _advice.block():
        yield
