"""Worker processes that run scenarios side by side (kvsim sweep, compare, capacity, fidelity).

A pool's workers leave Ctrl-C to the parent and exit if the parent dies (on Linux the kernel kills them,
``PR_SET_PDEATHSIG``, even inside the compiled core's long native calls; each also watches its parent's pid);
when the parent stops early (an error, Ctrl-C, SIGTERM: any exception out of ``worker_pool``'s block, or
``stop_pool``) the workers are terminated at once rather than after their current run, and what had not
started is cancelled. A block that ends normally waits for its workers to finish.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any


def require_ray() -> None:
    """Refuse ``--ray`` where Ray is not installed (sweep checks it before making its out folder)."""
    if importlib.util.find_spec("ray") is None:
        from sim.errors import KvsimError

        raise KvsimError("--ray", "Ray is not installed; install it with: pip install 'kvsim[ray]'")


def worker_init(parent: int) -> None:
    """In each worker: leave Ctrl-C to the parent (it stops the pool), and exit if the parent dies."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler (forked): terminate() must kill
    if os.getppid() == parent:
        _die_with_parent()

    def watch() -> None:
        import time

        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), even in the
    middle of a native call that holds the GIL (the compiled core), where the watching thread cannot run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):   # (no libc prctl: the watching thread alone)
        pass


def new_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes with ``worker_init`` (stop it with ``stop_pool`` on an early exit)."""
    return ProcessPoolExecutor(max_workers=workers, initializer=worker_init, initargs=(os.getpid(),))


def stop_pool(pool: Any) -> None:
    """Cancel what has not started and terminate the workers now (not after their current run)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``new_pool(workers)`` for the block: stopped at once if the block raises, else shut down after its
    workers finish."""
    pool = new_pool(workers)
    try:
        yield pool
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
