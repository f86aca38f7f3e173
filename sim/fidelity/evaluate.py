"""Replay measured runs with several seeds and compare the predicted figures with the measured ones.

Per stage (requests that arrived inside the stage's window and were not refused by the API server for
not fitting max_model_len), as the client measured them:

    ttft_*, e2e_*     mean, p50, p90, p99 of the client-side latencies (frontend included)
    decode_per_token  (mean E2E - mean TTFT) / (output_len - 1)
    req_per_s         completed requests / (last completion - stage start)

Error = (predicted - measured) / measured, with the prediction averaged over the seeds; the spread is
the seeds' min and max. A stage is *falsely saturated* when the predicted mean TTFT exceeds 3x the
measured one plus 50 ms.

What the replayed engine did in each stage (steps that started inside its window), to say why a figure
is off: requests running and waiting (time-weighted means over the steps), the peak share of KV blocks
in use, and preemptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.fidelity.rebuild import STAGE_GAP_S, run_scenario_for
from sim.fidelity.runs import METRIC_COLUMNS, MeasuredStage, group_runs
from sim.runner import gpu_blocks, run_scenario

METRICS = list(METRIC_COLUMNS)
_NOTHING = pd.DataFrame({"arrival_s": [], "status": [], "ttft_s": [], "e2e_s": []})   # no request served


@dataclass
class StageResult:
    """One stage: measured figures, each seed's predictions, and the derived errors."""

    stage: MeasuredStage
    predictions: list[dict[str, float]] = field(default_factory=list)   # one per seed
    refused: list[int] = field(default_factory=list)   # per seed: requests the API server refuses (too long)
    windows: list[tuple[float, float]] = field(default_factory=list)   # per seed: (start, last arrival) s
    engine: list[dict[str, float]] = field(default_factory=list)   # per seed: ``stage_engine``
    kv_blocks: int | None = None       # the replayed server's GPU KV blocks (None: nothing replayed)
    kv_blocks_estimated: bool = False  # sized from HBM (no logged or given count)

    def predicted(self, metric: str) -> float:
        return float(np.mean([p[metric] for p in self.predictions]))

    def spread(self, metric: str) -> tuple[float, float]:
        values = [p[metric] for p in self.predictions]
        return float(min(values)), float(max(values))

    def error(self, metric: str) -> float:
        measured = self.stage.measured[metric]
        return (self.predicted(metric) - measured) / measured if measured else math.nan

    @property
    def falsely_saturated(self) -> bool:
        """Predicted mean TTFT above 3x the measured one plus 50 ms (False where none was measured)."""
        return self.predicted("ttft_mean") > 3 * self.stage.measured["ttft_mean"] + 0.05

    def to_json(self) -> dict[str, Any]:
        load = {"concurrency": self.stage.concurrency, "num_requests": self.stage.num_requests} \
            if self.stage.load == "concurrent" else {}
        return {"run": self.stage.run, "stage": self.stage.stage, "rate_req_s": self.stage.rate_req_s, **load,
                "measured": dict(self.stage.measured),
                "predicted": {m: self.predicted(m) for m in METRICS},
                "spread": {m: list(self.spread(m)) for m in METRICS},
                "error": {m: self.error(m) for m in METRICS},
                "falsely_saturated": self.falsely_saturated, "refused": self.refused,
                "windows_s": [list(w) for w in self.windows],
                "kv_blocks": self.kv_blocks, "kv_blocks_estimated": self.kv_blocks_estimated, "engine": self.engine,
                "seeds": self.predictions}


def stage_figures(requests: pd.DataFrame, window: tuple[float, float], output_len: int) -> dict[str, float]:
    """The client-side figures of the requests that arrived in ``window`` (see the module docstring)."""
    start = window[0]
    done = arrived_in(requests, window)
    done = done[done["status"] == "FINISHED"]
    if done.empty:
        return {m: math.nan for m in METRICS}
    ttft = done["ttft_s"].to_numpy(dtype=float)
    e2e = done["e2e_s"].to_numpy(dtype=float)
    out = {"ttft_mean": float(ttft.mean()), "e2e_mean": float(e2e.mean())}
    for name, x in (("ttft", ttft), ("e2e", e2e)):
        p50, p90, p99 = np.percentile(x, [50, 90, 99])
        out |= {f"{name}_p50": float(p50), f"{name}_p90": float(p90), f"{name}_p99": float(p99)}
    out["decode_per_token"] = (out["e2e_mean"] - out["ttft_mean"]) / max(output_len - 1, 1)
    span = float((done["arrival_s"] + done["e2e_s"]).max()) - start
    out["req_per_s"] = len(done) / span if span > 0 else math.nan
    return out


def next_stage_start(requests: pd.DataFrame, window: tuple[float, float]) -> float:
    """When the client starts the stage after the one of ``window``: once the last of that stage's
    requests has finished (and its last request was sent), plus ``STAGE_GAP_S``. A request the engine
    rejected counts as finished when it arrived (the client got its error then)."""
    inside = arrived_in(requests, window)
    end = window[1] if math.isfinite(window[1]) else _last_send(inside, window[0])   # (concurrent: until drained)
    done = inside[inside["status"] == "FINISHED"]
    last = float((done["arrival_s"] + done["e2e_s"]).max()) if len(done) else end
    return max(end, last) + STAGE_GAP_S


