"""The figures' fixed margins (sim/plots.py ``fixed_margins``) leave every drawn label, title, tick label
and outside legend inside the canvas: single runs, overlays of several runs, clusters, large counts."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from sim import plots
from sim.cluster.output import kv_usage_per_replica, requests_per_replica
from sim.latency_breakdown import latency_breakdown
from sim.memory_plot import memory_over_time
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.timeline import timeline

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
SLACK_IN = 0.02   # inches a drawn artist may reach past the canvas edge (antialiasing)


@pytest.fixture
def outside(monkeypatch) -> list[str]:
    """Every figure saved while it is in use, checked as it is saved: the bounding box of what is drawn
    (``Figure.get_tightbbox``, in inches, legends included) within the canvas. Collects the misses."""
    misses: list[str] = []
    save = Figure.savefig

    def checked(fig, path, *a, **k):
        save(fig, path, *a, **k)
        w, h = fig.get_size_inches()
        bb = fig.get_tightbbox(fig.canvas.get_renderer())
        if bb.x0 < -SLACK_IN or bb.y0 < -SLACK_IN or bb.x1 > w + SLACK_IN or bb.y1 > h + SLACK_IN:
            misses.append(f"{Path(path).name}: drawn {bb.bounds} outside {w} x {h} in")

    monkeypatch.setattr(Figure, "savefig", checked)
    return misses


def _run(sets: list[str]):
    return run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                      ["workload.limit=60", "output.plots=false", *sets]), check_integrity=False)


def test_single_run_figures(outside, tmp_path) -> None:
    res = _run([])
    steps = res.steps.copy()
    steps["num_waiting"] *= 1000    # five-digit tick labels on the batch figure
    plots.write_run_plots(res.requests, steps, res.summary, tmp_path, timeline=res.timeline)
    assert len(list(tmp_path.glob("*.png"))) == 8   # (the eighth, hbm_budget.png: the cache is sized from HBM)
    assert not outside, outside


def test_overlays_of_several_runs(outside, tmp_path) -> None:
    runs = {name: _run([f"scheduler.policy={name}"]) for name in ("fcfs", "round_robin", "priority")}
    plots.latency_cdf({k: r.requests for k, r in runs.items()}, tmp_path / "cdf.png")
    plots.kv_usage({k: r.steps for k, r in runs.items()}, tmp_path / "kv.png")
    plots.memory_breakdown({k: r.summary["memory_breakdown"] for k, r in runs.items()}, tmp_path / "bd.png")
    timeline({k: r.timeline for k, r in runs.items()}, tmp_path / "tl.png")
    memory_over_time({k: r.steps for k, r in runs.items()}, tmp_path / "mem.png")
    latency_breakdown({f"scheduler.policy={k}": (r.timeline, r.requests) for k, r in runs.items()},
                      tmp_path / "lb.png")   # (compare's labels when more than one key varies)
    assert not outside, outside


def test_cluster_figures(outside, tmp_path) -> None:
    res = _run(["cluster.replicas=12"])
    replicas = res.replicas.copy()
    replicas["requests"] *= 2000    # six-digit tick labels
    kv_usage_per_replica(res.steps, tmp_path / "kv.png")
    requests_per_replica(replicas, tmp_path / "req.png")
    assert not outside, outside
