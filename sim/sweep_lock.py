"""One sweep at a time per results folder: an exclusive ``flock`` on ``<out>/.kvsim-sweep.lock``.

The kernel releases the lock when its holder exits, however it exits (even SIGKILL), so a stale lock
file never blocks a later sweep. A second sweep on the same folder refuses with one line. The holder
removes the file before releasing it; a sweep that locked a file just removed (its inode is no longer
the path's) tries again on the new one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sim.errors import KvsimError

LOCK_NAME = ".kvsim-sweep.lock"


class SweepLock:
    """``with SweepLock(out_dir):`` holds the folder's lock for the block, or raises KvsimError."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        for _ in range(100):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise KvsimError(str(self.path.parent), f"another kvsim sweep (pid {holder}) is writing this "
                                 "folder; wait for it to finish or use another out folder") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._fd = fd
                return self
            os.close(fd)  # the holder removed it between our open and our lock: take the new file
        raise KvsimError(str(self.path), "cannot take the sweep lock")

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise KvsimError(str(self.path.parent), f"cannot write the results folder: {e.strerror or e}") from None

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # still locked: nobody can take it between unlink and close
            os.close(self._fd)
            self._fd = None
