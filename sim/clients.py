"""Clients that keep at most ``max_concurrency`` requests in flight (``workload.max_concurrency``).

A benchmark client with a concurrency limit (``vllm bench serve --max-concurrency``, inference-perf's
concurrent load, N users in a loop) sends a request only when one of its N slots is free:

    send(i)  = max(arrival_i, the time a slot is free)      requests in arrival order, slots first come
             (with stages of limits, request i has the slots of the last stage from at most arrival_i)
    slot     taken at send(i), free again a pause after the client has the whole response (think_time_s,
             or with think_time_dist: exponential a draw of that mean, in the order responses complete):
             finish_s + output_latency_s + token_latency_s x (output_tokens - 1), or at once when the
             engine rejects the request
    engine   has request i at send(i) + input_latency_s (the frontend, as for any arrival)

With every arrival at 0 (a burst) this is a closed loop of N users; with arrival times it is an open
loop capped at N in flight, the requests beyond it waiting at the client. A request fanned out into samples
(``scheduler.parallel_sampling: fanout``: consecutive requests of one ``sample_of``) is one request to the
client: its samples are sent together under one slot, which is free again a pause after the last of their
responses is whole. A request's ``arrival_s``
becomes its send time, as a client measures TTFT and E2E from there.

The engines are fed (``Engine.submit``, or a cluster's router; disaggregated, the client's requests
end on a decode replica, or on their prefill replica with one output token) and step one timeout at a time:
a finish may free a slot whose next request reaches an engine within the same step's time, so no step
runs ahead of the clock (no eager steps, no decode runs). Invariant: at most ``max_concurrency`` requests
sent and not yet answered.

What the client held a request back shows in the results (``add_client_waits``): the requests' table's
``client_wait_s`` (send less planned arrival), the summary's ``client_wait_s`` figures and the timeline's
``client`` intervals (planned arrival to send).

The compiled core (sim/engine_core.py, sim/csrc/client.c) runs the same client for one engine or a colocated
pool, with the same results bit for bit, from ``core_client``'s arrays: each request's limit, and the
exponential pauses drawn ahead from the same stream (the k-th answer takes the k-th draw either way).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.engine import Engine
from sim.request import Request

THINK_STREAM = 3   # the scenario seed's stream for the clients' pauses (its own: other draws stay as they were)
Stages = list[tuple[float, int]]   # (from_s, limit), from_s increasing from 0


def stages_of(scn: Any) -> Stages:
    """``workload.max_concurrency`` as stages: one limit is a stage from 0."""
    limits = scn.workload.max_concurrency
    if isinstance(limits, int):
        return [(0.0, limits)]
    return [(step.from_s, step.limit) for step in limits]


def stage_limits(stages: Stages, arrivals: np.ndarray) -> np.ndarray:
    """Each request's limit: that of the last stage from at most its arrival (the first stage's before it)."""
    starts = np.array([f for f, _ in stages], dtype=np.float64)
    at = np.maximum(np.searchsorted(starts, arrivals, side="right") - 1, 0)
    return np.array([n for _, n in stages], dtype=np.int64)[at]


def think_rng(scn: Any) -> np.random.Generator | None:
    """The stream of a scenario's exponential pauses (None: fixed pauses)."""
    return np.random.default_rng([scn.seed, THINK_STREAM]) if scn.workload.think_time_dist == "exponential" else None


def in_send_order(requests: list[Request]) -> bool:
    """Whether ``requests`` are in the order the client sends them (arrival times never decreasing): what the
    compiled core takes them in."""
    return all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))


def planned_arrivals(requests: list[Request]) -> pd.Series:
    """Each request's arrival as the workload planned it (by req_id), before a client sends it."""
    ids = np.fromiter((r.req_id for r in requests), dtype=np.int64, count=len(requests))
    return pd.Series(np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=len(requests)), index=ids)


def add_client_waits(reqs: pd.DataFrame, planned: pd.Series) -> None:
    """The requests' table gets ``client_wait_s``: how long the client held each request back, its send time
    (``arrival_s``, from which its TTFT and E2E count) less its planned arrival (>= 0)."""
    wait = reqs["arrival_s"].to_numpy(dtype=float) - _aligned(planned, reqs["req_id"].to_numpy())
    reqs["client_wait_s"] = np.maximum(wait, 0.0)   # (a send rounds to its planned arrival at worst)


def _aligned(planned: pd.Series, ids: np.ndarray) -> np.ndarray:
    """``planned``'s values for ``ids`` (most often its own order: no lookup then)."""
    if np.array_equal(planned.index.to_numpy(), ids):
        return planned.to_numpy()
    return planned.reindex(ids).to_numpy()


