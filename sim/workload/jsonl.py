"""JSON-lines traces: Mooncake (fixed fields) and generic JSONL with a column mapping.

Mooncake lines look like ``{"timestamp": 40, "input_length": 23769, "output_length": 3,
"hash_ids": [151, 152, ...]}``: timestamp in ms from the start, one hash id per 512-token block of the
prompt (the last partial block included). Equal ids at equal positions mean equal prompt tokens, so
requests keep them (``Request.hash_ids``, ``hash_block_tokens=512``) for prefix caching.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.workload.table import Columns, LoadStats, require_columns, to_counts, to_seconds

MOONCAKE_BLOCK_TOKENS = 512


def read_jsonl(path: Path, source: str, max_rows: int | None = None) -> tuple[list[dict], np.ndarray]:
    """Parsed objects and their 1-based line numbers; blank lines are skipped."""
    if not path.exists():
        raise KvsimError(source, "no such file")
    rows: list[dict] = []
    lines: list[int] = []
    try:
        with path.open(encoding="utf-8-sig") as f:   # (a leading byte-order mark dropped)
            for number, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise KvsimError(f"{source}:{number}", f"invalid JSON: {e.msg}") from None
                if not isinstance(obj, dict):
                    raise KvsimError(f"{source}:{number}", "expected a JSON object on each line")
                rows.append(obj)
                lines.append(number)
                if max_rows is not None and len(rows) >= max_rows:
                    break
    except UnicodeDecodeError as e:
        raise KvsimError(source, f"not a text file: {e}") from None
    if not rows:
        raise KvsimError(source, "the file is empty")
    return rows, np.asarray(lines, dtype=np.int64)


def _require_fields(rows: list[dict], lines: np.ndarray, needed: list[str], source: str) -> None:
    for row, line in zip(rows, lines.tolist(), strict=True):
        missing = [k for k in needed if k not in row]
        if missing:
            raise KvsimError(f"{source}:{line}", f"missing field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")


def load_mooncake(path: Path, source: str, stats: LoadStats, *, max_rows: int | None = None) -> Columns:
    rows, lines = read_jsonl(path, source, max_rows)
    stats.rows_read += len(rows)
    _require_fields(rows, lines, ["timestamp", "input_length", "output_length"], source)
    df = pd.DataFrame.from_records(rows, columns=["timestamp", "input_length", "output_length"])
    prompt = to_counts(df["input_length"], "input_length", source, lines)
    hashes: list[tuple[int, ...] | None] = []
    mismatched = 0
    for row, line, p in zip(rows, lines.tolist(), prompt.tolist(), strict=True):
        ids = row.get("hash_ids")
        if ids is None:  # no block ids on this line: nothing known to be shared
            hashes.append(None)
            continue
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise KvsimError(f"{source}:{line}", "hash_ids: expected a list of integers")
        mismatched += len(ids) != -(-p // MOONCAKE_BLOCK_TOKENS)
        hashes.append(tuple(ids))
    if mismatched:
        stats.warnings.append(f"{source}: {mismatched} request(s) whose hash_ids do not cover "
                              f"input_length in {MOONCAKE_BLOCK_TOKENS}-token blocks")
    return Columns(
        arrival=to_seconds(df["timestamp"], "timestamp", source, lines, unit_s=1e-3),
        prompt_len=prompt,
        output_len=to_counts(df["output_length"], "output_length", source, lines),
        hash_ids=hashes if any(h is not None for h in hashes) else None,  # type: ignore[arg-type]
        hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
    )


def load_mapped_jsonl(path: Path, source: str, stats: LoadStats, columns: dict[str, str], *,
                      unit_s: float = 1.0, max_rows: int | None = None) -> Columns:
    """JSONL with a field mapping (see traces.mapped_names); arrival is optional."""
    from sim.workload.traces import frame_to_columns, mapped_names

    names = mapped_names(columns, source)
    rows, lines = read_jsonl(path, source, max_rows)
    stats.rows_read += len(rows)
    needed = [names["prompt_len"], names["output_len"]] + ([names["arrival"]] if "arrival" in columns else [])
    _require_fields(rows, lines, needed, source)
    df = pd.DataFrame.from_records(rows)
    require_columns(df.columns, needed, source)
    # a field present on some lines only: missing values fail the numeric checks, naming the line
    return frame_to_columns(df, lines, names, source, unit_s)
