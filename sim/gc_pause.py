"""Python's cyclic garbage collector paused while kvsim runs a scenario.

An engine run allocates and frees containers at every step (plans, lists, small tuples); each time
allocations outrun frees by 700 the collector scans the young objects, and now and then every object
alive (a million requests in a large run). A run makes almost no cyclic garbage (reference counting
frees the rest: about a thousand objects over 50,000 requests, `gc.get_stats()`), so those scans find
nothing; they cost 2-3% of the Azure hour's engine time (measured with ``gc.callbacks``). Inside
``gc_paused()`` the collector does not run; it is switched back on when the last block open in the
process is left (runs in several threads overlap: the first one in notes whether it was on, the last
one out restores that); the collector's next pass takes the few cycles made meanwhile. A caller that keeps it off keeps it off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from sim.process_switch import ProcessSwitch


def _collector_off() -> bool:
    was = gc.isenabled()
    gc.disable()
    return was


_collector = ProcessSwitch(_collector_off, lambda was: gc.enable() if was else None)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (see the module docstring); explicit ``gc.collect()``
    still works."""
    with _collector.block():
        yield
