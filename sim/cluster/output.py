"""A cluster run's extra files: replicas.csv and two figures (KV usage per replica over time, requests
per replica). Written atomically, each file renamed into place, after ``write_results``' own files."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from sim.output import write_atomic


def replica_labels(replicas: pd.DataFrame) -> dict[int, str]:
    """Each replica's name in a figure: ``replica I``, with its hardware (and TP degree above 1) in a mixed
    fleet (replicas.csv's ``group`` column)."""
    if "group" not in replicas:
        return {int(r): f"replica {r}" for r in replicas["replica"]}
    return {int(r): f"replica {r} ({hw}{f' TP {tp}' if tp > 1 else ''})"
            for r, hw, tp in zip(replicas["replica"], replicas["hardware"], replicas["tensor_parallel"])}


def kv_usage_per_replica(steps: pd.DataFrame, path: Path, labels: dict[int, str] | None = None) -> Path:
    """One line per replica: its KV usage (blocks allocated / its blocks) over simulated time; ``labels``:
    each replica's name (``replica_labels``)."""
    from sim.plot_points import step_envelope
    from sim.plots import _save, plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    groups = steps.groupby("replica", sort=True) if "replica" in steps else [(0, steps)]
    for rid, df in groups:
        ax.step(*step_envelope(df["start_s"].to_numpy(), df["kv_usage"].to_numpy() * 100), where="post", lw=0.7,
                label=(labels or {}).get(int(rid), f"replica {rid}"))
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV usage (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    return _save(fig, path, top=0.2)


def requests_per_replica(replicas: pd.DataFrame, path: Path) -> Path:
    """Requests each replica served (prefill and decode replicas coloured by role; a mixed fleet's by group,
    with its hardware in the legend)."""
    from sim.plots import _save, plt

    colors = {"colocated": "#1c7ed6", "prefill": "#f59f00", "decode": "#2b8a3e"}
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(replicas) + 2), 3.2))
    if "group" in replicas:
        palette = ["#1c7ed6", "#f59f00", "#2b8a3e", "#ae3ec9", "#e03131", "#0c8599"]
        for g, rows in replicas.groupby("group", sort=True):
            tp = int(rows["tensor_parallel"].iloc[0])
            ax.bar(rows["replica"].astype(str), rows["requests"], color=palette[int(g) % len(palette)],
                   label=f"group {g}: {rows['hardware'].iloc[0]}{f' TP {tp}' if tp > 1 else ''}")
        ax.legend(fontsize=7)
    else:
        ax.bar(replicas["replica"].astype(str), replicas["requests"], color=[colors[r] for r in replicas["role"]])
    ax.set_xlabel("replica")
    ax.set_ylabel("requests")
    return _save(fig, path, left=0.85, top=0.2)


def write_cluster_files(result, out: Path, plots: bool = True) -> list[Path]:
    """replicas.csv (and the figures) for a cluster result; nothing for a single-engine result."""
    table = getattr(result, "replicas", None)
    if table is None:
        return []
    files = [write_atomic(out / "replicas.csv", lambda p: table.to_csv(p, index=False))]
    if plots:
        labels = replica_labels(table)
        for name, draw in (("kv_usage_per_replica.png", lambda q: kv_usage_per_replica(result.steps, q, labels)),
                           ("requests_per_replica.png", lambda q: requests_per_replica(table, q))):
            tmp = out / f".{name}.partial.png"
            try:
                draw(tmp)
                os.replace(tmp, out / name)
            finally:
                tmp.unlink(missing_ok=True)
            files.append(out / name)
    return files
