"""A process-wide setting switched for as long as any of several overlapping blocks is open.

Runs in several threads overlap (a sweep's workers, a notebook's threads): a plain save-and-restore in
each block would switch the setting back under a block still open. ``ProcessSwitch`` switches it when the
first block opens (keeping what ``switch_off`` returns) and restores it (``restore(kept)``) when the last
one closes, error or not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ProcessSwitch:
    """``switch_off()`` -> what to restore, called as the first block opens; ``restore(kept)`` as the last
    one closes."""

    def __init__(self, switch_off: Callable[[], Any], restore: Callable[[Any], None]) -> None:
        self._switch_off, self._restore = switch_off, restore
        self._lock = threading.Lock()
        self._open = 0          # blocks open in this process
        self._kept: Any = None  # what the first of them kept

    @contextmanager
    def block(self) -> Iterator[None]:
        with self._lock:
            if self._open == 0:
                self._kept = self._switch_off()
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._restore(self._kept)
