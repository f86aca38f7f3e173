"""Where a request's time goes: the mean seconds a finished request spent in each state of its timeline.

    phase_means(timeline, requests) -> pd.Series   state -> mean seconds per finished request, in PARTS
                                                  order (states no request was in are left out)
    latency_breakdown(runs, path)                  the figure: one stacked bar per run (kvsim run: one;
                                                  kvsim compare: one per run), each part labelled

Invariant: the parts add up to the finished requests' mean E2E. A request's timeline covers its life
from its arrival to its finish (the frontend's input side, queues, prefill, a disaggregated request's
KV wait, transfer and decode replica's queue, decode, preemptions: checked by the cluster fuzzer); the rest of its E2E is the
frontend's output side (``frontend_out``: output latency and per-token streaming). Static batching's
``idle`` (a finished request holding its memory until its batch ends) comes after the finish and is not
part of the E2E.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from sim.timeline import PHASE_COLORS  # noqa: E402

# the states in the order a request passes through them, then the output side of the frontend
PARTS = ["frontend", "waiting", "host_load", "prefill", "kv_wait", "transferring", "decode_waiting", "decode", "preempted",
         "swapped", "frontend_out"]
COLORS = {**PHASE_COLORS, "frontend_out": "#dee2e6"}


def phase_means(timeline: pd.DataFrame, requests: pd.DataFrame) -> pd.Series:
    """Mean seconds per finished request in each state (PARTS order; absent states left out)."""
    done = requests.loc[requests["status"] == "FINISHED"]
    n = len(done)
    if not n:
        return pd.Series(dtype=float)
    tl = timeline[timeline["req_id"].isin(done["req_id"]) & timeline["phase"].isin(PARTS)]
    per = (tl["end_s"] - tl["start_s"]).groupby(tl["phase"].astype(str)).sum() / n
    out = per.reindex(PARTS).fillna(0.0)
    out["frontend_out"] = float((done["e2e_s"] - (done["finish_s"] - done["arrival_s"])).mean())
    return out[(out > 0) | out.index.isin(["waiting", "prefill", "decode"])]


def latency_breakdown(runs: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], path: Path) -> Path:
    """One horizontal stacked bar per run (label -> (timeline, requests)): its mean E2E split by state."""
    from sim.plots import _save

    means = {label: phase_means(tl, reqs) for label, (tl, reqs) in runs.items()}
    parts = [p for p in PARTS if any(p in m.index for m in means.values())]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.55 * len(means)))
    labels = list(means)
    left = [0.0] * len(labels)
    for part in parts:
        widths = [float(means[k].get(part, 0.0)) for k in labels]
        ax.barh(labels, widths, left=left, color=COLORS.get(part, "#868e96"), label=part, height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.3g} s", va="center", fontsize=8)
    ax.set_xlim(0, max(left, default=1.0) * 1.12 or 1.0)
    ax.invert_yaxis()
    ax.set_xlabel("mean seconds per finished request (the parts add up to the mean E2E)")
    ax.set_title("where a request's time goes")
    if parts:   # (no finished request: no part to name)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    width = max((len(str(k)) for k in labels), default=4)
    return _save(fig, path, left=min(0.3 + 0.07 * width, 3.0), right=1.3)
