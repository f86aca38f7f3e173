"""The per-step table written to disk while the run records it: steps.csv and steps.parquet, chunk by chunk,
on a second thread.

The recorder hands over each chunk of rows as it fills (``Recorder.stream_to``): the rows of a filled
chunk never change again. One worker thread, first in first out, turns each chunk into the table's
columns (``step_chunk_columns``) and appends them to both files with pyarrow, which formats and
compresses without holding the GIL, so the writing runs beside the simulation on another core instead of
after it. The files hold what the run's DataFrame holds, in the same bytes for the CSV (pyarrow's writer
with one header, as ``sim.output.write_tables`` writes it) and the same table for the Parquet file (row
groups of ``PARQUET_ROW_GROUP`` rows).

Invariants: chunks are written in step order, each once; ``close`` returns True only when every chunk was
written and the streamed columns are those of the finished table (``matches``); otherwise the files are
removed and the caller writes the table from its DataFrame. Nothing is written outside the given paths.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

PARQUET_ROW_GROUP = 65_536   # rows buffered before a Parquet row group is written (8 recorder chunks)


class StepTableStream:
    """Appends chunks of the per-step table to ``csv_path`` and ``parquet_path`` on one worker thread."""

    def __init__(self, csv_path: Path, parquet_path: Path) -> None:
        self.csv_path, self.parquet_path = Path(csv_path), Path(parquet_path)
        self.names: list[str] | None = None   # the streamed columns, fixed by the first chunk
        self.rows = 0                          # rows handed over so far
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._csv: Any = None
        self._parquet: Any = None
        self._buffered: list[Any] = []   # record batches waiting for a Parquet row group
        self._buffered_rows = 0
        self._usable = True
        self.complete = False            # every row of the run was handed over (``mark_complete``)

    # ------------------------------------------------------------ main thread
    def put(self, names: list[str], columns: list[np.ndarray]) -> None:
        """Queue one chunk: its ``columns`` in ``names``' order (every chunk the same names). The chunk is
        made an Arrow batch here (zero-copy for the float columns); the worker's calls into pyarrow run
        without the GIL, so the simulation keeps it (a worker taking the GIL often waits out the
        interpreter's switch interval each time)."""
        if not self._usable:
            return
        if self.names is None:
            self.names = list(names)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvsim-steps")
        elif names != self.names:
            self._usable = False   # (the caller writes the table from its DataFrame)
            return
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(columns, names=self.names)
        self.rows += batch.num_rows
        self._pending.append(self._pool.submit(self._write, batch))
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]

    def mark_complete(self, rows: int) -> None:
        """Every one of the run's ``rows`` rows has been handed over (``put``)."""
        self.complete = self._usable and rows == self.rows

    def matches(self, names: list[str], rows: int) -> bool:
        """Whether the streamed table is the finished one: the same columns and rows, every row handed over."""
        return self.complete and self._usable and self.names == list(names) and self.rows == rows

    def close(self, names: list[str] | None = None, rows: int = -1) -> bool:
        """Wait for the worker and close the files. True when they hold the finished table (``matches``
        ``names`` and ``rows``, when given); else the files are removed. A write error is raised here."""
        ok = False
        try:
            self._drain()
            if self._pool is not None:
                self._pool.submit(self._finish_files).result()
            ok = self.complete and (names is None or self.matches(names, rows))
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if not ok:
                self.discard()
        return ok

    def discard(self) -> None:
        """Stop and remove whatever was written (an error, or a table that came out otherwise)."""
        self._usable = False
        if self._pool is not None:
            for f in self._pending:
                f.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None
        for handle in (self._csv, self._parquet):
            if handle is not None:
                try:
                    handle.close()
                except Exception:   # noqa: BLE001 (already failing: the files go anyway)
                    pass
        self._csv = self._parquet = None
        self.csv_path.unlink(missing_ok=True)
        self.parquet_path.unlink(missing_ok=True)

    def _drain(self) -> None:
        for f in self._pending:
            f.result()
        self._pending = []

    # ------------------------------------------------------------ worker thread
    def _write(self, batch: Any) -> None:
        if self._csv is None:
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            self._csv = pacsv.CSVWriter(str(self.csv_path), batch.schema)
            self._parquet = pq.ParquetWriter(str(self.parquet_path), batch.schema)
        self._csv.write_batch(batch)
        self._buffered.append(batch)
        self._buffered_rows += batch.num_rows
        if self._buffered_rows >= PARQUET_ROW_GROUP:
            self._flush_parquet()

    def _flush_parquet(self) -> None:
        import pyarrow as pa

        if self._buffered:
            self._parquet.write_table(pa.Table.from_batches(self._buffered))
        self._buffered, self._buffered_rows = [], 0

    def _finish_files(self) -> None:
        if self._csv is None:
            return
        self._flush_parquet()
        self._csv.close()
        self._parquet.close()
        self._csv = self._parquet = None


def step_chunk_columns(main: np.ndarray, breakdown: np.ndarray | None, first_step: int, int_rows: list[bool],
                       kv_row: int, num_gpu_blocks: int, block_bytes: int) -> list[np.ndarray]:
    """One chunk's columns of the per-step table, in ``Recorder.stream_names`` order: step, the recorded
    columns (``int_rows[i]``: row i is an integer column), end_s, kv_usage, the breakdown's rows (given),
    kv_bytes_used. The same operations as ``Recorder.read_steps`` and ``run_scenario`` apply to the whole
    table, so the same values. Float rows are views of the chunk (its rows no longer change)."""
    m = main.shape[1]
    cols = [np.arange(first_step, first_step + m, dtype=np.int64)]
    cols += [row.astype(np.int64) if is_int else row for row, is_int in zip(main, int_rows)]
    start, duration, kv_blocks = cols[1], cols[2], cols[1 + kv_row]
    cols.append(np.add(start, duration))
    cols.append(np.divide(kv_blocks, num_gpu_blocks))
    if breakdown is not None:
        cols += list(breakdown)
    cols.append(kv_blocks * block_bytes)
    return cols
