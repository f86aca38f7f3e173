"""Figures, drawn from DataFrames only (requests.csv / steps.csv shapes), never from simulator state.

Every function takes the frames (one run, or a mapping label -> frames for overlays) and a path,
writes one PNG and returns the path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.plot_points import cdf_points, step_envelope  # noqa: E402

BREAKDOWN_COLORS = {"token_states": "#2b8a3e", "reserved": "#f59f00", "internal_fragmentation": "#e03131",
                    "external_fragmentation": "#862e9c", "free": "#ced4da"}


def fixed_margins(fig, left: float = 0.75, right: float = 0.25, bottom: float = 0.55, top: float = 0.35,
                  wspace: float | None = None, hspace: float | None = None) -> None:
    """Margins in inches, sized for these figures' labels and outside legends. (``tight_layout`` lays
    every tick label out once more before the figure is drawn: about a third of the figures' time.)"""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=wspace, hspace=hspace)


def _save(fig, path: Path, **margins: float) -> Path:
    fixed_margins(fig, **margins)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _runs(x: pd.DataFrame | Mapping[str, pd.DataFrame]) -> Mapping[str, pd.DataFrame]:
    return x if isinstance(x, Mapping) else {"": x}


def kv_usage(steps: pd.DataFrame | Mapping[str, pd.DataFrame], path: Path) -> Path:
    """KV-cache usage (fraction of blocks allocated) over simulated time."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    runs = _runs(steps)
    for label, df in runs.items():
        ax.step(*step_envelope(df["start_s"].to_numpy(), df["kv_usage"].to_numpy() * 100), where="post", lw=0.8,
                label=label or None)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV blocks used (%)")
    ax.set_ylim(0, 105)
    ax.set_title("KV-cache usage")
    first = next(iter(runs.values()))
    if "kv_bytes_used" in first and len(first) and first["kv_blocks_used"].max() > 0:
        # the same curve in bytes (runs of one scenario share the capacity); right axis in GB (1e9 bytes)
        i = int(np.argmax(first["kv_blocks_used"].to_numpy() > 0))   # the first step holding blocks
        capacity_gb = float(first["kv_bytes_used"].iloc[i]) / float(first["kv_usage"].iloc[i]) / 1e9
        right = ax.twinx()
        right.set_ylim(0, 1.05 * capacity_gb)
        right.set_ylabel("KV memory used (GB)")
    if len(_runs(steps)) > 1:
        ax.legend()
    return _save(fig, path, right=0.75 if len(fig.axes) > 1 else 0.25)


def batch(steps: pd.DataFrame, path: Path) -> Path:
    """Batch size (requests in the step) and waiting-queue length over time."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    t = steps["start_s"].to_numpy()
    ax.step(*step_envelope(t, steps["batch_size"].to_numpy()), where="post", lw=0.8, label="batch size")
    ax.step(*step_envelope(t, steps["num_waiting"].to_numpy()), where="post", lw=0.8, label="waiting")
    if "num_swapped" in steps and steps["num_swapped"].any():
        ax.step(*step_envelope(t, steps["num_swapped"].to_numpy()), where="post", lw=0.8, label="swapped")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests")
    ax.set_title("Batch size and queue length")
    ax.legend()
    return _save(fig, path, left=0.8)


