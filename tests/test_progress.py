"""The progress bar: on by default only on a terminal and for long runs; --quiet silences it; never in pipes."""

from __future__ import annotations

import argparse
import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from sim.commands.progress import LONG_RUN_S, progress_mode

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "scenarios" / "seed_four_requests.yaml")
HIDE_CURSOR = b"\x1b[?25l"  # what a live display writes first on a terminal


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("progress, quiet, stream, expected", [
    (False, False, _Tty(), (True, LONG_RUN_S)), (False, False, io.StringIO(), (False, 0.0)),
    (True, False, io.StringIO(), (True, 0.0)), (False, True, _Tty(), (False, 0.0)),
])
def test_progress_mode(progress, quiet, stream, expected):
    assert progress_mode(argparse.Namespace(progress=progress, quiet=quiet), stream) == expected


def _stderr_on_a_terminal(*args: str) -> bytes:
    """Run kvsim with stderr on a pseudo-terminal; what it wrote there."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    return out


def test_terminal_shows_the_bar_with_progress_and_not_for_a_short_run():
    assert HIDE_CURSOR in _stderr_on_a_terminal("run", SEED, "--progress")
    assert _stderr_on_a_terminal("run", SEED) == b""          # shorter than LONG_RUN_S
    assert _stderr_on_a_terminal("run", SEED, "--quiet") == b""


def test_pipes_get_no_bar():
    r = subprocess.run([sys.executable, "-m", "sim.cli", "run", SEED], cwd=ROOT, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stderr == b""
