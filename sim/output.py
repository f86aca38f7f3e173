"""Atomic result writing: every file goes to a temporary name in the target folder, then is renamed.

An interrupted run (Ctrl-C, an exception) writes nothing, so the previous results stay intact;
a finished run replaces each file in one rename.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import KvsimError


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def flatten(summary: dict, prefix: str = "") -> dict[str, Any]:
    """{'ttft_s': {'p99': x}} -> {'ttft_s.p99': x}: one flat row of a summary, for tables."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def summary_json(summary: dict) -> str:
    """summary.json text: sorted keys, NaN as null, fixed formatting (byte-stable for the same run)."""
    return json.dumps(_clean(summary), indent=2, sort_keys=True) + "\n"


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """Write a DataFrame with pyarrow: Parquet for ``.parquet`` (typed, compressed, fast), else CSV
    (pyarrow's writer: a header row, NaN as an empty field, strings quoted only when needed).
    Read back with ``pandas.read_parquet`` / ``pandas.read_csv``."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    else:
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
    return path


def write_atomic(path: Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp)`` then rename tmp to ``path``; the tmp file is removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text))


def prepare_out_dir(out: str | Path) -> Path:
    """Check, before anything runs, that ``out`` is (or can be made) a folder this process may write."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise KvsimError(str(path), "--out must be a folder, and this is a file")
    probe = path
    while not probe.exists():  # the nearest existing ancestor must be a writable folder
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise KvsimError(str(path), f"--out: {probe} is a file, so no folder can be made under it")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise KvsimError(str(path), f"--out: no permission to write in {probe}")
    if path.exists() and not os.access(path.parent if path.parent.exists() else path, os.W_OK | os.X_OK):
        raise KvsimError(str(path), f"--out: no permission to write in {path.parent}")
    return path


def prepare_results_dir(out: str | Path) -> Path:
    """``prepare_out_dir`` for a folder replaced as a whole (sim.atomic_dir): also cleans what a killed
    earlier run left, and refuses a folder holding files kvsim did not write."""
    from sim.atomic_dir import is_replaceable, recover

    path = prepare_out_dir(out)
    recover(path)
    ok, other = is_replaceable(path)
    if not ok:
        raise KvsimError(str(path), f"--out holds files kvsim did not write ({other!r}); the folder is replaced "
                         "as a whole, so give a new or empty folder")
    return path