def latency_cdf(requests: pd.DataFrame | Mapping[str, pd.DataFrame], path: Path) -> Path:
    """Empirical CDFs of TTFT, TPOT and end-to-end latency of finished requests."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for label, df in _runs(requests).items():
        for ax, col, title in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E latency")):
            x, frac = cdf_points(df[col].to_numpy(dtype=float))
            if x.size:
                ax.plot(x, frac, lw=1.2, label=label or None)
            ax.set_title(title)
            ax.set_xlabel("seconds")
            ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("fraction of requests")
    if len(_runs(requests)) > 1:
        axes[0].legend()
    return _save(fig, path, left=0.7, right=0.2, wspace=0.2)


def memory_breakdown(breakdowns: Mapping[str, Mapping[str, float]], path: Path) -> Path:
    """Stacked bars of the five-way KV memory breakdown (the PagedAttention paper's Figure 2)."""
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(breakdowns) + 2), 4))
    labels = list(breakdowns)
    bottom = np.zeros(len(labels))
    for key, color in BREAKDOWN_COLORS.items():
        vals = np.array([breakdowns[lbl].get(key, 0.0) * 100 for lbl in labels])
        ax.bar(labels, vals, bottom=bottom, color=color, label=key.replace("_", " "))
        bottom += vals
    ax.set_ylabel("% of KV capacity (time-weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("KV memory breakdown")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path, right=1.85)


HBM_PARTS = {"weights": "#495057", "activation_reserve": "#f59f00", "kv_cache": "#2b8a3e", "unused": "#ced4da"}


def hbm_budget(budgets: Mapping[str, Mapping[str, int]], path: Path) -> Path:
    """Where each run's GPU memory went (summary ``hbm_budget``): stacked bars in GB of the tensor-parallel
    group's HBM, weights, activation reserve, KV cache and the rest, one bar a run."""
    labels = list(budgets)
    names = 0.3 + 0.075 * max((len(str(lbl)) for lbl in labels), default=3)   # (room for the runs' names)
    fig, ax = plt.subplots(figsize=(names + 6.6, 0.55 * len(labels) + 1.4))
    total = max(b["hbm_bytes"] for b in budgets.values()) / 1e9
    left = np.zeros(len(labels))
    for part, color in HBM_PARTS.items():
        vals = np.array([budgets[lbl][f"{part}_bytes"] / 1e9 for lbl in labels])
        ax.barh(labels, vals, left=left, color=color, label=part.replace("_", " "))
        for y, (x0, v) in enumerate(zip(left, vals)):
            if v >= 0.12 * total:   # (a figure where the segment has room for it)
                ax.text(x0 + v / 2, y, f"{v:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if part in ("weights", "kv_cache") else "black")
        left += vals
    ax.invert_yaxis()
    ax.set_xlabel("GB of the tensor-parallel group's HBM")
    ax.set_title("GPU memory")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path, left=names, right=1.6)


def throughput_latency_figure(summaries: Mapping[str, Mapping]):
    """The runs as points of output tokens/s against median TTFT and mean TPOT (milliseconds), in run order
    and joined by a line (``kvsim compare`` varying one key traces the engine's throughput-latency curve),
    each labelled with its run. A run without a value (no finished request) is left out."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, field, title in ((axes[0], "ttft_s", "p50", "TTFT p50"), (axes[1], "tpot_s", "mean", "TPOT mean")):
        pts = [(label, s["output_throughput_tok_s"], 1e3 * s[key][field]) for label, s in summaries.items()
               if s.get(key) and s[key].get(field) == s[key].get(field) and s[key].get(field) is not None]
        if pts:
            xs, ys = [p[1] for p in pts], [p[2] for p in pts]
            ax.plot(xs, ys, marker="o", lw=1.2, color="#1c7ed6")
            for label, x, y in pts:
                ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            if min(ys) > 0 and max(ys) / min(ys) > 20:
                ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
    return fig


def throughput_latency(summaries: Mapping[str, Mapping], path: Path) -> Path:
    """``throughput_latency_figure`` written to ``path``."""
    return _save(throughput_latency_figure(summaries), path, left=0.75, right=0.3, wspace=0.3)


def write_run_plots(requests: pd.DataFrame, steps: pd.DataFrame, summary: dict, out_dir: Path,
                    timeline: pd.DataFrame | None = None) -> list[Path]:
    """The standard figures of one run. ``timeline``: the scheduler's state intervals (Result.timeline);
    without it the timeline is drawn from requests.csv's columns (no preemption intervals)."""
    from sim import timeline as tl

    out = [kv_usage(steps, out_dir / "kv_usage.png"), batch(steps, out_dir / "batch.png"),
           latency_cdf(requests, out_dir / "latency_cdf.png"),
           memory_breakdown({"run": summary["memory_breakdown"]}, out_dir / "memory_breakdown.png")]
    intervals = timeline if timeline is not None else tl.intervals_from_requests(requests)
    out.append(tl.timeline(intervals, out_dir / "timeline.png"))
    from sim.latency_breakdown import latency_breakdown
    from sim.memory_plot import memory_over_time

    out.append(memory_over_time(steps, out_dir / "memory_over_time.png"))
    out.append(latency_breakdown({"run": (intervals, requests)}, out_dir / "latency_breakdown.png"))
    budgets = ({"run": summary["hbm_budget"]} if "hbm_budget" in summary   # (the cache sized from HBM)
               else summary.get("cluster", {}).get("hbm_budget_per_replica"))   # (a fleet's: one replica a role)
    if budgets:
        out.append(hbm_budget(budgets, out_dir / "hbm_budget.png"))
    return out