def stage_engine(steps: pd.DataFrame, window: tuple[float, float]) -> dict[str, float]:
    """What the engine did in the steps that started in ``window``: requests running and waiting (means
    over the steps, weighted by their durations), the peak share of KV blocks in use, and preemptions."""
    start, end = window
    inside = steps[(steps["start_s"] >= start) & (steps["start_s"] < end)]
    if inside.empty:
        return {"running_mean": 0.0, "waiting_mean": 0.0, "kv_usage_peak": 0.0, "preemptions": 0}
    # (engines behind one server, data_parallel: each engine's time means, summed over the engines)
    engines = [rows for _, rows in inside.groupby("replica")] if "replica" in inside else [inside]
    running = waiting = 0.0
    for rows in engines:
        d = rows["duration_s"].to_numpy(dtype=float)
        running += float((rows["num_running"].to_numpy(dtype=float) * d).sum() / d.sum())
        waiting += float((rows["num_waiting"].to_numpy(dtype=float) * d).sum() / d.sum())
    return {"running_mean": running, "waiting_mean": waiting, "kv_usage_peak": float(inside["kv_usage"].max()),
            "preemptions": int(inside["num_preempted"].sum())}


def evaluate(stages: list[MeasuredStage], seeds: list[int], overrides: list[str] | None = None,
             max_duration_s: float | None = None, runs: list[str] | None = None,
             workers: int = 1) -> list[StageResult]:
    """Replay every run once per seed (its stages one after the other, each once the one before has
    drained: ``next_stage_start``); one StageResult per stage.

    ``max_duration_s`` cuts each stage to at most that long (same rate): a quick check, not the study.
    ``workers`` > 1 replays (run, seed) pairs in that many processes; each replay is seeded on its own, so
    the results are the same, in the same order, for any number of workers.
    """
    results: list[StageResult] = []
    tasks: list[tuple[list[MeasuredStage], int, list[str] | None, str]] = []
    owners: list[list[StageResult]] = []
    for name, run_stages in group_runs(stages).items():
        if runs and name not in runs:
            continue
        if max_duration_s is not None:
            run_stages = [_cut(s, max_duration_s) for s in run_stages]
        stage_results = [StageResult(s) for s in run_stages]
        results.extend(stage_results)
        for seed in seeds:
            tasks.append((run_stages, seed, overrides, name))
            owners.append(stage_results)
    for stage_results, replay in zip(owners, _map(_replay, tasks, workers)):
        for sr, (figures, refused, engine, blocks, window) in zip(stage_results, replay):
            sr.predictions.append(figures)
            sr.refused.append(refused)
            sr.windows.append(window)
            if engine is not None:
                sr.engine.append(engine)
                sr.kv_blocks, sr.kv_blocks_estimated = blocks
    return results


def _replay(task: tuple[list[MeasuredStage], int, list[str] | None, str]
            ) -> list[tuple[dict[str, float], int, dict[str, float] | None, tuple[int, bool], tuple[float, float]]]:
    """One run with one seed: per stage (figures, refused requests, engine figures or None when nothing
    was replayed, (KV blocks, estimated), (start, last arrival) in seconds)."""
    run_stages, seed, overrides, name = task
    source = f"<fidelity {name}>"
    starts = [0.0]
    for k in range(1, len(run_stages)):   # each stage starts once the one before it has drained
        scn, windows, _ = run_scenario_for(run_stages[:k], seed, overrides, source=source, starts=starts)
        before = run_scenario(scn, check_integrity=False).requests if scn is not None else _NOTHING
        starts.append(next_stage_start(before, windows[-1]))
    scn, windows, refused = run_scenario_for(run_stages, seed, overrides, source=source, starts=starts)
    result = run_scenario(scn, check_integrity=False) if scn is not None else None
    served = result.requests if result is not None else _NOTHING
    blocks = (gpu_blocks(scn), scn.kv_cache.num_gpu_blocks is None) if scn is not None else (0, False)
    return [(stage_figures(served, window, stage.output_len), n,
             stage_engine(result.steps, window) if result is not None else None, blocks,
             _sent(served, window) if stage.load == "concurrent" else window)
            for stage, window, n in zip(run_stages, windows, refused)]


def arrived_in(requests: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """The requests that arrived (were sent) in ``window``, both ends included (an end at infinity: open)."""
    arrival = requests["arrival_s"]
    return requests[(arrival >= window[0]) & (arrival <= window[1])]


def _last_send(inside: pd.DataFrame, start: float) -> float:
    return float(inside["arrival_s"].max()) if len(inside) else start


def _sent(requests: pd.DataFrame, window: tuple[float, float]) -> tuple[float, float]:
    """A concurrent stage's window as reported: its start and its last send (it was open until it drained)."""
    return window[0], _last_send(arrived_in(requests, window), window[0])


def _map(fn, tasks: list, workers: int) -> list:
    """``[fn(t) for t in tasks]``, in a process pool of ``workers`` when that is more than one."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    from sim.worker_pool import worker_pool

    with worker_pool(min(workers, len(tasks))) as pool:   # (stopped at once on Ctrl-C or an error)
        return list(pool.map(fn, tasks))


def _cut(stage: MeasuredStage, max_duration_s: float) -> MeasuredStage:
    """``stage`` at most ``max_duration_s`` long, at its rate (a concurrent stage, which has no duration, whole)."""
    from dataclasses import replace

    if stage.load == "concurrent":
        return stage
    return replace(stage, duration_s=min(stage.duration_s, max_duration_s))
