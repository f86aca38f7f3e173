"""The compiled engine core: a single engine's whole run in sim/csrc/core.c, where the scenario is one it
covers, with the results of sim/engine.py's SimPy loop bit for bit.

Covered (``core_supported``): continuous batching under FCFS with recompute preemption, the paged
manager without prefix caching, requests of one sequence outside shared-prefix groups, the cost model as
executor. There a step costs about a microsecond instead of tens: the requests'
state lives in typed arrays, each step is planned, priced, updated and recorded without a Python object,
and only the executor's per-size terms (on the first step of each size), the recorder (a chunk of rows at
a time) and the progress bar are called back. Everything else (clusters, other policies, swap, prefix
caching, forks, the GPU executor) runs the SimPy loop. ``KVSIM_CORE=0`` (or ``KVSIM_NATIVE=0``, or
``enabled = False`` here) runs the SimPy loop for every scenario: tests/test_engine_core.py compares them.

The core knows what a request's arrival does (the output cap, the reasons to reject it) only as flags:
``prepare`` applies them to the requests as ``add_request`` would, the core says when each was handed over.
After the run ``write_back`` puts the requests' counters and times, the timeline's state changes, the
inter-token gaps and the manager's sums and peaks where the SimPy loop would have left them, so the
summary and tables are built by the same code either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import KvsimError
from sim.executors.cost_model import BREAKDOWN_PARTS, CostModelExecutor
from sim.kv.manager import KVCacheManager
from sim.metrics import STEP_COLUMNS, Columns, Recorder
from sim.native import native
from sim.request import Request, RequestStatus
from sim.sched.continuous import ContinuousScheduler

enabled = os.environ.get("KVSIM_CORE", "1") != "0"
PROGRESS_EVERY = 500   # steps between two calls of the progress callback (as the SimPy loop's bar reads)


def core_supported(scheduler: Any, manager: Any, executor: Any, requests: list[Request]) -> bool:
    """Whether the compiled core runs this engine (the module docstring lists what it covers)."""
    if not enabled or native is None or not hasattr(native, "run_core"):
        return False
    cfg = scheduler.config
    if (type(scheduler) is not ContinuousScheduler or cfg.policy != "fcfs" or cfg.preemption != "recompute"
            or getattr(cfg, "batching", "continuous") != "continuous"):
        return False
    if type(manager) is not KVCacheManager or manager.prefix_cache is not None:
        return False
    if type(executor) is not CostModelExecutor or executor._native_consts is None:
        return False
    return all(r.n == 1 and r.beam_width == 1 and r.prefix_group < 0 for r in requests)


@dataclass
class CoreRun:
    """What the engine loop reports besides its results: steps taken and the events it waited on."""

    steps: int
    waits: int


def prepare(requests: list[Request], scheduler: ContinuousScheduler) -> np.ndarray:
    """Apply ``add_request``'s output cap to every request (counting the truncated) and return which would
    be queued (1) or rejected (0) when handed over: both depend on the request and the settings only.
    Each rejected request gets its reason now (its status and time when handed over)."""
    n = len(requests)
    prompt = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=n)
    out = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n)
    mml = scheduler.max_model_len
    capped = np.where((prompt + out > mml) & (prompt < mml), mml - prompt, out)
    for i in np.flatnonzero(capped != out).tolist():
        requests[i].output_len = int(capped[i])
        scheduler.num_truncated += 1
    mgr = scheduler.manager
    budget = scheduler.max_num_batched_tokens
    need = -(-(prompt + capped - 1) // mgr.block_size)
    bad = (prompt >= mml) | (need > mgr.num_blocks) | (budget < 1)
    if not scheduler.config.chunked_prefill:
        bad |= prompt > budget
    for i in np.flatnonzero(bad).tolist():
        reason = scheduler.reject_reason(requests[i])
        if not reason:
            raise AssertionError(f"engine core: request {requests[i].req_id} flagged as rejected without a reason")
        requests[i].reject_reason = reason
    return (~bad).astype(np.int64)


def _pricing(ex: CostModelExecutor) -> tuple[tuple, Callable[[int, int, bool], tuple]]:
    """(the constants of ``CostModelExecutor.execute`` in core.c's order, the per-size terms' function)."""
    p = ex.params
    head = (ex._layers, ex._attn_new_bytes, ex._attn_flops_per_pair, ex._attn_peak, ex._attn_bw, ex._attn_kv_s,
            p.kernel_latency_s)
    e = ex.engine
    if e is not None:
        consts = (1, *head, ex._eng_half, ex._eng_kv_s, ex._eng_qo_s, e.sampler_s, e.step_gap_s,
                  1.0 if e.overlap_cpu else 0.0)
        return consts, ex._engine_fixed

    def linear_terms(tokens: int, seqs: int, _has_prefill: bool) -> tuple[float, float]:
        lin, comm = ex._linear(tokens)
        return lin + ex._lm_head(seqs), comm

    consts = (0, *head, ex._attn_seq, ex._attn_pre_seq, ex._elem_s_per_token, ex._elem_fixed, ex._overhead)
    return consts, linear_terms


@dataclass
class EngineParts:
    """What the core runs one engine with: its requests (in the order they are handed to it), scheduler,
    executor and recorder, and its loop's settings."""

    requests: list[Request]
    scheduler: ContinuousScheduler
    executor: CostModelExecutor
    recorder: Recorder
    async_scheduling: bool
    max_stall: int
    check_integrity: bool = False