def client_intervals(reqs: pd.DataFrame, planned: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The timeline's ``client`` intervals of the requests held back (``client_wait_s`` > 0): (req_id, planned
    arrival, send), in the table's order."""
    held = reqs["client_wait_s"].to_numpy() > 0
    return (reqs["req_id"].to_numpy()[held], _aligned(planned, reqs["req_id"].to_numpy())[held],
            reqs["arrival_s"].to_numpy(dtype=float)[held])


def with_client_rows(timeline: pd.DataFrame, reqs: pd.DataFrame, planned: pd.Series) -> pd.DataFrame:
    """``timeline`` (sorted by request, then start) with each held-back request's ``client`` interval first
    among its rows (it ends where the request's first row starts, at its send)."""
    ids, start, end = client_intervals(reqs, planned)
    rows = pd.DataFrame({"req_id": ids, "phase": "client", "start_s": start, "end_s": end})
    both = pd.concat([rows, timeline.astype({"phase": str})], ignore_index=True)
    return both.sort_values(["req_id", "start_s"], kind="stable").reset_index(drop=True)


def send_batches(requests: list[Request]) -> list[tuple[int, int]]:
    """The requests (in send order) the client sends together, as index ranges [lo, hi): a fanned-out
    request's samples (consecutive, of one ``sample_of``), else one request each."""
    out: list[tuple[int, int]] = []
    lo = 0
    for i in range(1, len(requests) + 1):
        if i == len(requests) or requests[i].sample_of < 0 or requests[i].sample_of != requests[lo].sample_of:
            out.append((lo, i))
            lo = i
    return out


def core_client(scn: Any, requests: list[Request], output_latency_s: float, token_latency_s: float) -> tuple:
    """The client of ``scn`` as the compiled core reads it (sim/csrc/client.h), over ``requests`` in send order:
    (each request's limit, the pauses in answer order or None, the fixed pause, the output latencies, where
    samples are sent together each request's batch's first one, else None, and the timeout, 0 for none)."""
    arrivals = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=len(requests))
    rng = think_rng(scn)
    pauses = None if rng is None else rng.exponential(scn.workload.think_time_s, size=len(requests))
    batches = send_batches(requests)
    leads = None
    if len(batches) < len(requests):
        leads = np.repeat(np.array([lo for lo, _ in batches], dtype=np.int64),
                          np.array([hi - lo for lo, hi in batches], dtype=np.int64))
    return (stage_limits(stages_of(scn), arrivals), pauses, float(scn.workload.think_time_s),
            float(output_latency_s), float(token_latency_s), leads, float(scn.workload.timeout_s or 0.0))


