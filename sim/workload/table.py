"""The columnar form every workload passes through before it becomes Request objects.

Loaders and generators fill a ``Columns`` (numpy arrays, one entry a request, in any order); the
reshaping steps work on whole arrays; only the last step builds ``Request`` objects. Row order is
the file's order until ``sort_by_arrival`` runs, which is stable (ties keep file order).

Invariants once validated: arrival is finite, prompt_len >= 1, output_len >= 1, n >= 1,
0 <= prefix_len < prompt_len, and all arrays have the same length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.limits import MAX_TOKENS


@dataclass(slots=True)
class Columns:
    arrival: np.ndarray                 # float64 seconds
    prompt_len: np.ndarray              # int64
    output_len: np.ndarray              # int64
    priority: np.ndarray | None = None  # int64; None means all 0
    n: np.ndarray | None = None         # int64; None means all 1
    prefix_group: np.ndarray | None = None  # int64; -1 means no shared prefix
    prefix_len: np.ndarray | None = None    # int64
    beam_width: np.ndarray | None = None    # int64; None means all 1
    lora: np.ndarray | None = None          # int64 LoRA adapter ids (-1: the base model); None means all -1
    hash_ids: list[tuple[int, ...] | None] | None = None  # Mooncake: block ids per request (None: unknown)
    hash_block_tokens: int = 512

    def __len__(self) -> int:
        return len(self.arrival)

    def take(self, idx: np.ndarray) -> Columns:
        """A new Columns holding rows ``idx`` (an index array or a boolean mask), in that order."""
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return Columns(
            arrival=self.arrival[idx], prompt_len=self.prompt_len[idx], output_len=self.output_len[idx],
            priority=pick(self.priority), n=pick(self.n), prefix_group=pick(self.prefix_group),
            prefix_len=pick(self.prefix_len), beam_width=pick(self.beam_width), lora=pick(self.lora),
            hash_ids=None if self.hash_ids is None else [self.hash_ids[i] for i in idx.tolist()],
            hash_block_tokens=self.hash_block_tokens,
        )

    @staticmethod
    def concat(parts: list[Columns]) -> Columns:
        """Join chunks read one after another (all parts carry the same optional columns)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]

        def cat(name: str) -> np.ndarray | None:
            if getattr(first, name) is None:
                return None
            return np.concatenate([getattr(p, name) for p in parts])

        hashes = None
        if first.hash_ids is not None:
            hashes = [h for p in parts for h in p.hash_ids]  # type: ignore[union-attr]
        return Columns(
            arrival=cat("arrival"), prompt_len=cat("prompt_len"), output_len=cat("output_len"),  # type: ignore[arg-type]
            priority=cat("priority"), n=cat("n"), prefix_group=cat("prefix_group"),
            prefix_len=cat("prefix_len"), beam_width=cat("beam_width"), lora=cat("lora"), hash_ids=hashes,
            hash_block_tokens=first.hash_block_tokens,
        )


@dataclass(slots=True)
class LoadStats:
    """What a loader saw: rows read, rows skipped (by reason), requests clipped, warnings."""

    rows_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    clipped: int = 0
    warnings: list[str] = field(default_factory=list)

    def skip(self, reason: str, count: int) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + int(count)

    def as_dict(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "rows_skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(self.skipped),
            "clipped": self.clipped,
            "warnings": list(self.warnings),
        }


# ---------------------------------------------------------------- checks on raw columns


