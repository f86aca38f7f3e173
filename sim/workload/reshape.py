"""Reshaping a workload held as ``Columns`` sorted by arrival. Applied in this order by the builder:

    limit -> window (start_s, duration_s) -> time_scale -> rate -> max_model_len clipping

Every function returns new arrays and leaves its input alone.
"""

from __future__ import annotations

import numpy as np

from sim.errors import KvsimError
from sim.workload.table import Columns, LoadStats


def sort_by_arrival(cols: Columns, stats: LoadStats, source: str) -> Columns:
    """Stable sort by arrival; out-of-order rows are a warning, not an error."""
    arr = cols.arrival
    if len(arr) > 1 and bool((np.diff(arr) < 0).any()):
        later = int((np.diff(arr) < 0).sum())
        stats.warnings.append(f"{source}: {later} timestamp(s) earlier than the row before; sorted by arrival")
        return cols.take(np.argsort(arr, kind="stable"))
    return cols


def shift_to_zero(cols: Columns) -> Columns:
    if len(cols) and cols.arrival[0] != 0.0:
        cols.arrival = cols.arrival - cols.arrival[0]
    return cols


def limit(cols: Columns, count: int | None) -> Columns:
    """The first ``count`` requests by arrival."""
    if count is None or count >= len(cols):
        return cols
    return cols.take(np.arange(count))


def window(cols: Columns, start_s: float | None, duration_s: float | None) -> Columns:
    """Requests arriving in [start_s, start_s + duration_s), times re-measured from start_s."""
    if start_s is None and duration_s is None:
        return cols
    start = start_s or 0.0
    end = start + duration_s if duration_s is not None else np.inf
    keep = (cols.arrival >= start) & (cols.arrival < end)
    out = cols.take(keep)
    out.arrival = out.arrival - start
    return out


def time_scale(cols: Columns, factor: float) -> Columns:
    """Multiply every arrival time by ``factor`` (0.5 replays twice as fast)."""
    if factor != 1.0:
        cols.arrival = cols.arrival * factor
    return cols


def mean_rate(arrival: np.ndarray) -> float:
    """Requests per second as 1 / mean inter-arrival gap: (N - 1) / (last - first). NaN if undefined."""
    if len(arrival) < 2 or arrival[-1] <= arrival[0]:
        return float("nan")
    return (len(arrival) - 1) / float(arrival[-1] - arrival[0])


def rescale_rate(cols: Columns, rate: float | None, source: str) -> Columns:
    """Stretch or squeeze inter-arrival gaps so the mean rate (see ``mean_rate``) equals ``rate``."""
    if rate is None:
        return cols
    current = mean_rate(cols.arrival)
    if not np.isfinite(current):
        raise KvsimError(source, "workload.rate: needs at least two requests with different arrival times")
    t0 = cols.arrival[0]
    cols.arrival = t0 + (cols.arrival - t0) * (current / rate)
    return cols


def clip_to_model_len(cols: Columns, max_model_len: int | None, stats: LoadStats) -> Columns:
    """Clip so prompt + output <= max_model_len: the output shrinks first, then the prompt (keeping
    one output token). Prefixes and hash ids are cut to the clipped prompt."""
    if max_model_len is None:
        return cols
    prompt, output = cols.prompt_len, cols.output_len
    over = prompt + output > max_model_len
    if not over.any():
        return cols
    stats.clipped += int(over.sum())
    new_prompt = np.minimum(prompt, max_model_len - 1)
    cols.output_len = np.where(over, np.minimum(output, max_model_len - new_prompt), output)
    cols.prompt_len = new_prompt
    if cols.prefix_len is not None:
        cols.prefix_len = np.minimum(cols.prefix_len, new_prompt - 1)
    if cols.hash_ids is not None:
        b = cols.hash_block_tokens
        cols.hash_ids = [h if (not o or h is None) else h[: -(-p // b)]
                         for h, o, p in zip(cols.hash_ids, over.tolist(), new_prompt.tolist(), strict=True)]
    return cols
