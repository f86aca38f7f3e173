"""Chrome trace-event JSON of a finished run, for Perfetto (ui.perfetto.dev) or chrome://tracing.

Built from a run's DataFrames only (steps.csv's rows, the scheduler's state intervals), never from the
engine loop. The file holds ``{"traceEvents": [...], "displayTimeUnit": "ms"}`` with times in microseconds
of simulated time:

- process "engine" (one per replica when steps carry a ``replica`` column), thread "steps": one complete
  ("X") slice per engine step, its args the batch size, prefill and decode tokens and the duration parts
  (``time_*_s`` columns, in ms); counter ("C") tracks "KV usage (%)" and "KV memory (slots)", the
  five-way breakdown (token states, reserved, internal and external fragmentation, free) after each step.
- process "requests": one thread per request (``req N``), one slice per phase (waiting, prefill, decode,
  preempted, swapped, idle, and any other phase the run reports).

Bounds, so the file of a 100k-step run stays a few MB:
- requests: the first ``request_limit`` requests by id (``--trace-events-limit``, default
  ``DEFAULT_REQUEST_LIMIT``; 0 drops the request tracks);
- steps: at most ``max_step_slices`` slices per engine (default ``DEFAULT_STEP_SLICES``). Longer runs merge
  runs of consecutive steps into one slice named "steps A-B" (args: ``steps``, their number,
  ``batch_size_mean``, and the summed tokens and duration parts) and one counter sample (the
  duration-weighted mean).
The top-level ``otherData`` object records what was cut (steps, requests and how many are shown).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.output import write_atomic

DEFAULT_REQUEST_LIMIT = 1000
DEFAULT_STEP_SLICES = 10_000
SLOT_COLUMNS = {"token states": "slots_token_states", "reserved": "slots_reserved",
                "internal fragmentation": "slots_internal_frag", "external fragmentation": "slots_external_frag",
                "free": "slots_free"}
REQUESTS_PID = 1_000_000  # engines are pids 1, 2, ... (one per replica)


def _us(seconds: np.ndarray) -> np.ndarray:
    """Seconds -> microseconds rounded to the nanosecond, so a slice ending where the next starts meets it."""
    return np.round(np.asarray(seconds, dtype=float) * 1e6, 3)


def _groups(n: int, max_slices: int) -> np.ndarray:
    """Group index of each of ``n`` steps: consecutive runs of ceil(n / max_slices) steps."""
    size = max(1, -(-n // max(1, max_slices)))
    return np.arange(n) // size


def _merge_steps(steps: pd.DataFrame, max_slices: int) -> pd.DataFrame:
    """Steps as they will be drawn: unchanged when few enough, else runs of consecutive steps merged."""
    df = steps.reset_index(drop=True)
    if len(df) <= max_slices:
        out = df.copy()
        out["num_steps"] = 1
        out["first_step"] = out["step"] if "step" in out else np.arange(len(out))
        out["last_step"] = out["first_step"]
        return out
    g = _groups(len(df), max_slices)
    step_ids = df["step"] if "step" in df else pd.Series(np.arange(len(df)))
    w = df["duration_s"].to_numpy(dtype=float)
    wsum = pd.Series(w).groupby(g).sum().to_numpy()
    out = pd.DataFrame({"start_s": df["start_s"].groupby(g).first().to_numpy(),
                        "end_s": (df["start_s"] + df["duration_s"]).groupby(g).last().to_numpy(),
                        "num_steps": pd.Series(g).groupby(g).size().to_numpy(),
                        "first_step": step_ids.groupby(g).first().to_numpy(),
                        "last_step": step_ids.groupby(g).last().to_numpy(),
                        "batch_size": df["batch_size"].groupby(g).mean().to_numpy()})
    out["duration_s"] = out["end_s"] - out["start_s"]
    for col in ("num_prefill_tokens", "num_decode_tokens", *[c for c in df if c.startswith("time_")]):
        if col in df:
            out[col] = df[col].groupby(g).sum().to_numpy()
    for col in ("kv_usage", *SLOT_COLUMNS.values()):
        if col in df:
            wm = (df[col].to_numpy(dtype=float) * w)
            mean = pd.Series(wm).groupby(g).sum().to_numpy() / np.where(wsum > 0, wsum, 1.0)
            plain = df[col].groupby(g).mean().to_numpy()
            out[col] = np.where(wsum > 0, mean, plain)
    return out


def _engine_events(steps: pd.DataFrame, pid: int, name: str, max_slices: int) -> list[dict]:
    m = _merge_steps(steps, max_slices)
    ts = _us(m["start_s"])
    dur = np.maximum(_us(m["start_s"] + m["duration_s"]) - ts, 0.0)
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "steps"}},
    ]
    parts = [c for c in m if c.startswith("time_") and c.endswith("_s")]
    merged = bool((m["num_steps"] > 1).any())
    arg_cols = {"batch_size_mean" if merged else "batch_size": "batch_size", "prefill_tokens": "num_prefill_tokens",
                "decode_tokens": "num_decode_tokens", **{f"{c[5:-2]}_ms": c for c in parts}}
    arg_cols = {k: c for k, c in arg_cols.items() if c in m}
    vals = {k: m[c].to_numpy(dtype=float) * (1e3 if k.endswith("_ms") else 1.0) for k, c in arg_cols.items()}
    first, last, count = (m[c].to_numpy() for c in ("first_step", "last_step", "num_steps"))
    counts = {"batch_size", "prefill_tokens", "decode_tokens"}  # integers; batch_size_mean (merged steps) is not
    for i in range(len(m)):
        args = {k: (int(round(v[i])) if k in counts else round(float(v[i]), 6)) for k, v in vals.items()}
        if merged:
            args["steps"] = int(count[i])
            label = f"steps {int(first[i])}-{int(last[i])}" if count[i] > 1 else f"step {int(first[i])}"
        else:
            label = f"step {int(first[i])}"
        events.append({"ph": "X", "name": label, "cat": "step", "pid": pid, "tid": 1,
                       "ts": float(ts[i]), "dur": float(dur[i]), "args": args})
    if "kv_usage" in m:
        usage = np.round(m["kv_usage"].to_numpy(dtype=float) * 100, 4)
        events += [{"ph": "C", "name": "KV usage (%)", "pid": pid, "ts": float(t), "args": {"used": float(u)}}
                   for t, u in zip(ts, usage)]
    cols = {k: c for k, c in SLOT_COLUMNS.items() if c in m}
    if cols:
        arr = {k: np.round(m[c].to_numpy(dtype=float), 3) for k, c in cols.items()}
        events += [{"ph": "C", "name": "KV memory (slots)", "pid": pid, "ts": float(ts[i]),
                    "args": {k: float(a[i]) for k, a in arr.items()}} for i in range(len(m))]
    return events


def _request_events(intervals: pd.DataFrame, limit: int) -> tuple[list[dict], int]:
    """Request tracks for the first ``limit`` request ids; returns (events, number of requests shown)."""
    ids = np.sort(intervals["req_id"].unique())[:max(0, limit)]
    if not len(ids):
        return [], 0
    iv = intervals[intervals["req_id"].isin(ids) & (intervals["end_s"] > intervals["start_s"])]
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": REQUESTS_PID, "tid": 0, "args": {"name": "requests"}},
        {"ph": "M", "name": "process_sort_index", "pid": REQUESTS_PID, "tid": 0, "args": {"sort_index": 1 << 20}},
    ]
    for r in ids:  # names, and an explicit order (viewers would otherwise sort "req 10" before "req 2")
        events.append({"ph": "M", "name": "thread_name", "pid": REQUESTS_PID, "tid": int(r) + 1,
                       "args": {"name": f"req {int(r)}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": REQUESTS_PID, "tid": int(r) + 1,
                       "args": {"sort_index": int(r)}})
    ts = _us(iv["start_s"])
    dur = np.maximum(_us(iv["end_s"]) - ts, 0.0)
    for rid, phase, t, d in zip(iv["req_id"].to_numpy(), iv["phase"].astype(str).to_numpy(), ts, dur):
        events.append({"ph": "X", "name": phase, "cat": "request", "pid": REQUESTS_PID, "tid": int(rid) + 1,
                       "ts": float(t), "dur": float(d)})
    return events, len(ids)


def trace_events(steps: pd.DataFrame, intervals: pd.DataFrame | None, request_limit: int = DEFAULT_REQUEST_LIMIT,
                 max_step_slices: int = DEFAULT_STEP_SLICES, name: str = "kvsim") -> dict:
    """The trace as a JSON-ready dict (see the module docstring)."""
    events: list[dict] = []
    engines = list(steps.groupby("replica", sort=True)) if "replica" in steps else [(None, steps)]
    for i, (replica, df) in enumerate(engines):
        label = f"engine (replica {replica})" if replica is not None else "engine"
        events += _engine_events(df, i + 1, label, max_step_slices)
    total_requests = 0 if intervals is None else int(intervals["req_id"].nunique())
    shown = 0
    if intervals is not None and len(intervals):
        req_events, shown = _request_events(intervals, request_limit)
        events += req_events
    other = {"run": name, "steps": int(len(steps)), "max_step_slices": int(max_step_slices),
             "requests": total_requests, "requests_shown": shown}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace_events(path: Path, steps: pd.DataFrame, intervals: pd.DataFrame | None,
                       request_limit: int = DEFAULT_REQUEST_LIMIT, max_step_slices: int = DEFAULT_STEP_SLICES,
                       name: str = "kvsim") -> Path:
    """Write the trace to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    trace = trace_events(steps, intervals, request_limit, max_step_slices, name)
    return write_atomic(Path(path), lambda p: p.write_text(json.dumps(trace, separators=(",", ":"))))
