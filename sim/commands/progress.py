"""When to show a progress bar: by default only on a terminal and only for long runs.

``--progress`` shows it at once, ``--quiet`` never; otherwise it appears when stderr is a terminal and the
run has lasted ``LONG_RUN_S`` seconds of wall time. Pipes, files and CI logs (stderr not a terminal) get none.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

LONG_RUN_S = 2.0


def add_progress_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", action="store_true",
                   help="show a progress bar at once (default: only on a terminal, once a run lasts "
                        f"{LONG_RUN_S:g} s)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def progress_mode(args: argparse.Namespace, stream: TextIO | None = None) -> tuple[bool, float]:
    """(show a bar, after how many seconds of wall time) for these arguments and this stderr."""
    if getattr(args, "quiet", False):
        return False, 0.0
    if getattr(args, "progress", False):
        return True, 0.0
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return (True, LONG_RUN_S) if tty else (False, 0.0)
