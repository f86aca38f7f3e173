"""Statistics of a trace as a replay would see it (after skipping empty rows and sorting by arrival).

Definitions (the tests recompute each one with plain pandas):
    time_span_s       last arrival - first arrival
    mean_rate_rps     (N - 1) / time_span_s, i.e. 1 / mean inter-arrival gap
    burstiness_cv     std / mean of the inter-arrival gaps (population std); 1 for a Poisson process
    lengths           mean, p50, p99 (linear interpolation), max
    block_repeat_fraction  (Mooncake) share of prompt block references, in arrival order, whose hash
                      id already appeared in an earlier reference: what an unbounded prefix cache could reuse
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.workload.build import drop_empty
from sim.workload.reshape import shift_to_zero, sort_by_arrival
from sim.workload.table import Columns, LoadStats
from sim.workload.traces import load_trace


def load_for_info(path: Path, fmt: str, source: str, **options) -> tuple[Columns, LoadStats]:
    stats = LoadStats()
    cols = drop_empty(load_trace(path, fmt, source, stats, **options), stats)
    if not np.isnan(cols.arrival).any():
        cols = shift_to_zero(sort_by_arrival(cols, stats, source))
    return cols, stats


def length_stats(x: np.ndarray) -> dict:
    if len(x) == 0:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)),
            "max": int(x.max())}


def block_repeat_fraction(hash_ids: list[tuple[int, ...] | None]) -> float:
    total = sum(len(h) for h in hash_ids if h)
    if total == 0:
        return 0.0
    unique = len({i for h in hash_ids if h for i in h})
    return (total - unique) / total


def trace_summary(cols: Columns, stats: LoadStats, fmt: str, source: str) -> dict:
    """The numbers ``kvsim trace-info`` prints (JSON-ready)."""
    count = len(cols)
    out: dict = {"trace": source, "format": fmt, "requests": count}
    timed = count > 0 and not np.isnan(cols.arrival).any()
    if timed:
        span = float(cols.arrival[-1] - cols.arrival[0])
        gaps = np.diff(cols.arrival)
        out["time_span_s"] = span
        out["mean_rate_rps"] = (count - 1) / span if span > 0 else None
        out["burstiness_cv"] = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None
    else:
        out.update(time_span_s=None, mean_rate_rps=None, burstiness_cv=None)
    out["prompt_len"] = length_stats(cols.prompt_len)
    out["output_len"] = length_stats(cols.output_len)
    if cols.hash_ids is not None:
        out["block_repeat_fraction"] = block_repeat_fraction(cols.hash_ids)
    s = stats.as_dict()
    out["rows_read"] = s["rows_read"]
    out["rows_skipped"] = s["rows_skipped"]
    out["skipped_by_reason"] = s["skipped_by_reason"]
    out["warnings"] = s["warnings"]
    return out


def plot_trace(cols: Columns, path: Path, title: str, bins: int = 60) -> None:
    """Arrival rate over time (requests/s per bin) and prompt/output length histograms, one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    if len(cols) and not np.isnan(cols.arrival).any() and cols.arrival[-1] > 0:
        counts, edges = np.histogram(cols.arrival, bins=bins)
        width = edges[1] - edges[0]
        ax.step(edges[:-1], counts / width, where="post")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("arrival rate (requests/s)")
    else:
        ax.text(0.5, 0.5, "no arrival times", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("arrivals")
    for ax, data, name in ((axes[1], cols.prompt_len, "prompt"), (axes[2], cols.output_len, "output")):
        ax.hist(data, bins=bins)
        ax.set_xlabel(f"{name} length (tokens)")
        ax.set_ylabel("requests")
        ax.set_title(f"{name} lengths")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
