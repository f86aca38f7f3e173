"""Recorder: one array per column while running; DataFrames and the summary at the end.

Summary definitions (vLLM benchmark names):
- TTFT = first token time - arrival; TPOT = (finish - first token) / (output tokens - 1), requests with
  more than one output token; ITL = every gap between consecutive tokens of a request; E2E = finish - arrival;
  normalized latency = E2E / output tokens (the PagedAttention paper's metric).
- KV usage and the memory breakdown are averaged over steps weighted by step duration (engine busy time).
- Fairness: Jain's index of normalized latency, (sum x)^2 / (n sum x^2), 1 when all equal;
  queue wait = first scheduled - arrival.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from sim.native import native
from sim.request import Request, RequestStatus
from sim.sched.plan import StepPlan, StepResult

STEP_COLUMNS = [
    "start_s", "duration_s", "batch_size", "num_prefill_tokens", "num_decode_tokens", "num_running",
    "num_waiting", "num_swapped", "kv_blocks_used", "num_preempted", "blocks_swapped_out", "blocks_swapped_in",
    "blocks_copied", "slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag",
    "slots_free",
]
BREAKDOWN_KEYS = ["token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free"]


INT_COLUMNS = [c for c in STEP_COLUMNS if c not in ("start_s", "duration_s")]
# the per-step columns the summary reads (a run that keeps no per-step table reads only these)
SUMMARY_STEP_COLUMNS = ["duration_s", "kv_blocks_used", "kv_usage", "slots_token_states", "slots_reserved",
                        "slots_internal_frag", "slots_external_frag", "slots_free"]
_INT_ROWS = [c in INT_COLUMNS for c in STEP_COLUMNS]
_KV_ROW = STEP_COLUMNS.index("kv_blocks_used")


class Columns:
    """Growable float64 columns; integers up to 2**53 are exact.

    Rows live in chunks of ``CHUNK_ROWS`` rows, column-major (a column's stretch is contiguous), from
    ``np.zeros`` (pages zeroed lazily), filled in append order. ``append`` queues one row as a tuple (far
    cheaper than writing one numpy row); queued rows are written when a run follows them (one or two: row
    by row; more: as one block, one ``fromiter``), when ``ROWS_QUEUED`` are queued, or before a read.
    ``extend`` writes the rows of a decode run column by column (arrays of its length, or scalars: a 0
    is already there) straight into the chunk: each row is copied once while recording, once more when
    read."""

    CHUNK_ROWS = 8192
    ROWS_QUEUED = 1024

    def __init__(self, width: int) -> None:
        self.width = width
        self._chunks: list[np.ndarray] = []   # (width, CHUNK_ROWS) each, oldest first; the last is filling
        self._fill = self.CHUNK_ROWS          # rows used in the last chunk (none yet: full)
        self._written = 0                     # rows in the chunks
        self._rows: list[tuple] = []          # queued single rows, oldest first
        self._released = False                # the rows were handed over by ``read(release=True)``
        self.on_full: Callable[[], None] | None = None   # called when a chunk has filled (the next starts)

    @property
    def n(self) -> int:
        return self._written + len(self._rows)

    def append(self, row: tuple) -> None:
        rows = self._rows
        rows.append(row)
        if len(rows) >= self.ROWS_QUEUED:
            self._write_rows()

    def extend(self, cols: list, m: int | None = None) -> None:
        """Add ``m`` rows given column by column (arrays of length m, or scalars; without ``m``, the first
        one an array)."""
        if m is None:
            m = len(cols[0])
        rows = self._rows
        r = len(rows)
        fill = self._fill
        if r <= 2 and fill + r + m <= self.CHUNK_ROWS:   # the usual case: room in the last chunk
            chunk = self._chunks[-1]
            if r:   # the run's last step, and a step between runs
                if native is not None and native.put_rows(chunk, fill, rows):
                    fill += r
                else:
                    for row in rows:
                        chunk[:, fill] = row
                        fill += 1
                rows.clear()
            self._fill = fill + m
            self._written += r + m
            if native is not None and native.put_columns(chunk, fill, m, cols):
                return
            view = chunk[:, fill:fill + m]
            for i, c in enumerate(cols):
                if isinstance(c, np.ndarray) or c:   # (a scalar 0 is already there)
                    view[i] = c
            return
        self._write_rows()
        done = 0
        while done < m:
            chunk, at, take = self._room(m - done)
            if take == m and native is not None and native.put_columns(chunk, at, m, cols):
                return
            for i, c in enumerate(cols):
                if isinstance(c, np.ndarray):
                    chunk[i, at:at + take] = c[done:done + take] if take < m else c
                elif c:   # (a scalar 0 is already there)
                    chunk[i, at:at + take] = c
            done += take

    def _room(self, m: int) -> tuple[np.ndarray, int, int]:
        """(the chunk to write into, its first free row, rows to write there: at most ``m``), the rows
        counted as written."""
        if self._fill == self.CHUNK_ROWS:
            self._chunks.append(np.zeros((self.width, self.CHUNK_ROWS), dtype=np.float64))
            self._fill = 0
            if self.on_full is not None and len(self._chunks) > 1:
                self.on_full()
        at = self._fill
        take = min(m, self.CHUNK_ROWS - at)
        self._fill = at + take
        self._written += take
        return self._chunks[-1], at, take

    def _write_rows(self) -> None:
        """Write the queued single rows into the chunks."""
        rows = self._rows
        r = len(rows)
        if not r:
            return
        if native is not None:   # (compiled: from the tuples straight into the chunks)
            done = 0
            while done < r:
                chunk, at, take = self._room(r - done)
                part = rows if take == r else rows[done:done + take]
                if not native.put_rows(chunk, at, part):
                    raise ValueError("a recorded row is not as wide as the table, or not all numbers")
                done += take
            rows.clear()
            return
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float64, count=r * self.width)
        block = flat.reshape(r, self.width).T
        rows.clear()
        done = 0
        while done < r:
            chunk, at, take = self._room(r - done)
            chunk[:, at:at + take] = block[:, done:done + take]
            done += take

    def _filled(self) -> list[np.ndarray]:
        """The chunks, each cut to its rows (views), after writing the queued rows."""
        self._write_rows()
        self._check_held()
        chunks = self._chunks
        if not chunks:
            return []
        return [*chunks[:-1], chunks[-1][:, :self._fill]]

    def read(self, dtypes: list, release: bool = False) -> list[np.ndarray]:
        """Every column as a new array of its dtype in ``dtypes`` (``read_into`` new arrays)."""
        out = [np.empty(self.n, dtype=dt) for dt in dtypes]
        self.read_into(out, release)
        return out

    def read_into(self, out: list[np.ndarray | None], release: bool = False) -> None:
        """Write every column into the array of ``out`` at its position (each ``n`` long, floats cast as
        ``astype`` casts them; None: that column is skipped), chunk by chunk (no joined copy of the whole
        table). ``release``: drop each chunk once read, so the table is never held twice; the columns are
        empty afterwards (``n`` still counts the rows)."""
        chunks = self._filled()
        if release:
            self._chunks = []
            self._released = True
            chunks.reverse()   # oldest last: pop() hands each chunk over and drops the list's reference
        at = 0
        for j in range(len(chunks)):
            chunk = chunks.pop() if release else chunks[j]
            m = chunk.shape[1]
            for i, col in enumerate(out):
                if col is not None:
                    col[at:at + m] = chunk[i]
            at += m
            del chunk

    def full_chunks(self) -> int:
        """Chunks that have filled: their rows no longer change."""
        return max(0, len(self._chunks) - 1) if self._fill < self.CHUNK_ROWS else len(self._chunks)

    def full_chunk(self, i: int) -> np.ndarray:
        """Chunk ``i``, one of the ``full_chunks`` (no queued row is written: safe inside ``on_full``)."""
        if i >= self.full_chunks():
            raise IndexError(f"chunk {i} has not filled")
        return self._chunks[i]

    def chunks(self) -> list[np.ndarray]:
        """Every chunk cut to its rows (views), after writing the queued rows: the filled ones first."""
        return self._filled()

    def _check_held(self) -> None:
        if self._released:
            raise RuntimeError("the rows were released to a table (read(release=True)); they cannot be read again")

    def column(self, i: int) -> np.ndarray:
        chunks = self._filled()
        if not chunks:
            return np.empty(0, dtype=np.float64)
        return np.concatenate([c[i] for c in chunks])


class Recorder:
    """Collects step rows into columns (cheap in the hot loop); builds DataFrames once at the end.

    ``record_step`` adds one step; ``record_run`` adds the rows of a multi-step decode run at once
    (sim/sched/decode_run.py): the table is per step either way."""

    def __init__(self, num_gpu_blocks: int, capacity_slots: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.capacity_slots = capacity_slots
        self.cols = Columns(len(STEP_COLUMNS))
        self.breakdown_keys: list[str] = []
        self.breakdown: Columns | None = None
        self._stream: Any = None            # a StepTableStream fed each chunk as it fills (``stream_to``)
        self._stream_breakdown: bool | None = None   # whether it carries the breakdown (fixed at its first chunk)
        self._streamed = 0                  # chunks handed to it
        self._block_bytes = 0

    @property
    def num_steps(self) -> int:
        return self.cols.n

    def record_step(self, start: float, plan: StepPlan, result: StepResult, sched) -> None:
        st = sched.stats
        mgr = sched.manager
        self.cols.append((
            start, result.duration_s, len(plan.scheduled), st.num_prefill_tokens, st.num_decode_tokens,
            len(sched.running), sched.num_waiting(), sched.num_swapped(), mgr.num_blocks - mgr.num_free_blocks(),
            st.num_preempted, len(plan.blocks_to_swap_out), len(plan.blocks_to_swap_in), len(plan.blocks_to_copy),
            *mgr.memory_slots(),
        ))
        bd = result.breakdown
        if bd:
            if self.breakdown is None:
                self._start_breakdown(list(bd))
            try:
                row = self._breakdown_row(bd)
            except KeyError:   # a step without some key of the first one: 0.0 there
                row = tuple(bd.get(k, 0.0) for k in self.breakdown_keys)
            self.breakdown.append(row)

    def _start_breakdown(self, keys: list[str]) -> None:
        """The breakdown columns are the keys of the first step that has a breakdown, in its order."""
        self.breakdown_keys = keys
        self.breakdown = Columns(len(keys))
        if self._stream is not None:
            self.breakdown.on_full = self._send_full
        # a tuple of the values in ``keys`` order (itemgetter of one key returns the bare value)
        self._breakdown_row = operator.itemgetter(*keys) if len(keys) > 1 else lambda bd: (bd[keys[0]],)

    def record_run(self, starts: np.ndarray, durations: np.ndarray, *, batch_size: int, num_decode_tokens: int,
                   num_running: int, num_waiting: int, num_swapped: int, kv_blocks_used: np.ndarray,
                   slots: tuple, breakdown: dict[str, np.ndarray]) -> None:
        """Rows of ``len(starts)`` all-decode steps (no prefill, preemption, swap or copy)."""
        m = len(starts)
        self.cols.extend([starts, durations, batch_size, 0, num_decode_tokens, num_running, num_waiting,
                          num_swapped, kv_blocks_used, 0, 0, 0, 0, *slots])
        self._extend_breakdown(breakdown, m)

    def record_columns(self, rows: np.ndarray, breakdown: dict[str, np.ndarray]) -> None:
        """Steps given as columns: ``rows`` (one row per column of ``STEP_COLUMNS``, in its order, one column
        a step) and the breakdown's arrays (sim/engine_core.py hands over a chunk of steps at a time)."""
        m = rows.shape[1]
        self.cols.extend(list(rows), m)
        self._extend_breakdown(breakdown, m)

    def _extend_breakdown(self, breakdown: dict[str, Any], m: int) -> None:
        """The breakdown of ``m`` steps just recorded (arrays of m, or numbers)."""
        if breakdown:
            if self.breakdown is None:
                self._start_breakdown(list(breakdown))
            self.breakdown.extend([breakdown[k] if k in breakdown else 0.0 for k in self.breakdown_keys], m)

    def stream_to(self, stream: Any, block_bytes: int) -> None:
        """Hand every chunk of rows to ``stream`` (sim/step_stream.py) as it fills, as the per-step table's
        columns (``kv_bytes_used`` from ``block_bytes`` a block); ``finish_stream`` hands over the rest."""
        self._stream = stream
        self._block_bytes = block_bytes
        self.cols.on_full = self._send_full
        if self.breakdown is not None:
            self.breakdown.on_full = self._send_full

    def _send_full(self) -> None:
        """Send the chunks filled in every streamed column set (the breakdown's once its rows catch up)."""
        if self._stream_breakdown is None:
            # fixed at the first chunk: the breakdown columns go along if they have started. The table has them
            # only if every step has a breakdown; where that turns out otherwise, the stream is not the table
            # (``finish_stream`` and the stream's ``close`` find so) and the table is written after the run
            self._stream_breakdown = self.breakdown is not None
        ready = self.cols.full_chunks()
        if self._stream_breakdown:
            ready = min(ready, self.breakdown.full_chunks())
        while self._streamed < ready:
            i = self._streamed
            self._send(self.cols.full_chunk(i), self.breakdown.full_chunk(i) if self._stream_breakdown else None, i)
            self._streamed += 1

    def finish_stream(self) -> None:
        """Hand the stream the rows not sent yet (the run is over) and mark it complete where the streamed
        columns are the table's (``step_names``)."""
        if self._stream is None:
            return
        if self._stream_breakdown is None:
            self._stream_breakdown = self.breakdown is not None and self.breakdown.n == self.cols.n
        main = self.cols.chunks()
        extra = self.breakdown.chunks() if self._stream_breakdown else None
        aligned = extra is None or (len(extra) == len(main) and all(
            a.shape[1] == b.shape[1] for a, b in zip(main[self._streamed:], extra[self._streamed:])))
        if aligned:
            for i in range(self._streamed, len(main)):
                self._send(main[i], extra[i] if extra is not None else None, i)
            self._streamed = len(main)
            self._stream.mark_complete(self.cols.n)
        self._stream = None

    def _send(self, main: np.ndarray, breakdown: np.ndarray | None, i: int) -> None:
        from sim.step_stream import step_chunk_columns

        names = ["step", *STEP_COLUMNS, "end_s", "kv_usage"]
        if breakdown is not None:
            names += [f"time_{k}_s" for k in self.breakdown_keys]
        names.append("kv_bytes_used")
        first = i * Columns.CHUNK_ROWS
        self._stream.put(names, step_chunk_columns(main, breakdown, first, _INT_ROWS, _KV_ROW, self.num_gpu_blocks,
                                                   self._block_bytes))

    def step_names(self) -> list[str]:
        """The per-step table's columns after ``step``, in order: the breakdown's only when every step has one."""
        names = [*STEP_COLUMNS, "end_s", "kv_usage"]
        bd = self.breakdown
        if bd is not None and bd.n == self.cols.n:
            names += [f"time_{k}_s" for k in self.breakdown_keys]
        return names

    def read_steps(self, out: dict[str, np.ndarray], at: int, release: bool = False) -> None:
        """Write the per-step table's columns (``step_names``) that ``out`` has into rows ``at:at + num_steps``
        of its arrays (int64 for ``INT_COLUMNS``, float64 for the rest); ``end_s`` needs ``start_s`` and
        ``duration_s``, ``kv_usage`` needs ``kv_blocks_used``. ``release``: as ``steps_frame``."""
        n = self.cols.n
        rows = slice(at, at + n)
        self.cols.read_into([out[name][rows] if name in out else None for name in STEP_COLUMNS], release=release)
        if "end_s" in out:
            np.add(out["start_s"][rows], out["duration_s"][rows], out=out["end_s"][rows])
        if "kv_usage" in out:
            np.divide(out["kv_blocks_used"][rows], self.num_gpu_blocks, out=out["kv_usage"][rows])
        breakdown = self.step_names()[len(STEP_COLUMNS) + 2:]
        if any(name in out for name in breakdown):
            self.breakdown.read_into([out[name][rows] if name in out else None for name in breakdown],
                                     release=release)

    def steps_frame(self, release: bool = False, names: list[str] | None = None) -> pd.DataFrame:
        """The per-step table (``names``: only these of its columns, ``step`` always). ``release``: hand the
        recorded rows over to the table (each block of rows is dropped once copied, so they are never held
        twice); the recorder is empty afterwards."""
        n = self.cols.n
        data = {"step": np.arange(n, dtype=np.int64)}
        data.update((name, np.empty(n, dtype=step_dtype(name))) for name in self.step_names()
                    if names is None or name in names)
        self.read_steps(data, 0, release=release)
        return pd.DataFrame(data, copy=False)


def step_dtype(name: str) -> type:
    """The dtype of a per-step column (``Recorder.steps_frame``)."""
    return np.int64 if name in INT_COLUMNS else np.float64


def requests_frame(requests: list[Request], output_latency_s: float = 0.0,
                   token_latency_s: float = 0.0) -> pd.DataFrame:
    """One row per request, in req_id order.

    Latencies are as a client sees them: ``output_latency_s`` (the frontend's detokenisation and
    streaming) is added to the first token and to the finish, and ``token_latency_s`` per output token
    after the first to the finish. ``first_token_s`` and ``finish_s`` stay engine times. (The frontend's
    input latency already delays the engine's arrival, so it is inside both.)"""
    # one column at a time (a list of one attribute, then its array), never a list per column at once;
    # np.array infers what pandas infers from such a list (int64 for ints, float64 for floats and NaN)
    status_name = {int(st): st.name for st in RequestStatus}
    cols: dict[str, Any] = {}
    for name, attr in (("req_id", "req_id"), ("arrival_s", "arrival_s"), ("prompt_tokens", "prompt_len"),
                       ("output_tokens", "output_len"), ("n", "n"), ("priority", "priority"), ("status", "status"),
                       ("first_scheduled_s", "first_scheduled_s"), ("first_token_s", "first_token_s"),
                       ("finish_s", "finish_s"), ("num_preemptions", "num_preemptions"),
                       ("num_cached_tokens", "num_cached_tokens"), ("reject_reason", "reject_reason")):
        if attr == "status":
            vals = [status_name[r.status] for r in requests]
        else:
            vals = [getattr(r, attr) for r in requests]
        if not vals:   # no requests: pandas' own dtypes for empty lists
            cols[name] = vals
        elif attr in ("status", "reject_reason"):
            cols[name] = pd.array(vals, dtype="str")
        else:
            cols[name] = np.array(vals)
        del vals
    return with_latencies(cols, output_latency_s, token_latency_s)


def with_latencies(cols: dict[str, Any], output_latency_s: float = 0.0, token_latency_s: float = 0.0) -> pd.DataFrame:
    """``requests_frame``'s table from its first columns (req_id ... reject_reason, taken over): the
    client-side latencies added."""
    df = pd.DataFrame(cols, copy=False)
    cols.clear()
    done = df["status"] == "FINISHED"
    first = df["first_token_s"] + output_latency_s
    finish = df["finish_s"] + output_latency_s + token_latency_s * (df["output_tokens"] - 1).clip(lower=0)
    df["ttft_s"] = (first - df["arrival_s"]).where(done)
    df["e2e_s"] = (finish - df["arrival_s"]).where(done)
    multi = done & (df["output_tokens"] > 1)
    df["tpot_s"] = ((finish - first) / (df["output_tokens"] - 1)).where(multi)
    df["queue_wait_s"] = (df["first_scheduled_s"] - df["arrival_s"]).where(done)
    df["normalized_latency_s_per_tok"] = (df["e2e_s"] / df["output_tokens"]).where(done)
    return df


def _stats(x: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    x = np.asarray(x, dtype=float)
    if weights is None:
        x = x[~np.isnan(x)]
        if x.size == 0:
            return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
        p50, p90, p99 = np.percentile(x, [50, 90, 99])
        return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}
    if weights.sum() == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    xs, ws = _sorted_pairs(x, weights)
    cum = np.cumsum(ws)
    total = cum[-1]

    def q(p: float) -> float:  # the lower weighted percentile (inverted CDF, as numpy's "inverted_cdf")
        return float(xs[np.searchsorted(cum, p * total, side="left")])

    return {"mean": float((xs * ws).sum() / total), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def _sorted_pairs(x: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``weights`` in the order of ``np.argsort(x, kind="stable")``. Where the values repeat (a
    run's step durations: one distinct value in 5 to 20 steps), the compiled ``sort_pairs``
    groups them in linear time, the same order exactly; else (or without it) numpy sorts."""
    if native is not None and len(x) >= 4096 and weights.dtype == np.float64:
        xs, ws = np.empty(len(x)), np.empty(len(x))
        if native.sort_pairs(np.ascontiguousarray(x), np.ascontiguousarray(weights), xs, ws, len(x) // 4):
            return xs, ws
    order = np.argsort(x, kind="stable")
    return x[order], weights[order]


def fanout_summary(reqs: pd.DataFrame) -> dict:
    """summary.json's ``fanout`` block: the workload's requests as a client sees them, each with all its
    samples (``add_sample_columns``' table): how many, how many had every sample finish, and over those
    the time to the first sample's first token (``ttft_s``) and to the last sample's finish (``e2e_s``),
    frontend latencies included as in the samples' own columns."""
    whole = reqs.groupby("sample_of", sort=False).agg(
        done=("status", lambda s: bool((s == "FINISHED").all())), ttft=("ttft_s", "min"), e2e=("e2e_s", "max"))
    done = whole[whole["done"]]
    return {"requests": len(whole), "finished": len(done), "ttft_s": _stats(done["ttft"].to_numpy()),
            "e2e_s": _stats(done["e2e"].to_numpy())}


def itl_stats(step_gaps, other_gaps) -> dict[str, float]:
    """Inter-token latency statistics from per-step gap counts plus the irregular gaps.

    ``step_gaps``: (gap, tokens) pairs (a ``StepGaps`` or any iterable of pairs); ``other_gaps``: gaps of
    one token each (an ``array("d")`` or any sequence)."""
    if hasattr(step_gaps, "arrays"):
        durations, counts = step_gaps.arrays()
    else:
        pairs = list(step_gaps)
        durations = np.array([g for g, _ in pairs], dtype=float)
        counts = np.array([c for _, c in pairs], dtype=float)
    others = np.asarray(other_gaps, dtype=float)
    vals = np.concatenate([np.asarray(durations, dtype=float), others])
    w = np.concatenate([np.asarray(counts, dtype=float), np.ones(len(others))])
    return _stats(vals, w)


def jain_index(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0 or not (x**2).sum():
        return math.nan
    return float(x.sum() ** 2 / (x.size * (x**2).sum()))


def summarize(reqs: pd.DataFrame, steps: pd.DataFrame, sched, *, capacity_slots: int, wall_time_s: float,
              prefix_cache_hit_rate: float = 0.0) -> dict[str, Any]:
    """The summary.json mapping (the public summary keys listed in the README, plus fairness and a few counters)."""
    # the finished requests' values column by column (a copy of the whole table would cost its size again)
    finished = (reqs["status"] == "FINISHED").to_numpy(dtype=bool)
    num_finished = int(finished.sum())

    def done(col: str) -> np.ndarray:
        return reqs[col].to_numpy()[finished]

    start = float(reqs["arrival_s"].min()) if len(reqs) else 0.0
    end = float(np.nanmax(reqs["finish_s"].to_numpy(dtype=float))) if num_finished else start
    makespan = max(0.0, end - start)
    out_tokens = int((done("output_tokens") * done("n")).sum())
    w = steps["duration_s"].to_numpy() if len(steps) else np.zeros(0)
    busy = float(w.sum())
    kv_mean = float((steps["kv_usage"] * w).sum() / busy) if busy else 0.0
    slot_cols = ["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag", "slots_free"]
    if busy:   # one column at a time: each a contiguous pairwise sum, as the (steps x 5) column-major sum was
        fr = np.array([(steps[c].to_numpy(dtype=float) * w).sum() for c in slot_cols]) / busy / capacity_slots
    else:
        fr = np.array([0, 0, 0, 0, 1.0])
    queue_wait = pd.Series(done("queue_wait_s"))
    out = {
        "num_requests": int(len(reqs)),
        "num_finished": num_finished,
        "num_rejected": int((reqs["status"] == "REJECTED").sum()),
        "num_truncated": int(sched.num_truncated),
        "makespan_s": makespan,
        "output_throughput_tok_s": out_tokens / makespan if makespan else 0.0,
        "request_throughput": num_finished / makespan if makespan else 0.0,
        "ttft_s": _stats(done("ttft_s")),
        "tpot_s": _stats(done("tpot_s")),
        "itl_s": itl_stats(sched.gaps.step_gaps, sched.gaps.other_gaps),
        "e2e_s": _stats(done("e2e_s")),
        "normalized_latency_s_per_tok": _stats(done("normalized_latency_s_per_tok")),
        "kv_usage_mean": kv_mean,
        "kv_usage_max": float(steps["kv_usage"].max()) if len(steps) else 0.0,
        "memory_breakdown": {k: float(v) for k, v in zip(BREAKDOWN_KEYS, fr)},
        "num_preemptions": int(sched.num_preemptions),
        "prefix_cache_hit_rate": float(prefix_cache_hit_rate),
        "swapped_blocks": int(sched.swapped_blocks),
        "jain_fairness": jain_index(done("normalized_latency_s_per_tok")),
        "queue_wait_max_s": float(queue_wait.max()) if num_finished else math.nan,
        "queue_wait_p99_s": float(np.percentile(queue_wait, 99)) if num_finished else math.nan,
        "busy_time_s": busy,
        "num_steps": int(len(steps)),
        "wall_time_s": wall_time_s,
    }
    if getattr(sched, "timeout_s", None) is not None:   # workload.timeout_s: the requests their clients gave up
        out["num_aborted"] = int((reqs["status"] == "ABORTED").sum())
    if "client_wait_s" in reqs.columns:   # a client with a concurrency limit: how long it held requests back
        out["client_wait_s"] = _stats(reqs["client_wait_s"].to_numpy(dtype=float))
    return out
