"""Trace file formats -> ``Columns`` (file order; the builder sorts, reshapes and makes Requests).

| format   | columns (or fields)                                                    | times            |
| -------- | ---------------------------------------------------------------------- | ---------------- |
| azure    | TIMESTAMP, ContextTokens, GeneratedTokens                              | wall-clock dates |
| mooncake | timestamp, input_length, output_length, hash_ids (JSONL)               | ms from start    |
| vidur    | arrived_at?, num_prefill_tokens, num_decode_tokens                     | s (or none)      |
| burstgpt | Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type | s from start  |
| csv      | a mapping from arrival, prompt_len, output_len (+ optional fields)     | s or dates       |
| jsonl    | the same mapping, one JSON object a line                               | s or dates       |

A trace without times (vidur length files, a csv without an arrival column) gets NaN arrivals; the
builder then draws them from ``workload.arrival``. Rows with a zero prompt or output length are
skipped and counted; negative, fractional or non-numeric counts are errors naming the file line.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.limits import MAX_TRACE_BYTES
from sim.workload.csvread import header_of, read_columns
from sim.workload.table import Columns, LoadStats, datetimes_ns, shown, to_counts, to_seconds

FORMATS = ("azure", "mooncake", "vidur", "burstgpt", "csv", "jsonl")
OPTIONAL_FIELDS = ("priority", "prefix_group", "prefix_len", "n", "beam_width")
AZURE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def load_trace(
    path: Path, fmt: str, source: str, stats: LoadStats, *, columns: dict[str, str] | None = None,
    model_filter: str | None = None, time_unit: str = "s", max_rows: int | None = None,
    chunk_rows: int | None = None,
) -> Columns:
    """Read one trace file in the given format. ``max_rows`` stops after that many file rows.

    Only a regular file of at most ``MAX_TRACE_BYTES`` is read (checked before reading)."""
    check_trace_file(path, source)
    if fmt == "azure":
        return load_azure(path, source, stats, max_rows=max_rows, chunk_rows=chunk_rows)
    if fmt == "mooncake":
        from sim.workload.jsonl import load_mooncake
        return load_mooncake(path, source, stats, max_rows=max_rows)
    if fmt == "vidur":
        return load_vidur(path, source, stats, max_rows=max_rows)
    if fmt == "burstgpt":
        return load_burstgpt(path, source, stats, model_filter=model_filter)
    if fmt == "csv":
        return load_mapped_csv(path, source, stats, columns or {}, unit_s=TIME_UNITS[time_unit],
                               max_rows=max_rows, chunk_rows=chunk_rows)
    if fmt == "jsonl":
        from sim.workload.jsonl import load_mapped_jsonl
        return load_mapped_jsonl(path, source, stats, columns or {}, unit_s=TIME_UNITS[time_unit],
                                 max_rows=max_rows)
    raise KvsimError(source, f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")


def check_trace_file(path: Path, source: str) -> None:
    """Refuse a missing, non-regular (a device, a pipe) or oversized trace before reading a byte."""
    try:
        st = path.stat()
    except OSError as e:
        raise KvsimError(source, f"cannot read the trace: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise KvsimError(source, "is a directory, not a trace file")
    if not stat.S_ISREG(st.st_mode):
        raise KvsimError(source, "not a regular file (a device, pipe or socket), not a trace file")
    if st.st_size > MAX_TRACE_BYTES:
        raise KvsimError(source, f"the trace is {st.st_size:,} bytes; at most {MAX_TRACE_BYTES:,} bytes are read")


def guess_format(path: Path, source: str) -> str:
    """The format from the extension and, for CSV files, the header."""
    check_trace_file(path, source)
    if path.suffix in (".jsonl", ".json"):
        with path.open(errors="replace") as f:
            first = f.readline(1 << 20)
        return "mooncake" if '"hash_ids"' in first or '"input_length"' in first else "jsonl"
    header = set(header_of(path, source))
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"num_prefill_tokens", "num_decode_tokens"} <= header:
        return "vidur"
    if {"Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    if {"arrival", "prompt_len", "output_len"} <= header or {"prompt_len", "output_len"} <= header:
        return "csv"
    raise KvsimError(source, f"cannot tell the trace format from columns {sorted(header)}; pass --format")


# ---------------------------------------------------------------- azure


def load_azure(path: Path, source: str, stats: LoadStats, *, max_rows: int | None = None,
               chunk_rows: int | None = None) -> Columns:
    """Azure LLM inference traces (2023 and 2024 share the schema). Times: seconds since the first row."""
    origin: list[int] = []

    def convert(df: pd.DataFrame, lines: np.ndarray) -> Columns:
        ns = datetimes_ns(df["TIMESTAMP"], "TIMESTAMP", source, lines, fmt=AZURE_TIME_FORMAT)
        if not origin:  # every chunk measures from the first chunk's earliest time
            origin.append(int(ns.min()))
        return Columns(
            arrival=(ns - origin[0]).astype(np.float64) / 1e9,
            prompt_len=to_counts(df["ContextTokens"], "ContextTokens", source, lines),
            output_len=to_counts(df["GeneratedTokens"], "GeneratedTokens", source, lines),
        )

    return read_columns(path, source, stats, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], convert,
                        str_columns=["TIMESTAMP"], max_rows=max_rows, chunk_rows=chunk_rows)


# ---------------------------------------------------------------- vidur


def load_vidur(path: Path, source: str, stats: LoadStats, *, max_rows: int | None = None) -> Columns:
    """Vidur processed traces: arrived_at (s) is optional; without it arrivals are NaN."""
    def convert(df: pd.DataFrame, lines: np.ndarray) -> Columns:
        arrival = (to_seconds(df["arrived_at"], "arrived_at", source, lines) if "arrived_at" in df
                   else np.full(len(df), np.nan))
        return Columns(
            arrival=arrival,
            prompt_len=to_counts(df["num_prefill_tokens"], "num_prefill_tokens", source, lines),
            output_len=to_counts(df["num_decode_tokens"], "num_decode_tokens", source, lines),
        )

    return read_columns(path, source, stats, ["num_prefill_tokens", "num_decode_tokens"], convert,
                        optional=["arrived_at"], max_rows=max_rows)


# ---------------------------------------------------------------- burstgpt


def load_burstgpt(path: Path, source: str, stats: LoadStats, *, model_filter: str | None = None) -> Columns:
    """BurstGPT: Timestamp (s), Model, Request tokens, Response tokens. Zero-response rows are failed
    requests: skipped and counted. ``model_filter`` keeps one Model's rows."""
    def convert(df: pd.DataFrame, lines: np.ndarray) -> Columns:
        if model_filter is not None:
            keep = (df["Model"].astype(str).str.strip() == model_filter).to_numpy()
            stats.skip(f"model is not {model_filter}", int((~keep).sum()))
            df, lines = df[keep], lines[keep]
        prompt = to_counts(df["Request tokens"], "Request tokens", source, lines)
        output = to_counts(df["Response tokens"], "Response tokens", source, lines)
        ok = output > 0
        stats.skip("failed request (zero response tokens)", int((~ok).sum()))
        arrival = to_seconds(df["Timestamp"], "Timestamp", source, lines)
        return Columns(arrival=arrival[ok], prompt_len=prompt[ok], output_len=output[ok])

    needed = ["Timestamp", "Request tokens", "Response tokens"] + (["Model"] if model_filter else [])
    cols = read_columns(path, source, stats, needed, convert, optional=["Model"])
    if len(cols) == 0:
        raise KvsimError(source, "no requests left after skipping failures"
                         + (f" and keeping model {model_filter!r}" if model_filter else ""))
    return cols