def run_core(requests: list[Request], scheduler: ContinuousScheduler, executor: CostModelExecutor,
             recorder: Recorder, *, arrival_delay_s: float, async_scheduling: bool, max_stall: int,
             progress: Callable[[int], None] | None = None, check_integrity: bool = False) -> CoreRun:
    """Run the engine over ``requests`` (handed over at arrival + ``arrival_delay_s``); ``progress`` is
    called every ``PROGRESS_EVERY`` steps with the requests finished or rejected so far;
    ``check_integrity`` checks the KV and scheduler invariants after every step (an AssertionError)."""
    parts = EngineParts(requests, scheduler, executor, recorder, async_scheduling, max_stall, check_integrity)
    return run_engines(requests, [0] * len(requests), [parts], arrival_delay_s, progress)[0]


def run_engines(requests: list[Request], dest: list[int], engines: list[EngineParts], lag: float,
                progress: Callable[[int], None] | None = None) -> list[CoreRun]:
    """Several engines fed by one arrival process: ``requests`` in hand-over order, request g handed to
    ``engines[dest[g]]`` at its arrival + ``lag`` (as a cluster's router made the choices ahead); each
    engine's ``requests`` are its own, in the same order. Errors are raised as the SimPy loop raises them."""
    n = len(requests)
    where = np.asarray(dest, dtype=np.int64)
    local = np.zeros(n, dtype=np.int64)
    for e in range(len(engines)):
        mine = np.flatnonzero(where == e)
        local[mine] = np.arange(len(mine), dtype=np.int64)
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    specs, outs = [], []
    for parts in engines:
        spec, out = _engine_spec(parts)
        specs.append(spec)
        outs.append(out)
    results = native.run_core(n, arrival, where, local, float(lag), progress, PROGRESS_EVERY, specs)
    for parts, (err, _, _) in zip(engines, results):
        _raise(err, parts.scheduler)
    runs = []
    for parts, (counters, times), (_, records, totals) in zip(engines, outs, results):
        write_back(parts.requests, parts.scheduler, counters, times, records, totals)
        runs.append(CoreRun(steps=totals[5], waits=totals[6]))
    return runs


