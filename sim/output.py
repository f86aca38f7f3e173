"""Atomic result writing: every file goes to a temporary name in the target folder, then is renamed.

An interrupted run (Ctrl-C, an exception) writes nothing, so the previous results stay intact;
a finished run replaces each file in one rename.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
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
    return write_tables(df, [path])[0]


CSV_PART_ROWS = 100_000   # a CSV of more rows is written in parts, one thread each (pyarrow frees the GIL)


def write_tables(df: pd.DataFrame, paths: list[Path]) -> list[Path]:
    """``write_table`` of one DataFrame to several files (say CSV and Parquet), converted to Arrow once and
    written side by side in threads; a long CSV is formatted in row ranges at once, each to its own file,
    then joined in order (the same bytes as one pass: only the first range has the header)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs: list[Callable[[], None]] = []
    joins: list[tuple[Path, list[Path]]] = []
    for path in paths:
        if path.suffix == ".parquet":
            jobs.append(partial(_write_parquet, table, path))
            continue
        parts = max(1, min(cpus, 4, table.num_rows // CSV_PART_ROWS))
        cuts = [table.num_rows * i // parts for i in range(parts + 1)]
        files = [path] + [path.with_name(f".{path.name}.part{i}") for i in range(1, parts)]
        for i, part in enumerate(files):
            jobs.append(partial(_write_csv, table.slice(cuts[i], cuts[i + 1] - cuts[i]), part, i == 0))
        joins.append((path, files[1:]))
    try:
        if len(jobs) == 1 or cpus == 1:
            for job in jobs:
                job()
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(cpus, len(jobs))) as pool:
                for f in [pool.submit(job) for job in jobs]:
                    f.result()
        for path, rest in joins:
            with open(path, "ab") as out:
                for part in rest:
                    with open(part, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
    finally:
        for _, rest in joins:
            for part in rest:
                part.unlink(missing_ok=True)
    return list(paths)


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def _write_csv(table: Any, path: Path, header: bool) -> None:
    import pyarrow.csv as pacsv

    pacsv.write_csv(table, path, pacsv.WriteOptions(include_header=header))


def write_atomic(path: Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp)`` then rename tmp to ``path``; the tmp file is removed on failure."""
    return write_together(path.parent, {path.name: writer})[0]


def write_together(folder: Path, writers: dict[str, Callable[[Path], None]]) -> list[Path]:
    """Write each ``writers[name](tmp)`` to a temporary file in ``folder``, then rename them all to their
    names: a writer that fails leaves every file as it was (the temporary files are removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    done: list[tuple[str, Path]] = []
    try:
        for name, writer in writers.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            os.close(fd)
            done.append((name, Path(tmp)))
            writer(Path(tmp))
            os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes 0600; give the file the mode open() would
        for name, tmp in done:
            os.replace(tmp, folder / name)
    except BaseException:
        for _, tmp in done:
            tmp.unlink(missing_ok=True)
        raise
    return [folder / name for name in writers]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: Path, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text))


def writable_folder(path: Path, flag: str) -> None:
    """Check, before anything runs, that files can be made where ``path`` goes (beside it: its folder, or
    the nearest folder above that exists, where the missing ones will be made): by making one there, not
    from permission bits (root passes every bit check, and some folders, /proc say, refuse every file)."""
    probe = path.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise KvsimError(flag, f"{probe} is a file, so no folder can be made under it for {path}")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise KvsimError(flag, f"cannot make files in {probe} ({e.strerror}), where {path} goes") from None


def prepare_out_dir(out: str | Path) -> Path:
    """Check, before anything runs, that ``out`` is (or can be made) a folder this process may write."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise KvsimError(str(path), "--out must be a folder, and this is a file")
    writable_folder(path, "--out")
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
