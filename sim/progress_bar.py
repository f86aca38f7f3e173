"""A progress bar over a run's finished requests, on stderr (stdout stays the results).

It appears only once the run has lasted ``after_s`` seconds of wall time, so short runs show none. The
engines report how many requests have finished or been rejected: the compiled core every few hundred steps
(``at``), the SimPy loop after each step of any engine (``stepper``: the count is read every
``EVERY`` steps).

Invariant: what it shows never exceeds ``total`` and never goes back (the count only grows).
"""

from __future__ import annotations

import time
from collections.abc import Callable

EVERY = 500   # SimPy loop steps between two reads of the count


class ProgressBar:
    """A rich progress bar over ``total`` requests (the module docstring)."""

    def __init__(self, total: int, after_s: float = 0.0) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self._p = Progress(console=Console(stderr=True), transient=True)
        self._task = self._p.add_task("simulating", total=total)
        self._start_at = time.perf_counter() + after_s
        self._started = False
        self._n = 0
        if after_s <= 0:
            self._show()

    def _show(self) -> None:
        self._p.start()
        self._started = True

    def stepper(self, done: Callable[[], int]) -> Callable[[int], None]:
        """An engine's ``on_step``: after every ``EVERY`` steps (of all the engines it is given to), the bar
        shows ``done()`` requests as done."""
        def on_step(_step: int) -> None:
            self._n += 1
            if self._n % EVERY == 0:
                self.at(done())
        return on_step

    def at(self, done: int) -> None:
        """``done`` requests have finished or been rejected (shown once the bar's delay has passed)."""
        if not self._started and time.perf_counter() >= self._start_at:
            self._show()
        if self._started:
            self._p.update(self._task, completed=done)

    def close(self) -> None:
        if self._started:
            self._p.stop()
