"""The request timeline: one row per request, coloured by what it is doing over simulated time.

    req 0  |wait|prefill|decode..................|idle........|        (static: idle until the batch ends)
    req 4  |wait.........................................|prefill|decode...|

Input is a state-interval table (req_id, phase, start_s, end_s): the scheduler's ``timeline_frame()``
(built from a few transitions per request, never per token), or, when only requests.csv is at hand,
``intervals_from_requests`` (waiting, prefill, decode; no preemptions). Large runs are cut to the
first ``max_requests`` requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

PHASE_COLORS = {"client": "#fcc2d7", "frontend": "#e9ecef", "waiting": "#ced4da", "prefill": "#1c7ed6", "decode": "#2b8a3e", "preempted": "#f76707",
                "swapped": "#ae3ec9", "idle": "#ffd43b", "kv_wait": "#fab005", "transferring": "#e8590c",
                "decode_waiting": "#868e96", "host_load": "#0ca678"}
INTERVAL_COLUMNS = ["req_id", "phase", "start_s", "end_s"]


def intervals_from_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """Waiting / prefill / decode intervals from requests.csv columns (preemptions are not visible there)."""
    done = requests[requests["status"] == "FINISHED"]
    parts = []
    for phase, a, b in (("waiting", "arrival_s", "first_scheduled_s"), ("prefill", "first_scheduled_s",
                                                                        "first_token_s"),
                        ("decode", "first_token_s", "finish_s")):
        parts.append(pd.DataFrame({"req_id": done["req_id"], "phase": phase, "start_s": done[a], "end_s": done[b]}))
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["req_id", "start_s"], kind="stable").reset_index(drop=True)[INTERVAL_COLUMNS]


def _draw(ax, iv: pd.DataFrame, max_requests: int) -> tuple[int, set[str]]:
    """Draw the first ``max_requests`` requests' intervals; (requests shown, phases drawn)."""
    ids = np.sort(iv["req_id"].unique())[:max_requests]
    iv = iv[iv["req_id"].isin(ids) & (iv["end_s"] > iv["start_s"]) & iv["phase"].isin(list(PHASE_COLORS))]
    row = {rid: i for i, rid in enumerate(ids)}
    for phase, color in PHASE_COLORS.items():
        sub = iv[iv["phase"] == phase]
        if len(sub):   # one collection of rectangles a phase (a patch per bar costs ~2 ms to add and draw)
            y = np.array([row[r] for r in sub["req_id"]], dtype=float)
            x0, x1 = sub["start_s"].to_numpy(dtype=float), sub["end_s"].to_numpy(dtype=float)
            quads = np.stack([np.column_stack((x0, y - 0.4)), np.column_stack((x1, y - 0.4)),
                              np.column_stack((x1, y + 0.4)), np.column_stack((x0, y + 0.4))], axis=1)
            ax.add_collection(PolyCollection(quads, facecolors=color, linewidths=0), autolim=True)
    ax.autoscale_view()
    ax.set_ylim(len(ids) - 0.5, -0.5)
    if len(ids) <= 30:
        ax.set_yticks(range(len(ids)), [str(r) for r in ids], fontsize=7)
    ax.set_ylabel("request")
    return len(ids), set(iv["phase"])


def timeline(intervals: pd.DataFrame | Mapping[str, pd.DataFrame], path: Path, max_requests: int = 200) -> Path:
    """Write the timeline figure: one panel per run (a mapping label -> intervals gives side-by-side panels)."""
    runs = intervals if isinstance(intervals, Mapping) else {"": intervals}
    n = len(runs)
    rows = max(min(int(df["req_id"].nunique()), max_requests) for df in runs.values()) if n else 1
    height = min(2 + 0.12 * rows, 9)
    fig, axes = plt.subplots(n, 1, figsize=(10, height * n if n > 1 else height), squeeze=False, sharex=True)
    drawn: set[str] = set()
    for ax, (label, df) in zip(axes[:, 0], runs.items()):
        shown, phases = _draw(ax, df, max_requests)
        drawn |= phases
        total = int(df["req_id"].nunique())
        more = f" (first {shown} of {total} requests)" if shown < total else ""
        ax.set_title(f"{label}{more}" if label else f"request timeline{more}", fontsize=10)
    axes[-1, 0].set_xlabel("simulated time (s)")
    # the phases some panel shows, in PHASE_COLORS order (a single engine has no KV wait or transfer)
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items() if p in drawn or not drawn]
    axes[0, 0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    from sim.plots import fixed_margins

    fixed_margins(fig, left=0.7, right=1.15, top=0.3, hspace=0.4 / max(height - 0.85, 0.5))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