def shown(value: object) -> str:
    """A cell as an error message shows it: its repr as plain Python (-3, not np.int64(-3))."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def where(source: str, line: int | None) -> str:
    return f"{source}:{line}" if line is not None else source


def require_columns(df_columns: list[str] | pd.Index, needed: list[str], source: str, what: str = "") -> None:
    """Raise naming line 1 (the header) when a column is missing."""
    have = [str(c) for c in df_columns]
    missing = [c for c in needed if c not in have]
    if missing:
        label = f" for {what}" if what else ""
        raise KvsimError(where(source, 1), f"missing column{'s' if len(missing) > 1 else ''}{label}: "
                         f"{', '.join(missing)} (found: {', '.join(have) or 'none'})")


def to_counts(values: pd.Series, column: str, source: str, lines: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Token counts as int64; raise on the first non-numeric, fractional or negative value.

    ``lines[i]`` is the file line of row i (for the error message).
    """
    num = pd.to_numeric(values, errors="coerce")
    arr = num.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise KvsimError(where(source, int(lines[i])), f"column {column}: not a number: {shown(values.iloc[i])}")
    frac = arr != np.floor(arr)
    if frac.any():
        i = int(np.flatnonzero(frac)[0])
        raise KvsimError(where(source, int(lines[i])), f"column {column}: not a whole number: {shown(values.iloc[i])}")
    low = arr < minimum
    if low.any():
        i = int(np.flatnonzero(low)[0])
        kind = "negative" if arr[i] < 0 else f"below {minimum}"
        raise KvsimError(where(source, int(lines[i])), f"column {column}: {kind} token count {shown(values.iloc[i])}")
    high = arr > MAX_TOKENS
    if high.any():
        i = int(np.flatnonzero(high)[0])
        raise KvsimError(where(source, int(lines[i])),
                         f"column {column}: token count {shown(values.iloc[i])} is above the limit of {MAX_TOKENS:,}")
    return arr.astype(np.int64)


def to_seconds(values: pd.Series, column: str, source: str, lines: np.ndarray, unit_s: float = 1.0) -> np.ndarray:
    """Numbers (times ``unit_s``) or datetimes, as float64 seconds; raise on the first unparsable one.

    The first row decides: a number there means a numeric column. Datetimes become seconds since the
    earliest one (callers shift to t=0 anyway).
    """
    num = pd.to_numeric(values, errors="coerce")
    arr = num.to_numpy(dtype=np.float64, na_value=np.nan)
    if values.dtype.kind in "if" or len(arr) == 0 or np.isfinite(arr[0]):
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise KvsimError(where(source, int(lines[i])), f"column {column}: unparsable timestamp {shown(values.iloc[i])}")
        neg = arr < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise KvsimError(where(source, int(lines[i])), f"column {column}: negative timestamp {shown(values.iloc[i])}")
        return arr * unit_s
    return datetimes_to_seconds(values, column, source, lines)


def datetimes_ns(values: pd.Series, column: str, source: str, lines: np.ndarray, fmt: str | None = None) -> np.ndarray:
    """Parse wall-clock datetimes (vectorized) to int64 ns since the epoch, in UTC (naive values are
    taken as UTC). Tries ``fmt``, then ISO 8601 (offsets such as +00:00 included), then any layout,
    each only on the rows the previous one missed; raises naming the first row none could read."""
    text = values.astype(str).str.strip()
    ns = _parse_ns(text, fmt or "ISO8601")
    for retry in (["ISO8601"] if fmt else []) + ["mixed"]:
        missed = ns == NAT
        if not missed.any():
            break
        ns[missed] = _parse_ns(text[missed], retry)
    bad = ns == NAT
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise KvsimError(where(source, int(lines[i])), f"column {column}: unparsable timestamp {shown(values.iloc[i])}")
    return ns


NAT = np.iinfo(np.int64).min  # NaT as int64


def _parse_ns(text: pd.Series, fmt: str) -> np.ndarray:
    try:
        ts = pd.to_datetime(text, format=fmt, errors="coerce", utc=True)
    except (ValueError, TypeError, OverflowError):
        return np.full(len(text), NAT, dtype=np.int64)
    return ts.dt.tz_convert(None).astype("datetime64[ns]").to_numpy().view(np.int64).copy()


def datetimes_to_seconds(values: pd.Series, column: str, source: str, lines: np.ndarray,
                         fmt: str | None = None, origin_ns: int | None = None) -> np.ndarray:
    """Datetimes as float64 seconds since ``origin_ns`` (default: the earliest of them)."""
    ns = datetimes_ns(values, column, source, lines, fmt)
    base = int(ns.min()) if origin_ns is None else origin_ns
    return (ns - base).astype(np.float64) / 1e9
