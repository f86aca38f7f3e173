"""The SimPy model: an arrival process and an engine-loop process.

    arrivals:  for each request: wait until it reaches the engine (arrival + frontend input latency),
               hand it to the scheduler (or stage it, below), wake the engine
    engine:    while there is work:  plan = schedule(now); staged arrivals join the scheduler
                                     result = execute(plan)
                                     yield timeout(result.duration_s)
                                     update(plan, result, now); record the step
               idle:                 wait on the event the next arrival triggers
               idle but for loads from the host tier: the same, with a timeout that triggers it at
                                     the first load's end (an arrival during the load is served at once)

Async scheduling (vLLM v1's default): the plan of step n+1 is made while step n runs, so a request
that reaches a busy engine during step n is first seen by the plan of step n+2:

    step:        n-1        |         n          |        n+1         |        n+2
    arrives:                       ^ (busy engine: staged)
    plan made:        plan n+1 made at the start of n    plan n+2 (sees it) ... runs during n+2

Here: arrivals during a step are staged and handed to the scheduler just after the next plan is
made (or before it, when without them there is nothing to plan). A request that finds the engine
idle is seen at once. With ``async_scheduling=False`` every arrival is handed over immediately.

Multi-step decode (``multi_step=True``, with an executor that sets ``supports_decode_runs``): when the
next steps are all-decode and determined, ``sim/sched/decode_run.py`` prices k of them in one call and
the engine waits once, until exactly the time k single steps would have reached (the delay is nudged
by ulps until ``now + delay`` equals that float sum); results are identical to single stepping.

Eager steps (``eager_steps``): a single step that ends strictly before ``_next_arrival`` (the next time
anything can act on this engine) is updated and recorded at once, without a SimPy event; the engine
keeps its own clock (``now`` in ``_loop``) ahead of ``env.now`` and catches up (``_wait_until``, to the
exact float) only before a step or run that reaches ``_next_arrival``, before going idle and before
returning. Nothing else reads the engine between, so results are those of one timeout per step.

Time passes only through ``env.timeout``. A watchdog turns a run that makes no progress for
``max_steps_without_progress`` steps into a clear error. Progress is a sampled token, a finished request,
or a request computing past the furthest token it had computed before (a long prompt prefilled one
chunk a step advances; recomputing what a preemption threw away does not).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy

from sim.errors import KvsimError
from sim.executors.base import Executor
from sim.kv.manager import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request
from sim.sched.base import SchedulerBase
from sim.sched.continuous import ContinuousScheduler
from sim.sched.decode_run import DecodeRunner, supports_decode_runs


def wake_times(requests: list[Request], lag: float, now: float = 0.0) -> list[float]:
    """The times an arrival process started at ``now`` wakes at to hand over each request (arrival +
    ``lag``), summed as SimPy sums them (a request already due is handed over without waiting)."""
    times = []
    for req in requests:
        delay = req.arrival_s + lag - now
        if delay > 0:
            now = now + delay
        times.append(now)
    return times


def delay_to(now: float, target: float) -> float | None:
    """A delay d with ``now + d == target`` in float64 (SimPy schedules at ``now + delay``); None when
    no float does it (a sum that must round to even cannot reach an odd target)."""
    d = target - now
    for _ in range(4):
        if now + d < target:
            d = math.nextafter(d, math.inf)
        elif now + d > target:
            d = math.nextafter(d, -math.inf)
        else:
            return d
    return None


class Engine:
    """One replica: a scheduler, an executor and a recorder driven by a SimPy environment."""

    # single steps that end before ``_next_arrival`` need no SimPy event (see the module docstring);
    # off where something else acts on the engine between arrivals (disaggregated pools: a finished
    # prefill starts a transfer at ``env.now``)
    eager_steps: bool = True

    def __init__(self, requests: list[Request] | None, scheduler: SchedulerBase, executor: Executor,
                 recorder: Recorder, check_integrity: bool = False, max_steps_without_progress: int = 100_000,
                 on_step: Callable[[int], None] | None = None, async_scheduling: bool = False,
                 arrival_delay_s: float = 0.0, multi_step: bool = False, env: simpy.Environment | None = None,
                 replica_id: int = 0) -> None:
        # cluster seam (sim/cluster/): several engines share one ``env``; an engine without ``requests``
        # is fed by ``submit`` and stops only once ``end_arrivals`` says no more will come
        self.env = env if env is not None else simpy.Environment()
        self.replica_id = replica_id
        self.requests = requests if requests is not None else []
        self.fed = requests is None               # fed by submit(), not by its own arrival process
        self.scheduler = scheduler
        self.executor = executor
        self.recorder = recorder
        self.check_integrity = check_integrity
        self.max_stall = max_steps_without_progress
        self.on_step = on_step
        self.async_scheduling = async_scheduling
        self.arrival_delay_s = arrival_delay_s   # frontend input latency: client send -> engine
        self._wake: simpy.Event | None = None
        self._alarm = False                       # a timeout is set to wake the engine at a load's end
        self._arrivals_done = False
        self._busy = False                        # a step is executing
        self._staged: list[tuple[Request, float]] = []   # (request, when it reached the engine) during a step
        self._furthest: dict[int, int] = {}  # req_id -> furthest token computed (watchdog; see _advanced)
        self._next_arrival = 0.0                  # when the arrival process wakes next (inf: no more)
        self.multi_step = (multi_step and supports_decode_runs(executor) and scheduler.speculation is None
                           and isinstance(scheduler, ContinuousScheduler)
                           and isinstance(scheduler.manager, KVCacheManager))
        self.num_runs = 0                         # decode runs taken (multi-step)
        self.num_waits = 0                        # SimPy timeouts the engine waited on (its events)
        # cluster: nothing schedulable may be a wait for memory held outside the scheduler (a prefill
        # replica's blocks in transfer): wait for wake() instead of declaring a deadlock
        self.may_block = False
        # cluster: a router reads this engine's state when a request arrives anywhere (decode runs then
        # stop before the step an arrival falls in; sim/sched/decode_run.py)
        self.observed_at_arrivals = False
        # the times requests may be handed to this engine (its own arrival process's wake times, a
        # cluster's), when known: no decode run step ends at one (event order decides there), so a run
        # may go on through the step after an arrival (async scheduling plans it without the arrival)
        self.arrival_times: np.ndarray | None = None
        # cluster, a router that reads only loads and KV usage: decode runs go past arrivals (``arrival_times``: all
        # of the cluster's) and are cut (``cut_run``) only by one routed here (sim/sched/decode_run.py)
        self.cut_lazily = False
        self._pending = None                      # the run being waited on (cut lazily; not applied yet)
        self._cutting = False                     # ... whose cut has been asked for
        self._runner: DecodeRunner | None = None
        self._process: simpy.Process | None = None

    def run(self) -> None:
        self.start()
        self.env.run()

    def _advanced(self, plan) -> bool:
        """Whether a request of ``plan`` computed past its furthest computed token so far (called only on
        steps that sampled nothing, so the bookkeeping costs nothing on ordinary steps)."""
        furthest = self._furthest
        moved = False
        for s in plan.scheduled:
            reached = s.num_context_tokens + s.num_new_tokens
            if reached > furthest.get(s.req_id, 0):
                furthest[s.req_id] = reached
                moved = True
        return moved

    def start(self) -> simpy.Process:
        """Start this engine's processes in its environment (without running it); returns the engine loop's
        process, which ends when the engine stops."""
        if not self.fed:
            self.env.process(self._arrivals())
        self._process = self.env.process(self._loop())
        return self._process

    # ------------------------------------------------------------ cluster seam
    def submit(self, req: Request) -> None:
        """``req`` reaches this engine now (what the arrival process does for each request)."""
        if self.async_scheduling and self._busy:
            self._staged.append((req, self.env.now))
        elif self.scheduler.add_request(req, self.env.now) and self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def cut_run(self) -> None:
        """A request is about to be submitted here now: a decode run in progress that may be cut (see
        ``cut_lazily``) ends with the step now falls in, as single stepping would see the arrival."""
        if self._pending is not None and not self._cutting:
            self._cutting = True
            self._process.interrupt()

    def pending_finished(self) -> int:
        """Requests that the decode run being waited on (applied at its end) has finished by now: those
        whose last step ended before now (a run goes on through finishes when nobody waits)."""
        run = self._pending
        if run is None:
            return 0
        return run.finished_before(self.env.now)

    def pending_blocks(self) -> int:
        """Blocks that the decode run being waited on (applied at its end) holds by now beyond those held
        at its start: taken by the steps started so far (a step allocates as it starts), less the tables
        of the requests it has finished by now."""
        run = self._pending
        if run is None:
            return 0
        return self._runner.blocks_held(run, self.env.now)

    def wake(self) -> None:
        """Something outside the scheduler changed (memory was freed): plan again if idle."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _load_ended(self, _alarm: simpy.Event) -> None:
        """The alarm set for the end of the first load under way (host tier) has rung: plan again if idle."""
        self._alarm = False
        self.wake()

    def end_arrivals(self) -> None:
        """No more requests will be submitted: the engine stops once its work is done."""
        self._arrivals_done = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _arrivals(self):
        env = self.env
        sched = self.scheduler
        lag = self.arrival_delay_s
        stage = self.async_scheduling
        for req in self.requests:
            delay = req.arrival_s + lag - env.now
            if delay > 0:
                self._next_arrival = env.now + delay   # the time SimPy schedules the timeout at
                yield env.timeout(delay)
            if stage and self._busy:
                self._staged.append((req, self.env.now))
            elif sched.add_request(req, env.now) and self._wake is not None and not self._wake.triggered:
                self._wake.succeed()
        self._arrivals_done = True
        self._next_arrival = math.inf
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self):
        env = self.env
        sched = self.scheduler
        execute = self.executor.execute
        record = self.recorder.record_step
        stall = 0
        step = 0
        staged = self._staged
        if self.multi_step and not self.fed and self.arrival_times is None:
            self.arrival_times = np.array(wake_times(self.requests, self.arrival_delay_s, env.now))
        lazy = self.cut_lazily
        runner = DecodeRunner(sched, self.executor, self.recorder, stop_before_arrival=self.observed_at_arrivals,
                              arrival_times=self.arrival_times, cut_lazily=lazy,
                              staging=self.async_scheduling) if self.multi_step else None
        self._runner = runner
        prev = 0.0   # the last step's duration (sizes a run's pricing call)
        chain_from = None   # the last run, applied after its wait, if nothing has happened since
        eager = self.eager_steps
        gave_up = getattr(sched, "aborted", [])   # requests whose clients gave up (workload.timeout_s)
        now = env.now   # the engine's clock: >= env.now, and < _next_arrival while ahead of it
        unrecorded = 0   # preemptions of plans that came out empty (no row of their own): on the next row
        while True:
            if staged and not sched.has_work():
                self._admit_staged()
            if not sched.has_work():
                if now != env.now:
                    yield from self._wait_until(now)
                if self._arrivals_done:
                    return
                self._wake = env.event()
                yield self._wake
                self._wake = None
                now = env.now
                continue
            start = now
            run = None
            if runner is not None and not staged and not sched.loading and not unrecorded:   # (a load's end
                # bounds no run; a run's rows count no preemption)
                if chain_from is not None:   # the last run ended at an arrival routed elsewhere: go on
                    run = runner.plan_next(chain_from, self._next_arrival, step)   # from its arrays
                if run is None:
                    run = runner.plan(start, self._next_arrival, prev, step)
            chain_from = None
            if run is not None:
                # a chain of runs: each one that ends before the next arrival can reach the engine is
                # applied now (nothing else acts before then) and the next is planned from its arrays;
                # the engine waits once, until the end of the last; a last run that the arrival reaches
                # inside is applied after the wait, as single stepping would see it
                ends, durations = [run.ends], [run.durations[: run.k]]
                total = run.k
                last = run
                while run is not None and run.end < self._next_arrival:
                    run.eager = True
                    step = self._applied(runner, run, step)
                    last = run
                    run = runner.plan_next(run, self._next_arrival, step)
                    if run is not None:
                        ends.append(run.ends[1:])
                        durations.append(run.durations[: run.k])
                        total += run.k
                if eager and run is None:   # the whole chain ended before the next arrival: no wait
                    runner.write_back(last)
                    now = last.end
                    prev = float(last.durations[last.k - 1])
                    stall = 0
                    continue
                if start != env.now:
                    yield from self._wait_until(start)
                self._busy = True
                if lazy and run is not None:
                    self._pending = run
                if len(ends) > 1:
                    ends, durations = [np.concatenate(ends)], [np.concatenate(durations)]
                yield from self._wait_run(ends[0], durations[0], total, run)
                self._pending = None
                self._cutting = False
                self._busy = False
                if run is None:
                    runner.write_back(last)
                else:
                    step = self._applied(runner, run, step)
                    last = chain_from = run
                now = env.now
                prev = float(last.durations[last.k - 1])
                stall = 0
                continue
            aborted = len(gave_up)
            plan = sched.schedule(start)
            arrived = bool(staged)
            if arrived:
                self._admit_staged()
            if plan.is_empty():
                unrecorded += sched.stats.num_preempted
                # every request left was aborted (workload.timeout_s): idle, or plan the arrivals just admitted
                if not sched.has_work() or (arrived and len(gave_up) > aborted):
                    continue
                if sched.loading:   # requests wait for loads from the host tier: on to the first one's end
                    if sched.stats.num_preempted or arrived:   # made room, or requests came: plan again now
                        continue
                    if now != env.now:
                        yield from self._wait_until(now)
                    if not self._alarm:   # (one at a time: a later load's is set when this one has rung)
                        self._alarm = True
                        env.timeout(sched.loading[0][0] - now).callbacks.append(self._load_ended)
                    self._wake = env.event()   # the load's end, or an arrival, whichever comes first
                    yield self._wake
                    self._wake = None
                    now = env.now
                    continue
                if sched.release_held():   # (blocks held by loaded prefixes, freed: plan again now)
                    continue
                if self.may_block:   # cluster: blocks held by KV transfers; wake() when they are freed
                    if sched.stats.num_preempted or arrived:   # made room, or requests came: plan again now
                        continue
                    if now != env.now:
                        yield from self._wait_until(now)
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                    now = env.now
                    continue
                raise KvsimError("engine", f"deadlock at t={start:.3f}s: {sched.num_waiting()} waiting, "
                                 f"{len(sched.running)} running, nothing can be scheduled")
            if unrecorded:
                sched.stats.num_preempted += unrecorded
                unrecorded = 0
            result = execute(plan)
            if not result.duration_s > 0:
                raise KvsimError("executor", f"step {step} returned a non-positive duration {result.duration_s}")
            end = start + result.duration_s   # the float SimPy's timeout would end at
            if not (eager and end < self._next_arrival):   # (at equal times, event order decides)
                if start != env.now:
                    yield from self._wait_until(start)
                self._busy = True
                self.num_waits += 1
                yield env.timeout(result.duration_s)
                self._busy = False
            now = end
            prev = result.duration_s
            done = sched.update(plan, result, now)
            record(start, plan, result, sched)
            if self.check_integrity:
                sched.check_integrity()
            step += 1
            if self.on_step is not None:
                self.on_step(step)
            stall = 0 if (sched.stats.num_sampled or done or self._advanced(plan)) else stall + 1
            if stall >= self.max_stall:
                raise KvsimError("engine", f"no progress for {stall} steps at t={now:.3f}s "
                                 f"({sched.num_waiting()} waiting, {len(sched.running)} running): livelock")

    def _applied(self, runner: DecodeRunner, run, step: int) -> int:
        """Apply a decode run and count its steps; returns the step count after it. Requests staged
        during the step before its last (async scheduling) are handed over as its last step starts."""
        if self._staged and not run.eager:
            self._admit_staged(before=float(run.ends[run.k - 1]))
        runner.apply(run)
        self.num_runs += 1
        if self.check_integrity:
            if run.eager:
                runner.write_back(run)   # the checks recompute slots from the requests' counters
            self.scheduler.check_integrity()
        if self.on_step is not None:
            for _ in range(run.k):
                step += 1
                self.on_step(step)
            return step
        return step + run.k

    def _wait_run(self, ends, durations, k: int, last=None):
        """Wait from ``ends[0]`` until exactly ``ends[k]``: in one timeout when a float delay lands there,
        else to the latest ``ends[j]`` one lands on, then step by step (``ends[j] + durations[j]``).
        Interrupted by ``cut_run``: ``last`` (the run waited on) is cut, and the wait ends with it."""
        env = self.env
        start = float(ends[0])
        j = k
        d = delay_to(start, float(ends[k]))
        while d is None:
            j -= 1
            d = delay_to(start, float(ends[j])) if j > 1 else float(durations[0])   # ends[1] = start + d0
        try:
            yield env.timeout(d)
            self.num_waits += 1 + k - j
            for i in range(j, k):
                yield env.timeout(float(durations[i]))
        except simpy.Interrupt:
            # on through the next step, planned without the arrival, which is handed over as it starts;
            # only a rejection on hand-over is seen before the run's end (a router reads loads)
            if self._runner.cut(last, env.now) and any(self.scheduler.would_reject(r) for r, _ in self._staged):
                yield from self._wait_until(float(last.ends[last.k - 1]))
                self._admit_staged(before=env.now)
            yield from self._wait_until(last.end)

    def _wait_until(self, target: float):
        """Wait from now (off the step grid: an arrival's time) until exactly ``target``: in one timeout,
        or through a point between when no float delay lands there."""
        env = self.env
        d = delay_to(env.now, target)
        if d is not None:
            self.num_waits += 1
            yield env.timeout(d)
            return
        now = env.now
        for frac in (0.5, 0.25, 0.75, 0.125, 0.875):
            mid = now + (target - now) * frac
            d1 = delay_to(now, mid)
            d2 = delay_to(mid, target) if d1 is not None else None
            if d2 is not None and now < mid < target:
                self.num_waits += 2
                yield env.timeout(d1)
                yield env.timeout(d2)
                return
        raise AssertionError(f"no float delays reach {target!r} from {now!r}")

    def _admit_staged(self, before: float = math.inf) -> None:
        """Hand the requests staged during the last step (those staged before ``before``) to the
        scheduler, at the time each reached the engine."""
        staged = self._staged
        n = len(staged) if before == math.inf else sum(1 for _, when in staged if when < before)
        for req, when in staged[:n]:
            self.scheduler.add_request(req, when)
        del staged[:n]
