"""Reading delimited trace files in chunks, with the file line of every row kept for error messages.

A file above ``STREAM_BYTES`` is read ``CHUNK_ROWS`` rows at a time, and each chunk is turned into
compact numpy columns by the caller before the next is read, so a file of tens of millions of rows
never exists as one DataFrame (of Python strings) in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.workload.table import Columns, LoadStats, require_columns

STREAM_BYTES = 64 * 2**20
CHUNK_ROWS = 1_000_000


def header_of(path: Path, source: str) -> list[str]:
    """The column names on line 1 (raises on an empty file)."""
    try:
        df = pd.read_csv(path, nrows=0, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise KvsimError(source, "the file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise KvsimError(f"{source}:1", f"cannot parse the header: {e}") from None
    return [str(c).strip() for c in df.columns]


def read_chunks(
    path: Path, source: str, needed: list[str], optional: list[str] = (),  # type: ignore[assignment]
    str_columns: list[str] = (), max_rows: int | None = None,  # type: ignore[assignment]
    chunk_rows: int | None = None,
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Yield (chunk, lines): the needed (and present optional) columns as strings or numbers, and the
    1-based file line of each row. Blank lines are dropped (they keep the numbering right)."""
    if not path.exists():
        raise KvsimError(source, "no such file")
    if path.is_dir():
        raise KvsimError(source, "is a directory, not a trace file")
    header = header_of(path, source)
    require_columns(header, needed, source)
    use = list(needed) + [c for c in optional if c in header and c not in needed]
    if chunk_rows is None:
        chunk_rows = CHUNK_ROWS if path.stat().st_size > STREAM_BYTES else 0
    dtypes = {c: str for c in str_columns if c in use}
    try:
        reader = pd.read_csv(
            path, usecols=lambda c: str(c).strip() in use, dtype=dtypes or None, skip_blank_lines=False,
            skipinitialspace=True, nrows=max_rows, chunksize=chunk_rows or None,
        )
        chunks = reader if chunk_rows else [reader]
        line = 2
        for df in chunks:
            df.columns = [str(c).strip() for c in df.columns]
            lines = np.arange(line, line + len(df), dtype=np.int64)
            line += len(df)
            blank = df.isna().all(axis=1).to_numpy()
            if blank.any():
                df, lines = df[~blank], lines[~blank]
            yield df, lines
    except pd.errors.ParserError as e:
        raise KvsimError(source, f"malformed CSV: {e}") from None
    except UnicodeDecodeError as e:
        raise KvsimError(source, f"not a text file: {e}") from None


def read_columns(
    path: Path, source: str, stats: LoadStats, needed: list[str], convert: Callable[[pd.DataFrame, np.ndarray], Columns],
    optional: list[str] = (), str_columns: list[str] = (), max_rows: int | None = None,  # type: ignore[assignment]
    chunk_rows: int | None = None,
) -> Columns:
    """Read a CSV chunk by chunk, converting each chunk with ``convert`` and joining the results."""
    parts: list[Columns] = []
    for df, lines in read_chunks(path, source, needed, optional, str_columns, max_rows, chunk_rows):
        if len(df) == 0:
            continue
        stats.rows_read += len(df)
        parts.append(convert(df, lines))
    if not parts:
        raise KvsimError(source, "no requests in the file (only a header)")
    return Columns.concat(parts)
