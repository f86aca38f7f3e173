"""memory_over_time.png: the five-way KV memory breakdown as a stacked area over simulated time.

From steps.csv's slot columns (token states, reserved, internal fragmentation, external fragmentation,
free; each step's values hold until the next step). Shares of the capacity, so the stack sums to 100%.
Runs of more than ``max_points`` steps are drawn from time buckets (the duration-weighted mean of each
bucket), which keeps the figure fast and its areas true.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.plots import BREAKDOWN_COLORS, fixed_margins  # noqa: E402

SLOT_COLUMNS = {"token_states": "slots_token_states", "reserved": "slots_reserved",
                "internal_fragmentation": "slots_internal_frag", "external_fragmentation": "slots_external_frag",
                "free": "slots_free"}


def breakdown_over_time(steps: pd.DataFrame, max_points: int = 2000) -> pd.DataFrame:
    """Columns start_s and the five shares (0..1) of each step, or of each of ``max_points`` time buckets."""
    cols = [steps[c].to_numpy(dtype=float) for c in SLOT_COLUMNS.values()]
    total = np.add.reduce(cols)
    inv = np.divide(1.0, total, out=np.zeros_like(total), where=total > 0)   # a share is slots / total
    start = steps["start_s"].to_numpy(dtype=float)
    if len(steps) > max_points:
        dur = steps["duration_s"].to_numpy(dtype=float)
        edges = np.linspace(start[0], start[-1] + dur[-1], max_points + 1)
        bucket = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, max_points - 1)
        w = np.bincount(bucket, weights=dur, minlength=max_points)
        n = np.bincount(bucket, minlength=max_points)
        keep = n > 0
        timed = w > 0
        scale = dur * inv
        out_cols = []
        for col in cols:
            mean = np.bincount(bucket, weights=col * scale, minlength=max_points) / np.where(timed, w, 1)
            if not timed[keep].all():   # a bucket of zero-length steps: their plain mean
                plain = np.bincount(bucket, weights=col * inv, minlength=max_points) / np.maximum(n, 1)
                mean = np.where(timed, mean, plain)
            out_cols.append(mean[keep])
        shares = np.column_stack(out_cols)
        start = edges[:-1][keep]
    else:
        shares = np.column_stack([c * inv for c in cols]) if len(steps) else np.zeros((0, len(cols)))
    out = pd.DataFrame(shares, columns=list(SLOT_COLUMNS))
    out.insert(0, "start_s", start)
    return out


def _draw(ax, steps: pd.DataFrame) -> None:
    if not len(steps):
        ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
        return
    bd = breakdown_over_time(steps)
    end = float((steps["start_s"] + steps["duration_s"]).iloc[-1])
    x = np.append(bd["start_s"].to_numpy(), end)
    ys = [np.append(bd[k].to_numpy(), bd[k].iloc[-1]) * 100 for k in SLOT_COLUMNS]
    ax.stackplot(x, *ys, step="post", colors=[BREAKDOWN_COLORS[k] for k in SLOT_COLUMNS],
                 labels=[k.replace("_", " ") for k in SLOT_COLUMNS], linewidth=0)
    ax.set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1)
    ax.set_ylim(0, 100)


def memory_over_time(steps: pd.DataFrame | Mapping[str, pd.DataFrame], path: Path) -> Path:
    """Write the figure: one panel, or one panel per run side by side for a mapping label -> steps."""
    runs = steps if isinstance(steps, Mapping) else {"": steps}
    n = max(1, len(runs))
    fig, axes = plt.subplots(1, n, figsize=(min(5 * n, 20) + 2 if n > 1 else 9, 3.8), squeeze=False,
                             sharey=True)
    for ax, (label, df) in zip(axes[0], runs.items()):
        _draw(ax, df)
        ax.set_title(label or "KV memory over time", fontsize=10)
        ax.set_xlabel("simulated time (s)")
    axes[0, 0].set_ylabel("% of KV capacity")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, -1].legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fixed_margins(fig, right=1.85, wspace=0.08)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