class ClientPool:
    """Feeds ``engines`` (one, a colocated pool's behind ``deliver``, its router, or a prefill pool's with
    the decode pool its handoff feeds) with ``requests`` in arrival order, at most ``max_concurrency`` in
    flight."""

    def __init__(self, engines: list[Engine], deliver: Callable[[Request], None], requests: list[Request],
                 max_concurrency: int | Stages, think_time_s: float = 0.0, input_latency_s: float = 0.0,
                 output_latency_s: float = 0.0, token_latency_s: float = 0.0,
                 fed: list[Engine] | None = None,
                 answers: list[Callable[[Request], bool] | None] | None = None,
                 think_rng: np.random.Generator | None = None, timeout_s: float | None = None) -> None:
        self.env: simpy.Environment = engines[0].env
        self.engines = engines
        self.deliver = deliver    # hands a request to an engine (Engine.submit, or a router's choice)
        # the engines the client feeds (told when no more will come; default: all); the others are fed by
        # them (disaggregated decode pools, closed by their handoff)
        self.fed = engines if fed is None else fed
        # per engine, which of its finished requests the client has the whole response of (None: all; a
        # prefill replica: only those of one output token, the others go on to a decode replica)
        self.answers = answers if answers is not None else [None] * len(engines)
        self.requests = sorted(requests, key=lambda r: r.arrival_s)   # (stable: ties keep their order)
        self.batches = send_batches(self.requests)   # sent together: a fanned-out request's samples
        # a request arriving at t may be sent while fewer than the limit of the last stage from at most t
        # are in flight
        stages = [(0.0, max_concurrency)] if isinstance(max_concurrency, int) else list(max_concurrency)
        self.limits = stage_limits(stages, np.fromiter((self.requests[lo].arrival_s for lo, _ in self.batches),
                                                       dtype=np.float64, count=len(self.batches))).tolist()
        self.think_time_s = think_time_s
        self.think_rng = think_rng   # given: each pause is exponential with mean think_time_s, in answer order
        self.input_latency_s = input_latency_s
        self.output_latency_s = output_latency_s
        self.token_latency_s = token_latency_s
        self.in_flight = 0        # sent and not yet answered (plus think time)
        self._in_transit = 0      # sent, not yet handed to an engine
        self._all_sent = False
        self._slot: simpy.Event | None = None   # the sender waits on it for a free slot
        self._seen = [0] * len(engines)   # per engine, its scheduler's finished requests already answered
        self._due: dict[int, list] = {}   # a batch of samples sent, by sample_of: [answers due, latest answer]
        # workload.timeout_s: the client gives up on a request not whole this long after sending it (its slot
        # is free then; the engine aborts the request at its next step); each request is answered once
        self.timeout_s = timeout_s
        self._answered_ids: set[int] = set()

    @classmethod
    def for_scenario(cls, scn: Any, engines: list[Engine], deliver: Callable[[Request], None], requests: list[Request],
                     input_latency_s: float, **kwargs: Any) -> ClientPool:
        """The client of ``scn``'s workload (its limit, its pauses drawn from the scenario's seed) and
        frontend (the output latencies), handing requests over ``input_latency_s`` after they are sent."""
        _, fe_out, fe_token = scn.frontend.latencies()
        return cls(engines, deliver, requests, stages_of(scn), scn.workload.think_time_s, input_latency_s, fe_out,
                   fe_token, think_rng=think_rng(scn), timeout_s=scn.workload.timeout_s, **kwargs)

    def start(self) -> None:
        """Hook into the engines (their rejections and their steps) and start sending; before the engines
        start (their loops read ``eager_steps`` and ``multi_step`` then)."""
        for i, engine in enumerate(self.engines):
            sched = engine.scheduler
            sched.add_request = self._answering(sched.add_request)
            engine.on_step = self._collecting(i, engine.on_step)
            engine.eager_steps = False
            engine.multi_step = False
        self.env.process(self._send())

    def _answering(self, add: Callable[[Request, float], bool]) -> Callable[[Request, float], bool]:
        def add_or_answer(req: Request, now: float) -> bool:
            queued = add(req, now)
            if not queued:   # rejected as it reached the engine: the client has its error at once
                self._answered(req, now)
            return queued
        return add_or_answer

    def _collecting(self, i: int, previous: Callable[[int], None] | None) -> Callable[[int], None]:
        def on_step(step: int) -> None:
            self._collect(i)
            if previous is not None:
                previous(step)
        return on_step

    def _send(self):
        env = self.env
        for (lo, hi), limit in zip(self.batches, self.limits):
            while self.in_flight >= limit:
                self._slot = env.event()
                yield self._slot
                self._slot = None
            wait = self.requests[lo].arrival_s - env.now
            if wait > 0:
                yield env.timeout(wait)
            self.in_flight += 1
            if hi - lo > 1:
                self._due[self.requests[lo].sample_of] = [hi - lo, 0.0]
            for req in self.requests[lo:hi]:
                req.arrival_s = float(env.now)
                self._in_transit += 1
                env.timeout(self.input_latency_s).callbacks.append(partial(self._hand_over, req))
                if self.timeout_s is not None:
                    env.timeout(self.timeout_s).callbacks.append(partial(self._give_up, req))
        self._all_sent = True
        self._end_if_sent()

    def _hand_over(self, req: Request, _event: simpy.Event) -> None:
        self._in_transit -= 1
        self.deliver(req)
        self._end_if_sent()

    def _end_if_sent(self) -> None:
        if self._all_sent and self._in_transit == 0:
            self._all_sent = False   # (once)
            for engine in self.fed:
                engine.end_arrivals()

    def _collect(self, i: int) -> None:
        """Answer the requests engine ``i``'s last step finished (called after each of its steps)."""
        finished = self.engines[i].scheduler.finished
        answers = self.answers[i]
        for req in finished[self._seen[i]:]:
            if answers is None or answers(req):
                self._answered(req, req.finish_s + self.output_latency_s
                               + self.token_latency_s * max(req.output_len - 1, 0))
        self._seen[i] = len(finished)

    def _give_up(self, req: Request, _event: simpy.Event) -> None:
        """``timeout_s`` after sending ``req``: without its whole response by now, the client stops waiting."""
        self._answered(req, self.env.now)

    def _answered(self, req: Request, at: float) -> None:
        """The client has ``req``'s whole response at ``at`` (>= now), or has given up on it: its slot is free a
        pause later (a sample sent with others: once the last of theirs is whole too). Once a request."""
        if req.req_id in self._answered_ids:
            return
        self._answered_ids.add(req.req_id)
        due = self._due.get(req.sample_of) if req.sample_of >= 0 else None
        if due is not None:
            due[0] -= 1
            due[1] = max(due[1], at)
            if due[0]:
                return
            del self._due[req.sample_of]
            at = due[1]
        think = self.think_time_s if self.think_rng is None else float(self.think_rng.exponential(self.think_time_s))
        self.env.timeout(max(at + think - self.env.now, 0.0)).callbacks.append(self._release)

    def _release(self, _event: simpy.Event) -> None:
        self.in_flight -= 1
        if self._slot is not None and not self._slot.triggered:
            self._slot.succeed()
