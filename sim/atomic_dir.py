"""A results folder replaced as a whole: a kill at any moment leaves the old folder or the new one, never a mix.

    1. the new files are written into a staging folder beside ``out``: ``.<name>.kvsim-staging-<pid>-*``
    2. the staging folder and ``out`` swap names in one ``renameat2(RENAME_EXCHANGE)`` (Linux); where that
       call is missing, ``out`` is renamed to ``.<name>.kvsim-old-<pid>``, the staging folder to ``out``
    3. the old folder (now under the staging or backup name) is deleted.

Debris of a killed writer (a staging or backup folder whose pid is dead) is cleaned by the next write,
or by ``recover``: a backup left between the two renames of step 2 is renamed back to ``out``.

Only a folder kvsim made (it holds the ``.kvsim-results`` marker), an empty folder or a missing one is
replaced: replacing a folder moves everything in it, so other folders (``--out .``) are refused.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sim.errors import KvsimError

MARKER = ".kvsim-results"
_DEBRIS = re.compile(r"^\.(?P<name>.+)\.kvsim-(?P<kind>staging|old)-(?P<pid>\d+)(-.*)?$")
_LEGACY_STAGING = ".kvsim-staging-"  # kvsim <= 0.x staged inside the results folder


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(out: Path) -> None:
    """Clean what a killed writer of ``out`` left: restore a backup if ``out`` is missing, delete the rest."""
    parent = out.parent
    if not parent.is_dir():
        return
    for entry in parent.iterdir():
        m = _DEBRIS.match(entry.name)
        if not m or m["name"] != out.name or _pid_alive(int(m["pid"])):
            continue
        if m["kind"] == "old" and not out.exists():
            os.rename(entry, out)
        else:
            shutil.rmtree(entry, ignore_errors=True)
    if out.is_dir():
        for entry in out.iterdir():
            if entry.name.startswith(_LEGACY_STAGING) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)


_LEGACY_SUFFIXES = (".json", ".csv", ".png", ".html", ".parquet")  # what kvsim run wrote before the marker existed


def is_replaceable(out: Path) -> tuple[bool, str]:
    """(True, "") for a missing, empty or kvsim-made folder (the marker, or an older kvsim's results: a
    summary.json beside only .json/.csv/.png files); else (False, a name found in it)."""
    if not out.exists():
        return True, ""
    entries = [e for e in out.iterdir() if not e.name.startswith(_LEGACY_STAGING)]
    names = [e.name for e in entries]
    if not names or MARKER in names:
        return True, ""
    if "summary.json" in names and all(e.is_file() and e.suffix in _LEGACY_SUFFIXES for e in entries):
        return True, ""
    foreign = [e.name for e in entries if not (e.is_file() and e.suffix in _LEGACY_SUFFIXES)]
    return False, sorted(foreign or names)[0]


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the names of two paths (Linux renameat2); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(out: Path, fill: Callable[[Path], list[str]]) -> list[Path]:
    """Make a new ``out``: ``fill(stage)`` writes files into an empty staging folder and returns their names;
    then the staging folder replaces ``out`` as a whole (see the module docstring)."""
    stage = new_stage(out)
    try:
        names = fill(stage)
        commit_stage(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return [Path(out) / n for n in names]


def new_stage(out: Path) -> Path:
    """An empty staging folder for a new ``out`` (cleaned by ``recover`` if this process dies before
    ``commit_stage``); the caller removes it on failure."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)
    ok, other = is_replaceable(out)
    if not ok:
        raise KvsimError(str(out), f"holds files kvsim did not write ({other!r}); give a new or empty folder")
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.kvsim-staging-{os.getpid()}-", dir=out.parent))


def commit_stage(stage: Path, out: Path) -> None:
    """Put the filled ``stage`` in the place of ``out`` in one step (the old folder, if any, is deleted)."""
    out = Path(out)
    (stage / MARKER).write_text("a folder of kvsim results, replaced as a whole on each run\n")
    if not out.exists():
        os.rename(stage, out)
    elif _exchange(stage, out):
        shutil.rmtree(stage, ignore_errors=True)  # the old results, under the staging name
    else:
        backup = out.parent / f".{out.name}.kvsim-old-{os.getpid()}"
        os.rename(out, backup)
        try:
            os.rename(stage, out)
        except BaseException:
            os.rename(backup, out)
            raise
        shutil.rmtree(backup, ignore_errors=True)