def _engine_spec(parts: EngineParts) -> tuple[tuple, tuple[np.ndarray, np.ndarray]]:
    """(core.c's tuple for one engine, its counters and times arrays, filled by the run)."""
    requests, scheduler, recorder = parts.requests, parts.scheduler, parts.recorder
    n = len(requests)
    mgr = scheduler.manager
    cfg = scheduler.config
    ints = np.empty((4, n), dtype=np.int64)
    ints[0] = np.fromiter((r.req_id for r in requests), dtype=np.int64, count=n)
    ints[1] = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=n)
    ints[3] = prepare(requests, scheduler)
    ints[2] = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n)
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    settings = (mgr.block_size, mgr.num_blocks, cfg.max_num_seqs, scheduler.max_num_batched_tokens,
                int(cfg.chunked_prefill), int(parts.async_scheduling), int(cfg.victim == "most_generated"),
                parts.max_stall, mgr.pool.num_free, int(parts.check_integrity))
    consts, terms = _pricing(parts.executor)
    width, chunk = len(STEP_COLUMNS), Columns.CHUNK_ROWS

    def sink(main: memoryview, breakdown: memoryview, m: int) -> None:
        rows = np.frombuffer(main, dtype=np.float64).reshape(width, chunk)[:, :m]
        bd = np.frombuffer(breakdown, dtype=np.float64).reshape(len(BREAKDOWN_PARTS), chunk)[:, :m]
        recorder.record_columns(rows, dict(zip(BREAKDOWN_PARTS, bd)))

    counters = np.empty((5, n), dtype=np.int64)
    times = np.empty((5, n), dtype=np.float64)
    return (n, ints, arrival, settings, consts, terms, sink, chunk, counters, times), (counters, times)


def _raise(err: tuple, scheduler: ContinuousScheduler) -> None:
    """The SimPy loop's errors, with its messages."""
    kind, t, d, step, waiting, running, stall = err
    if kind == 1:
        raise KvsimError("engine", f"deadlock at t={t:.3f}s: {waiting} waiting, {running} running, nothing can be "
                         "scheduled")
    if kind == 2:
        raise KvsimError("executor", f"step {step} returned a non-positive duration {d}")
    if kind == 3:
        raise KvsimError("engine", f"no progress for {stall} steps at t={t:.3f}s ({waiting} waiting, {running} "
                         "running): livelock")


def write_back(requests: list[Request], scheduler: ContinuousScheduler, counters: np.ndarray, times: np.ndarray,
               records: tuple, totals: tuple) -> None:
    """The core's results where the SimPy loop leaves them: requests, timeline, gaps, manager counters."""
    tr_rid, tr_time, tr_phase, gap_d, gap_n, other = records
    tr = scheduler.transitions
    tr.req_id.frombytes(tr_rid)
    tr.time.frombytes(tr_time)
    tr.phase.frombytes(tr_phase)
    gaps = scheduler.gaps
    gaps.step_gaps.durations.frombytes(gap_d)
    gaps.step_gaps.counts.frombytes(gap_n)
    gaps.other_gaps.frombytes(other)
    preemptions, peak_used, peak_logical, sum_used, sum_logical, _, _ = totals
    scheduler.num_preemptions += preemptions
    mgr: KVCacheManager = scheduler.manager
    mgr.peaks["used"] = max(mgr.peaks["used"], peak_used)
    mgr.peaks["logical"] = max(mgr.peaks["logical"], peak_logical)
    mgr._sum_used += sum_used
    mgr._sum_logical += sum_logical
    status = [RequestStatus(s) for s in range(6)]
    rejected = RequestStatus.REJECTED
    finished, refused = scheduler.finished, scheduler.rejected
    for req, st, comp, gen, pre, int_zero, sched_s, first, last, fin, rej in zip(
            requests, *counters.tolist(), *times.tolist()):
        # a time taken while SimPy's clock was still its initial int 0 is that int (a column of them only is
        # an int column)
        if rej == rej:   # handed over and rejected (not NaN)
            req.status = rejected
            req.finish_s = 0 if int_zero & 2 else rej
            refused.append(req)
            continue
        req.status = status[st]
        req.num_computed_tokens = comp
        req.num_generated = gen
        req.num_preemptions = pre
        req.first_scheduled_s = 0 if int_zero & 1 else sched_s
        req.first_token_s = first
        req.last_token_s = last
        req.finish_s = fin
        if req.status == RequestStatus.FINISHED:
            finished.append(req)
