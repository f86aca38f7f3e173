"""One data-parallel engine of a mixture of experts (``cluster: {replicas: D, data_parallel: true}``): D ranks
in lockstep.

vLLM's ``--data-parallel-size D`` runs D engine cores, each a tensor-parallel group with its own scheduler
and KV cache, behind one API server that sends each request to one of them (here the cluster's router;
vLLM's own balancer is ``dp_balance``: the fewest 4 x waiting + running requests, by counts up to 100 ms
old). Their expert layers are collectives over every rank's GPUs, so the ranks step together: while any rank
has work, every rank runs a forward pass (a dummy one if it has nothing scheduled), and a step lasts as long
as the slowest rank's (sim/executors/data_parallel.py prices it).

    group loop:  while any rank has work:
                     each rank with work: plan = schedule(now) (its staged arrivals join after, as an
                                          engine's do under async scheduling)
                     results = pricer.group_step(plans)           every result the slowest rank's duration
                     yield timeout(duration)
                     each rank with a plan: update, record its step (its wait for the others in overhead)
                 idle: wait for an arrival at any rank

The ranks are the cluster's replicas (replicas.csv has a row each, the router's loads read them), their
Engine objects kept for their hand-over (``submit``: staged while a step runs under async scheduling),
their counters and their recorders, but driven by this one loop instead of their own. Steps run one at a
time (no decode runs). The compiled core runs the same loop (sim/csrc/core/lockstep.inc, ``groups_in_core``:
colocated engines, parallel samples forked as on one engine, a router reading at most the ranks' counts, KV
usage and the clock; a client in front sending in arrival order; prefill or decode pools of such engines too, through
sim/cluster/disagg_core.py), with the same results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import simpy

from sim.clients import ClientPool, core_client, in_send_order, planned_arrivals
from sim.cluster.engine_fleet import engine_router, routes_in_core
from sim.cluster.replica import Replica, build_replica
from sim.cluster.results import ClusterResult, cluster_result
from sim.cluster.routers import Router, make_router
from sim.engine_core import core_supported, forks_in_core, requests_supported, same_admission
from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.data_parallel import DataParallelPricer
from sim.progress_bar import ProgressBar
from sim.request import Request
from sim.scenario import Scenario
from sim.specs import HardwareSpec, ModelSpec
from sim.workload.build import Workload

GPUS_PER_NODE = 8


def group_problem(model: ModelSpec, hw: HardwareSpec, ranks: int) -> tuple[str, str] | None:
    """(what, why) where ``ranks`` ranks of ``hw``'s tensor-parallel groups cannot serve ``model`` as one
    data-parallel engine; ``what``: ``ranks``, ``model`` or ``expert_parallel``, the setting to name."""
    gpus = ranks * hw.tensor_parallel
    if not model.num_experts:
        return "model", (f"{model.name} is dense: its data-parallel ranks share no layer and step on their own, "
                         "as plain replicas")
    if ranks < 2:
        return "ranks", "a data-parallel group needs at least 2 ranks"
    if gpus > GPUS_PER_NODE:
        return "ranks", (f"{ranks} ranks x {hw.tensor_parallel} GPUs = {gpus} GPUs span nodes ({GPUS_PER_NODE} a "
                         "node): the all-to-all across nodes (DeepEP over RDMA) is not modelled")
    if hw.expert_parallel and model.num_experts < gpus:
        return "expert_parallel", (f"{model.name}'s {model.num_experts} experts over {gpus} GPUs would leave "
                                   f"{gpus - model.num_experts} of them without an expert")
    if not hw.expert_parallel and model.intermediate_size % gpus:
        return "ranks", (f"the expert layers split each expert over the group's {gpus} GPUs, which does not "
                         f"divide {model.name}'s MLP intermediate size {model.intermediate_size} (experts placed "
                         "whole, expert parallelism, need not)")
    return None


def data_parallel_problem(scn: Scenario) -> tuple[str, str] | None:
    """(key, why) where ``cluster.data_parallel`` (or a prefill or decode pool's ``data_parallel``) meets what a
    data-parallel group is not modelled with."""
    cl = scn.cluster
    if cl is None:
        return None
    if cl.data_parallel:
        return _settings_problem(scn, cl.ranks_per_engine, "cluster", cl.data_parallel_size is not None)
    if cl.disaggregated:
        from sim.cluster.replica import pool_scenario

        for role in ("prefill", "decode"):
            pool = getattr(cl, role)
            if pool.data_parallel:
                problem = _settings_problem(pool_scenario(scn, pool), pool.ranks_per_engine, f"cluster.{role}",
                                            pool.data_parallel_size is not None)
                if problem is not None:
                    return problem
    return None


def _settings_problem(scn: Scenario, ranks: int, where: str, sized: bool) -> tuple[str, str] | None:
    """(key, why) where ``ranks`` ranks of ``scn``'s hardware cannot be one data-parallel engine of its model, or
    its settings are ones a group is not modelled with; ``where``: the cluster section the ranks are given in,
    ``sized``: as its ``data_parallel_size`` (else as its replicas)."""
    problem = group_problem(scn.model_spec, scn.hardware_spec, ranks)
    if problem is not None:
        what, why = problem
        ranks_key = f"{where}.data_parallel_size" if sized else f"{where}.replicas"
        key = {"model": f"{where}.data_parallel", "ranks": ranks_key,
               "expert_parallel": "hardware.expert_parallel" if where == "cluster" else f"{where}.data_parallel"}[what]
        plain = "cluster.replicas" if where == "cluster" else f"the {where.split('.')[1]} pool"
        return key, why + (f" ({plain} without data_parallel)" if what == "model" else "")
    hw = scn.hardware_spec
    sch, kv = scn.scheduler, scn.kv_cache
    from sim.executors.cost_model import shipped_calibration

    ref = scn.executor.calibration
    if ref == "roofline" or (ref is None and shipped_calibration(hw.name) is None):
        where = "executor.calibration" if ref else "hardware"
        return where, ("a data-parallel group is priced with a calibration's engine-level terms, and "
                       f"{'the roofline' if ref else hw.name} has none (h100-80gb, a100-80gb and the GPUs "
                       "derived from them ship them)")
    rows = (
        ("hardware.pipeline_parallel", "pipeline stages", hw.pipeline_parallel > 1),
        ("executor.kind", f"the {scn.executor.kind} executor (executor.kind: cost_model prices the group)",
         scn.executor.kind != "cost_model"),
        ("executor.engine", "isolated operators (the group is priced with the engine-level terms)",
         scn.executor.engine is False),
        ("scheduler.batching", "static batching", sch.batching == "static"),
        ("kv_cache.allocator", f"the {kv.allocator} allocator", kv.allocator != "paged"),
        ("kv_cache.cpu_offload_gib", "a host tier of the prefix cache", bool(kv.cpu_offload_gib)),
        ("speculative", "speculative decoding", scn.speculative is not None),
        ("lora", "LoRA serving", scn.lora is not None),
    )
    for key, what, clash in rows:
        if clash:
            return key, f"a data-parallel group (cluster.data_parallel) with {what} is not modelled"
    return None


class LockstepGroup:
    """The ranks' one engine loop (module docstring). ``engines``: the ranks' Engines, never started."""

    def __init__(self, env: simpy.Environment, pool: list[Replica], pricer: DataParallelPricer,
                 max_stall: int, check_integrity: bool) -> None:
        self.env, self.pool, self.pricer = env, pool, pricer
        self.engines = [rep.engine for rep in pool]
        self.max_stall = max_stall
        self.check_integrity = check_integrity
        self.num_steps = 0
        # what lockstep costs, summed over the group's steps (``stats``)
        self._tokens = 0          # tokens the ranks scheduled
        self._slots = 0           # ranks x the largest rank's tokens: what the padded passes computed
        self._busy_s = 0.0        # seconds of the ranks that had a plan
        self._wait_s = 0.0        # ... of them waiting for the slowest rank
        self._dummy = 0           # rank-steps with no plan (a dummy pass)

    def start(self) -> simpy.Process:
        return self.env.process(self._loop())

    @property
    def counts(self) -> LockstepCounts:
        return LockstepCounts(len(self.engines), self.num_steps, self._tokens, self._slots, self._busy_s, self._wait_s,
                              self._dummy)

    def _idle(self):
        """Wait until a request reaches any rank (or arrivals end)."""
        wake = self.env.event()
        for engine in self.engines:
            engine._wake = wake
        yield wake
        for engine in self.engines:
            engine._wake = None

    def _loop(self):
        env, engines = self.env, self.engines
        scheds = [e.scheduler for e in engines]
        unrecorded = [0] * len(engines)   # preemptions of a rank's plans that came out empty: on its next row
        stall = 0
        while True:
            for e, s in zip(engines, scheds):
                if e._staged and not s.has_work():
                    e._admit_staged()
            if not any(s.has_work() for s in scheds):
                if all(e._arrivals_done for e in engines):
                    return
                yield from self._idle()
                continue
            start = env.now
            plans, changed = self._plan(start, unrecorded)
            if all(p is None for p in plans):
                if not changed:   # every rank with work waits for memory held by transfers: wake() ends it
                    yield from self._idle()
                continue          # (requests aborted or arrived, or held blocks released: plan again)
            results = self.pricer.group_step(plans)
            duration = next(r for r in results if r is not None).duration_s
            if not duration > 0:
                raise KvsimError("executor", f"step {self.num_steps} returned a non-positive duration {duration}")
            self._count(plans, duration)
            for e in engines:
                e._busy = True
            yield env.timeout(duration)
            for e in engines:
                e._busy = False
            now = env.now
            moved = False
            for e, s, plan, result in zip(engines, scheds, plans, results):
                if plan is None:
                    continue
                done = s.update(plan, result, now)
                e.recorder.record_step(start, plan, result, s)
                if self.check_integrity:
                    s.check_integrity()
                if e.on_step is not None:
                    e.on_step(self.num_steps + 1)
                moved = moved or bool(s.stats.num_sampled or done or e._advanced(plan))
            self.num_steps += 1
            stall = 0 if moved else stall + 1
            if stall >= self.max_stall:
                raise KvsimError("engine", f"no progress for {stall} steps at t={now:.3f}s in the data-parallel "
                                 f"group ({sum(s.num_waiting() for s in scheds)} waiting, "
                                 f"{sum(len(s.running) for s in scheds)} running): livelock")

    def _count(self, plans: list, duration: float) -> None:
        """Add one group step to the lockstep figures (``stats``)."""
        tokens = self.pricer.last_tokens
        self._tokens += sum(tokens)
        self._slots += len(plans) * max(tokens)
        ran = sum(p is not None for p in plans)
        self._busy_s += ran * duration
        self._wait_s += sum(self.pricer.last_waits)
        self._dummy += len(plans) - ran

    def _plan(self, start: float, unrecorded: list[int]) -> tuple[list, bool]:
        """Each rank's plan at ``start`` (None: nothing to run, a dummy pass), and whether a rank whose plan came
        out empty changed so that planning again may find work. An empty plan is handled as an engine's
        (sim/engine.py): its preemptions go on the rank's next row; with work left and none of its requests
        just aborted nor held blocks to release, a rank of a prefill or decode pool (``may_block``) waits for
        memory that transfers hold, and any other rank can never run (a deadlock: never expected, since
        requests that can never fit are refused)."""
        plans = []
        changed = False
        for i, e in enumerate(self.engines):
            s = e.scheduler
            if not s.has_work():
                plans.append(None)
                continue
            gave_up = getattr(s, "aborted", [])
            aborted = len(gave_up)
            plan = s.schedule(start)
            arrived = bool(e._staged)
            if arrived:
                e._admit_staged()
            if plan.is_empty():
                unrecorded[i] += s.stats.num_preempted
                if s.has_work() and not (arrived and len(gave_up) > aborted) and not s.release_held():
                    if not e.may_block:
                        raise KvsimError("engine", f"deadlock at t={start:.3f}s on rank {i}: {s.num_waiting()} "
                                         f"waiting, {len(s.running)} running, nothing can be scheduled")
                    changed = changed or bool(s.stats.num_preempted or arrived)   # (made room, or requests came)
                else:
                    changed = True
                plans.append(None)
                continue
            if unrecorded[i]:
                s.stats.num_preempted += unrecorded[i]
                unrecorded[i] = 0
            plans.append(plan)
        return plans, changed


def group_base(scn: Scenario) -> CostModelExecutor:
    """The single engine's cost model that a data-parallel group of ``scn`` is priced over (its engine-level
    terms required)."""
    from sim.executors.cost_model import make_cost_model_executor

    base = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                    kv=scn.kv_cache, base_dir=scn.base_dir, scheduler=scn.scheduler)
    if not isinstance(base, CostModelExecutor) or base.engine is None:
        raise KvsimError(f"{scn.source}: executor.calibration", "a data-parallel group is priced with the "
                         "engine-level terms, which this calibration does not have (the shipped ones do)")
    return base


@dataclass(frozen=True)
class LockstepCounts:
    """What stepping together cost one engine's run (``LockstepGroup.counts``, or the compiled core's counts of
    a group): its ranks; its group steps; the tokens its ranks scheduled and the token slots its padded passes
    computed (ranks x the largest rank's tokens, a step at a time); the seconds of the ranks that had a plan
    and of them waiting for the slowest rank; the rank-steps with no plan (dummy passes)."""

    ranks: int
    steps: int
    tokens: int
    slots: int
    busy_s: float
    wait_s: float
    dummy: int


def fleet_stats(engines: list[LockstepCounts]) -> dict:
    """What stepping together cost the run, over one or several engines of equal ranks: the engines and each
    one's ranks; their group steps, summed; the share of the token slots their padded passes computed that
    were padding (every rank's batch padded to its engine's largest, a dummy pass's all of it); the share of
    the ranks' busy time spent waiting for their engine's slowest rank; the rank-steps that were dummy passes."""
    tokens, slots = sum(g.tokens for g in engines), sum(g.slots for g in engines)
    busy, wait = sum(g.busy_s for g in engines), sum(g.wait_s for g in engines)
    return {"engines": len(engines), "ranks": engines[0].ranks, "group_steps": sum(g.steps for g in engines),
            "padding_share": 1.0 - tokens / slots if slots else 0.0, "wait_share": wait / busy if busy else 0.0,
            "dummy_rank_steps": sum(g.dummy for g in engines)}


def groups_in_core(pool: list[Replica], requests: list[Request], router: Router) -> bool:
    """Whether the compiled core runs these engines' ranks (sim/csrc/core/lockstep.inc): each rank one it
    covers (as a group's, ``core_supported``), its requests (parallel samples where it forks them), and a
    router the core can route for (``routes_in_core``)."""
    if not routes_in_core(router):
        return False
    forks = all(forks_in_core(rep.scheduler, rep.manager, rep.engine.executor) for rep in pool)
    if not requests_supported(requests, forks):
        return False
    return (all(core_supported(rep.scheduler, rep.manager, rep.engine.executor, None, grouped=True) for rep in pool)
            and same_admission([rep.scheduler for rep in pool], requests))


def group_spans(first: int, count: int, size: int) -> np.ndarray:
    """The compiled core's spans of ``count`` ranks from engine ``first`` as engines of ``size``: (first engine,
    ranks) of each."""
    return np.array([(start, size) for start in range(first, first + count, size)], dtype=np.int64)


def core_counts(ranks: int, row: list[float]) -> LockstepCounts:
    """One group's ``LockstepCounts`` from the core's row (steps, tokens, slots, busy and waiting seconds,
    dummy passes)."""
    steps, tokens, slots, busy, wait, dummy = row
    return LockstepCounts(ranks, int(steps), int(tokens), int(slots), busy, wait, int(dummy))


def build_group(scn: Scenario, ids: range, role: str, env: simpy.Environment, check: bool,
                lag: float, base: CostModelExecutor | None = None) -> tuple[list[Replica], LockstepGroup]:
    """The ranks ``ids`` of one data-parallel engine of ``scn`` (the cluster's replicas, or a prefill or decode
    pool's: ``role``), built as a pool's replicas (each rank's KV sized for its share of the experts:
    sim.specs.rank_weight_bytes) sharing one pricer, and the ``LockstepGroup`` that drives them (not started).
    ``base``: the cost model to price over (``group_base``; several engines of one scenario share it)."""
    pricer = DataParallelPricer(base or group_base(scn), len(ids), scn.kv_cache.block_size)
    pool = [build_replica(scn, i, role, env, check, lag, pricer) for i in ids]
    for rep in pool:
        rep.engine.multi_step = False
    return pool, LockstepGroup(env, pool, pricer, scn.scheduler.max_steps_without_progress, check)


def build_engines(scn: Scenario, ids: range, size: int, role: str, env: simpy.Environment, check: bool,
                  lag: float) -> tuple[list[Replica], list[LockstepGroup]]:
    """The replicas ``ids`` as data-parallel engines of ``size`` ranks each (``build_group``, engine after
    engine, over one base cost model), and their ``LockstepGroup``s (not started)."""
    base = group_base(scn)
    reps, groups = [], []
    for first in range(ids.start, ids.stop, size):
        ranks, group = build_group(scn, range(first, first + size), role, env, check, lag, base)
        if len(ids) > size:   # (a fleet: each rank knows its engine, replicas.csv's ``engine``)
            for rep in ranks:
                rep.dp_engine = len(groups)
        reps += ranks
        groups.append(group)
    return reps, groups


def run_data_parallel(scn: Scenario, workload: Workload, check: bool, lag: float, fe_out: float, fe_token: float,
                      t0: float, bar: ProgressBar | None = None, keep_steps: bool = True) -> ClusterResult:
    """The engines' run: each engine's ranks (``build_group``; ``cluster.data_parallel_size`` of them, or every
    replica), the cluster's router over every rank and the arrivals, each engine's ranks driven by its own
    ``LockstepGroup``."""
    from sim.cluster.runner import _arrivals, _check_released, _observed, _show_progress

    cfg = scn.cluster
    requests = workload.requests
    env = simpy.Environment()
    served: dict[int, int] = {}
    size = cfg.ranks_per_engine
    pool, groups = build_engines(scn, range(int(cfg.replicas)), size, "colocated", env, check, lag)
    # (attached to the ranks first: a router narrows what it reads to what they have, prefix caches or adapters)
    router = _observed(engine_router(make_router(cfg.router, scn.seed), len(pool), size), pool, requests, lag)
    clients = scn.workload.max_concurrency   # a client with a concurrency limit (sim/clients.py)
    if groups_in_core(pool, requests, router) and (not clients or in_send_order(requests)):   # (core/lockstep.inc)
        from sim.cluster.runner import _run_in_core
        from sim.runner import CORE_REQUEST_COLUMNS

        planned = planned_arrivals(requests) if clients else None   # (the client's sends replace them)
        client = core_client(scn, requests, fe_out, fe_token) if clients else None
        counts = np.zeros((len(groups), 6))
        columns = _run_in_core(pool, requests, router, None, lag, served, bar, columns=CORE_REQUEST_COLUMNS,
                               client=client, groups=(group_spans(0, len(pool), size), counts))
        res = cluster_result(scn, workload, pool, served, None, None, fe_out, fe_token, time.perf_counter() - t0, lag,
                             columns=columns, planned=planned, keep_steps=keep_steps)
        res.summary["cluster"]["data_parallel"] = fleet_stats([core_counts(size, row) for row in counts.tolist()])
        res.profile["compiled_core"] = True
        return res
    if bar is not None:
        _show_progress(bar, pool, [])
    planned = None
    if scn.workload.max_concurrency:   # a client with a concurrency limit (sim/clients.py): it answers a request
        planned = planned_arrivals(requests)   # when its rank's step finishes it (the ranks' on_step)

        def deliver(req: Request) -> None:   # routed as it reaches the group
            rep = pool[router.choose(req, pool)]
            served[req.req_id] = rep.replica_id
            rep.submit(req)

        ClientPool.for_scenario(scn, [rep.engine for rep in pool], deliver, requests, lag).start()
    else:
        env.process(_arrivals(env, requests, lag, router, pool, Replica.submit, served))
    for group in groups:
        group.start()
    env.run()
    _check_released(pool)
    res = cluster_result(scn, workload, pool, served, None, None, fe_out, fe_token, time.perf_counter() - t0, lag,
                         planned=planned, keep_steps=keep_steps)
    res.summary["cluster"]["data_parallel"] = fleet_stats([g.counts for g in groups])
    res.profile["compiled_core"] = False
    return res

