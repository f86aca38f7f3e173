"""Worker pools (sim/worker_pool.py) stop at once when their parent stops early: kvsim compare, capacity
and fidelity share the pool kvsim sweep has (whose own signal tests are in tests/test_sweep_reliability.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep_reliability import _all_gone, wait_for_workers

import sim.cluster.capacity as capacity
from sim.worker_pool import worker_pool

ROOT = Path(__file__).resolve().parent.parent


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_block_that_ends_waits_for_its_results():
    with worker_pool(2) as pool:
        assert list(pool.map(_nap, [0.05, 0.0, 0.02])) == [0.05, 0.0, 0.02]


def test_an_exception_in_the_block_stops_the_workers_now():
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), worker_pool(2) as pool:
        for _ in range(3):
            pool.submit(_nap, 60)
        time.sleep(0.5)
        procs = list(pool._processes.values())
        raise KeyboardInterrupt
    assert time.monotonic() - started < 20 and _all_gone([p.pid for p in procs], 10)


def _long_nap(data, base_dir, source, slos):
    time.sleep(60)


def test_the_capacity_runner_stops_its_pool_on_an_error(monkeypatch):
    monkeypatch.setattr(capacity, "evaluate", _long_nap)
    run = capacity.parallel_runner(".", "<test>", [], workers=2)
    started = time.monotonic()
    procs = []

    def interrupt(signum, frame):   # (Ctrl-C while the workers run: their processes noted first)
        procs.extend(run._pool._processes.values())
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            run([{"x": 1}, {"x": 2}])
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert run._pool is None and time.monotonic() - started < 20 and procs
    assert _all_gone([p.pid for p in procs], 10)


def test_sigterm_stops_compare_and_its_workers_at_once_with_one_line(tmp_path):
    # two disaggregated runs of 20,000 requests in the SimPy loop (KVSIM_CORE=0: ~17 s each here); SIGTERM a
    # second after the workers start: compare ends within seconds, not after the runs
    out = tmp_path / "cmp"
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli", "compare", str(ROOT / "scenarios" / "cluster_disaggregated.yaml"),
                             "--vary", "cluster.kv_transfer.mode=pull,push", "--set", "workload.limit=20000",
                             "--workers", "2", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), KVSIM_CORE="0"))
    kids = wait_for_workers(proc)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    rc = proc.wait(timeout=60)
    assert time.monotonic() - sent < 8, "compare waited for its runs"
    err = proc.stderr.read().strip()
    assert rc == 143 and err.splitlines() == [err] and err.startswith("error: terminated (SIGTERM)"), err
    assert _all_gone(kids, 10), "workers outlived compare"
    assert not out.exists()