# ---------------------------------------------------------------- csv with a column mapping


def mapped_names(columns: dict[str, str], source: str) -> dict[str, str]:
    """field -> column name; fields default to their own names. Unknown fields are errors."""
    known = ("arrival", "prompt_len", "output_len") + OPTIONAL_FIELDS
    unknown = [k for k in columns if k not in known]
    if unknown:
        raise KvsimError(source, f"workload.columns: unknown field {unknown[0]!r} (known: {', '.join(known)})")
    return {f: columns.get(f, f) for f in known}


def frame_to_columns(df: pd.DataFrame, lines: np.ndarray, names: dict[str, str], source: str,
                     unit_s: float = 1.0) -> Columns:
    """A table with mapped columns -> Columns (arrival NaN when the arrival column is absent)."""
    arrival = (to_seconds(df[names["arrival"]], names["arrival"], source, lines, unit_s) if names["arrival"] in df
               else np.full(len(df), np.nan))
    opt: dict[str, np.ndarray | None] = {}
    for f in OPTIONAL_FIELDS:
        col = names[f]
        if col not in df:
            opt[f] = None
            continue
        minimum = {"n": 1, "beam_width": 1, "prefix_len": 0}.get(f)
        if minimum is None:  # priority and prefix_group may be negative
            vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            bad = ~np.isfinite(vals) | (vals != np.floor(vals))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise KvsimError(f"{source}:{int(lines[i])}", f"column {col}: not a whole number: {shown(df[col].iloc[i])}")
            opt[f] = vals.astype(np.int64)
        else:
            opt[f] = to_counts(df[col], col, source, lines, minimum=minimum)
    return Columns(
        arrival=arrival,
        prompt_len=to_counts(df[names["prompt_len"]], names["prompt_len"], source, lines),
        output_len=to_counts(df[names["output_len"]], names["output_len"], source, lines),
        **opt,  # type: ignore[arg-type]
    )


def load_mapped_csv(path: Path, source: str, stats: LoadStats, columns: dict[str, str], *,
                    unit_s: float = 1.0, max_rows: int | None = None, chunk_rows: int | None = None) -> Columns:
    names = mapped_names(columns, source)
    needed = [names[f] for f in ("prompt_len", "output_len")] + ([names["arrival"]] if "arrival" in columns else [])
    optional = [names["arrival"]] + [names[f] for f in OPTIONAL_FIELDS]
    return read_columns(path, source, stats, needed, lambda df, lines: frame_to_columns(df, lines, names, source, unit_s),
                        optional=optional, max_rows=max_rows, chunk_rows=chunk_rows)
