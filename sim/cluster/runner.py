"""run_cluster: many replicas in one SimPy environment behind a router.

    arrivals (one process):  for each request, in arrival order:
                                 wait until arrival_s + frontend input latency + router overhead_s
                                 i = router.choose(req, pool)      # replica state as of this moment
                                 pool[i].submit(req)
                             then every replica of the pool is told that arrivals are over
    replicas:                each its own engine loop (sim/engine.py), idle on an event when it has no work

A colocated pool whose replicas the compiled engine core covers, behind a router that reads at most the
replicas' loads and KV usage, or their prefix caches through a rule the core applies (prefix_affinity), runs in the core
instead (sim/engine_core.py run_engines: one arrival process, the replicas' loops, in SimPy's event
order; the router's choices made ahead, applied by the core from the replicas' counts (``core_rule``) or
made by calling it at each arrival), with the same results.

Disaggregated (sim/cluster/disagg.py): the arrivals feed the prefill pool; finished prefills cross the
link and enter the decode pool; the decode engines stop once the prefill engines have stopped and the
last transfer has landed.

Invariant: with ``cluster.replicas: 1`` the events happen in the single engine's order (the arrival
process is created before the engine loop, delays are computed the same way), so the run is the single
engine's, and the summary is built by the same code from the same objects.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import simpy

from sim.clients import ClientPool, core_client, in_send_order, planned_arrivals
from sim.cluster.disagg import Handoff
from sim.cluster.disagg_core import disagg_supported, run_disaggregated
from sim.cluster.engine_fleet import FleetRouter, engine_router
from sim.cluster.link import KVLink
from sim.cluster.replica import Replica, build_pool, check_released, pool_scenario
from sim.cluster.results import ClusterResult, cluster_result
from sim.cluster.routers import DataParallelBalance, Router, make_router
from sim.engine import wake_times
from sim.engine_core import (
    EngineParts,
    core_supported,
    forks_in_core,
    requests_supported,
    run_engines,
    same_admission,
)
from sim.errors import KvsimError
from sim.progress_bar import ProgressBar
from sim.request import Request, RequestStatus
from sim.scenario import Scenario
from sim.workload import build_workload
from sim.workload.build import Workload


def _arrivals(env: simpy.Environment, requests: list[Request], lag: float, router: Router,
              pool: list[Replica], submit, served: dict[int, int], ahead: list[int] | None = None):
    if ahead is not None:
        yield from _arrivals_ahead(env, requests, lag, ahead, pool, served)
        return
    engines = [rep.engine for rep in pool]   # (each with observed_at_arrivals set: see _observed)
    for req in requests:
        delay = req.arrival_s + lag - env.now
        if delay > 0:
            # the router will read every replica then: decode runs are applied as they are planned only
            # if they end before it, and stop with the step it falls in (before it, if the router
            # reads KV memory or prefix caches: that step's allocations must be made when it starts)
            t = env.now + delay
            for engine in engines:
                engine._next_arrival = t
            yield env.timeout(delay)
        rep = pool[router.choose(req, pool)]
        served[req.req_id] = rep.replica_id
        rep.engine.cut_run()
        submit(rep, req)
    for engine in engines:
        engine._next_arrival = math.inf
        engine.end_arrivals()


def _route_ahead(router: Router, requests: list[Request], pool: list[Replica], lag: float) -> list[int]:
    """Every choice of a router that reads no replica state, made first (the same choices, in the same
    order); each engine is given the times its own requests will be submitted at."""
    dest = [router.choose(req, pool) for req in requests]
    times = np.array(wake_times(requests, lag))
    where = np.array(dest, dtype=np.int64)
    for i, rep in enumerate(pool):
        rep.engine.arrival_times = times[where == i]
    return dest


def _arrivals_ahead(env: simpy.Environment, requests: list[Request], lag: float, dest: list[int],
                    pool: list[Replica], served: dict[int, int]):
    """``_arrivals`` for a router that reads no replica state (``_route_ahead``): each engine is told
    when its next request will be submitted (the float time the timeout below fires at) and may advance
    decode runs up to it (sim/sched/decode_run.py)."""
    times = wake_times(requests, lag, env.now)
    following = [math.inf] * len(requests)   # when the next request for the same replica comes
    upcoming = [math.inf] * len(pool)
    for i in range(len(requests) - 1, -1, -1):
        following[i] = upcoming[dest[i]]
        upcoming[dest[i]] = times[i]
    for rep, t in zip(pool, upcoming):
        rep.engine._next_arrival = t
    for req, i, t_next in zip(requests, dest, following):
        delay = req.arrival_s + lag - env.now
        if delay > 0:
            yield env.timeout(delay)
        rep = pool[i]
        served[req.req_id] = rep.replica_id
        rep.engine._next_arrival = t_next
        rep.submit(req)
    for rep in pool:
        rep.engine._next_arrival = math.inf
        rep.engine.end_arrivals()


def _observed(router: Router, pool: list[Replica], requests: list[Request], lag: float) -> Router:
    """Tell the replicas what ``router`` reads of them at each arrival (before their loops start): their
    prefix caches (decode runs stop before the step an arrival falls in), or only their loads and KV
    usage, known at any time from a run's arrays (runs go past arrivals; the one routed a request is cut)."""
    router.attach(pool)
    if not (router.reads_load or router.reads_memory or router.reads_state):
        return router   # (its choices may be made ahead: _route_ahead)
    times = np.array(wake_times(requests, lag))
    for rep in pool:
        rep.engine.observed_at_arrivals = router.reads_state
        rep.engine.arrival_times = times
        rep.engine.cut_lazily = not router.reads_state
    return router


def _run_in_core(pool: list[Replica], requests: list[Request], router: Router, dest: list[int] | None, lag: float,
                 served: dict[int, int], bar: ProgressBar | None = None, columns: bool = False,
                 client: tuple | None = None, groups: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> dict[str, Any] | None:
    """The colocated pool's run in the compiled engine core: its router's choices made ahead (``dest``) or
    at each arrival from the replicas' loads and KV usage (by the core itself where the router has a
    ``core_rule``, else a call of ``choose``), as ``_arrivals`` and the replicas' engine loops make them,
    with the same results. ``columns``: the requests' table's columns come back (sim/core_requests.py),
    the Requests getting only their status. ``client``: sent by a client with a concurrency limit
    (sim/clients.py ``core_client``). ``groups``: the replicas are data-parallel engines' ranks
    (``run_engines``' groups). The router is attached to the engines' views where it reads their running
    requests and the clock there (``dp_balance``, a fleet's ``FleetRouter``)."""
    parts = [EngineParts(rep.scheduler, rep.engine.executor, rep.engine.recorder, rep.engine.async_scheduling,
                         rep.engine.max_stall, rep.engine.check_integrity) for rep in pool]
    rule = None if dest is not None else router.core_rule(requests, len(pool))
    runs, where = run_engines(requests, parts, lag, dest=dest, choose=router.choose,
                              rule=None if rule is None else rule.as_core_arg(), progress=bar.at if bar else None,
                              columns=columns, client=client, groups=groups,
                              attach=router.attach if groups or isinstance(router, DataParallelBalance) else None)
    counts = np.bincount(where, minlength=len(pool))
    for rep, n, run in zip(pool, counts.tolist(), runs):
        rep.submitted = n
        check_released(rep, free_blocks=run.free_blocks)
    for req, i in zip(requests, where.tolist()):
        served[req.req_id] = pool[i].replica_id
    return runs[0].columns


def _in_core(pool: list[Replica], requests: list[Request], router: Router) -> bool:
    """Whether the compiled core runs this colocated pool: it covers every replica, they admit alike,
    and the router reads at most the replicas' loads and KV usage, or their prefix caches through its core
    rule (prefix_affinity)."""
    forks = all(forks_in_core(rep.scheduler, rep.manager, rep.engine.executor) for rep in pool)
    if (router.reads_state and not router.rule_reads_caches and not isinstance(router, DataParallelBalance)) \
            or not requests_supported(requests, forks):   # (dp_balance reads the ranks' running counts and clock)
        return False
    return (all(core_supported(rep.scheduler, rep.manager, rep.engine.executor, None) for rep in pool)
            and same_admission([rep.scheduler for rep in pool], requests))


def _run_colocated(scn: Scenario, workload: Workload, check: bool, lag: float, fe_out: float, fe_token: float,
                   t0: float, bar: ProgressBar | None = None, keep_steps: bool = True) -> ClusterResult:
    """A colocated pool's run, in the compiled core where it covers the pool, else in the SimPy loop;
    ``bar`` shows the requests done."""
    cfg = scn.cluster
    requests = workload.requests
    env = simpy.Environment()
    served: dict[int, int] = {}
    mixed = cfg.groups is not None
    pool = [rep for g, (group, ids) in enumerate(cfg.colocated_groups())
            for rep in build_pool(pool_scenario(scn, group), ids, "colocated", env, check, lag, g if mixed else None)]
    router = _observed(make_router(cfg.router, scn.seed), pool, requests, lag)
    reads = router.reads_load or router.reads_memory or router.reads_state
    clients = scn.workload.max_concurrency   # a client with a concurrency limit (sim/clients.py)
    planned = planned_arrivals(requests) if clients else None   # (the client's sends replace them)
    core = _in_core(pool, requests, router) and (not clients or in_send_order(requests))
    # (routed ahead: the SimPy loop's client routes each request itself as it reaches the pool)
    ahead = None if reads or (clients and not core) else _route_ahead(router, requests, pool, lag)
    columns = None
    if core:   # compiled (sim/engine_core.py)
        from sim.runner import CORE_REQUEST_COLUMNS

        client = core_client(scn, requests, fe_out, fe_token) if clients else None
        columns = _run_in_core(pool, requests, router, ahead, lag, served, bar, columns=CORE_REQUEST_COLUMNS,
                               client=client)
    else:
        if bar is not None:
            _show_progress(bar, pool, [])
        if clients:
            def deliver(req: Request) -> None:   # routed as it reaches the cluster (as _arrivals does)
                rep = pool[router.choose(req, pool)]
                served[req.req_id] = rep.replica_id
                rep.submit(req)

            ClientPool.for_scenario(scn, [rep.engine for rep in pool], deliver, requests, lag).start()
        else:
            env.process(_arrivals(env, requests, lag, router, pool, Replica.submit, served, ahead))
        for rep in pool:
            rep.engine.start()
        env.run()
        _check_released(pool)
    res = cluster_result(scn, workload, pool, served, None, None, fe_out, fe_token, time.perf_counter() - t0, lag,
                         columns=columns, planned=planned, keep_steps=keep_steps)
    res.profile["compiled_core"] = core
    return res


def _check_released(pool: list[Replica]) -> None:
    """Every request has ended: each replica's KV blocks are all free again (cached ones count as free), and
    the load a router reads of it is back to zero (each request it was given counted as ended once)."""
    for rep in pool:
        check_released(rep)
        if rep.load():
            raise KvsimError("engine", f"replica {rep.replica_id} ({rep.role}) counts a load of {rep.load()} "
                             "after every request ended")


def _check_disaggregated(scn: Scenario, pools: list[Scenario], requests: list[Request]) -> None:
    where = f"{scn.source}: cluster"
    for sub in pools:
        if sub.kv_cache.allocator != "paged" or sub.scheduler.batching != "continuous":
            raise KvsimError(where, "prefill/decode pools need kv_cache.allocator: paged and "
                             "scheduler.batching: continuous")
    wide = next((r for r in requests if r.n > 1 or r.beam_width > 1), None)
    if wide is not None:
        raise KvsimError(where, f"request {wide.req_id} has n={wide.n}, beam_width={wide.beam_width}: "
                         "parallel samples and beams are not forked across prefill/decode pools"
                         + ("; scheduler.parallel_sampling: fanout sends each sample as a request of its own"
                            if wide.beam_width == 1 else ""))
    if pools[0].model_spec.kv_bytes_per_token() != pools[1].model_spec.kv_bytes_per_token():
        raise KvsimError(where, "the prefill and decode pools must serve the same model with the same KV bytes a "
                                "token (kv_cache.dtype): the decode pool takes the prefill pool's KV as it is")


def _show_progress(bar: ProgressBar, ends: list[Replica], prefill: list[Replica],
                   handoff: Handoff | None = None) -> None:
    """Each replica's steps move ``bar``: the requests done are those finished or rejected where they end
    (``ends``: every replica of a colocated pool, the decode pool), rejected by a prefill replica, or done
    there (one output token)."""
    def done() -> int:
        n = sum(len(r.scheduler.finished) + len(r.scheduler.rejected) + len(r.scheduler.aborted) for r in ends)
        n += sum(len(r.scheduler.rejected) for r in prefill)
        return n + (handoff.done_on_prefill if handoff is not None else 0)

    on_step = bar.stepper(done)
    for rep in [*prefill, *ends]:
        rep.engine.on_step = on_step


def run_cluster(scn: Scenario, check_integrity: bool | None = None, progress: bool = False,
                progress_after_s: float = 0.0, keep_steps: bool = True) -> ClusterResult:
    """Run a scenario with a ``cluster`` section to completion; ``progress``: a bar on stderr over the
    requests done, shown once the run has lasted ``progress_after_s`` seconds of wall time; ``keep_steps``:
    as ``run_scenario``'s."""
    from sim.runner import _check_sequences_supported, _integrity_default, assign_adapters, fan_out_samples

    t0 = time.perf_counter()
    cfg = scn.cluster
    assert cfg is not None
    workload = build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source)
    assign_adapters(scn, workload)
    fan_out_samples(scn, workload)
    requests = workload.requests
    check = _integrity_default() if check_integrity is None else check_integrity
    fe_in, fe_out, fe_token = scn.frontend.latencies()
    lag = fe_in + cfg.router.overhead_s
    env = simpy.Environment()
    served: dict[int, int] = {}
    bar = ProgressBar(len(requests), progress_after_s) if progress else None
    if not cfg.disaggregated:
        for group, _ in cfg.colocated_groups():   # (a group may batch or allocate its own way)
            _check_sequences_supported(pool_scenario(scn, group), requests)
        try:
            if cfg.data_parallel:   # one data-parallel engine: its ranks in lockstep (sim/cluster/data_parallel.py)
                from sim.cluster.data_parallel import run_data_parallel

                return run_data_parallel(scn, workload, check, lag, fe_out, fe_token, t0, bar, keep_steps)
            return _run_colocated(scn, workload, check, lag, fe_out, fe_token, t0, bar, keep_steps)
        finally:
            if bar is not None:
                bar.close()

    p_scn, d_scn = pool_scenario(scn, cfg.prefill), pool_scenario(scn, cfg.decode)
    _check_disaggregated(scn, [p_scn, d_scn], requests)
    n_p = cfg.prefill.replicas
    groups: dict[str, list] = {}   # a data-parallel pool's LockstepGroups, by role (sim/cluster/data_parallel.py)
    prefill = _build_pool(p_scn, cfg.prefill, range(n_p), "prefill", env, check, lag, groups)
    decode = _build_pool(d_scn, cfg.decode, range(n_p, n_p + cfg.decode.replicas), "decode", env, check, 0.0, groups)
    bw, lat = cfg.link.bandwidth_latency()
    link = KVLink(env, bw, lat)
    to_decode = engine_router(make_router(cfg.router, scn.seed + 1), len(decode), cfg.decode.ranks_per_engine)
    if isinstance(to_decode, FleetRouter):   # (its engines' views and balancers; the handoff attaches no router)
        to_decode.attach(decode)
    handoff = Handoff(env, decode, to_decode, link, scn.model_spec.kv_bytes_per_token(),
                      pull=cfg.link.mode == "pull", layers=scn.model_spec.num_layers if cfg.link.layerwise else 0,
                      timeout_s=scn.workload.timeout_s)
    router = _observed(engine_router(make_router(cfg.router, scn.seed), n_p, cfg.prefill.ranks_per_engine), prefill,
                       requests, lag)
    spans = _pool_spans(cfg, groups)
    if disagg_supported(prefill, decode, requests, router, handoff.router, bool(scn.workload.max_concurrency),
                        grouped=set(groups)):
        clients = scn.workload.max_concurrency   # a client with a concurrency limit (sim/clients.py)
        planned = planned_arrivals(requests) if clients else None   # (the client's sends replace them)
        client = core_client(scn, requests, fe_out, fe_token) if clients else None
        try:   # compiled (sim/cluster/disagg_core.py)
            counts = np.zeros((len(spans), 6)) if groups else None
            _run_disaggregated_in_core(requests, prefill, decode, handoff, link, router, lag, served, bar, client,
                                       None if counts is None else (spans, counts))
        finally:
            if bar is not None:
                bar.close()
        _check_ended(requests)
        res = cluster_result(scn, workload, prefill + decode, served, handoff, link, fe_out, fe_token,
                             time.perf_counter() - t0, lag, planned=planned, keep_steps=keep_steps)
        if groups:
            from sim.cluster.data_parallel import core_counts, fleet_stats

            counts_of = iter(core_counts(int(size), row) for (_, size), row in zip(spans.tolist(), counts.tolist()))
            res.summary["cluster"]["data_parallel"] = {
                role: fleet_stats([next(counts_of) for _ in engines]) for role, engines in groups.items()}
        res.profile["compiled_core"] = True
        return res
    if bar is not None:   # (before attach_decode, which chains the decode engines' on_step)
        _show_progress(bar, decode, prefill, handoff)
    for rep in prefill:
        handoff.attach_prefill(rep)
    for rep in decode:
        handoff.attach_decode(rep)
    planned = None
    if scn.workload.max_concurrency:   # a client with a concurrency limit (sim/clients.py)
        planned = planned_arrivals(requests)

        def deliver(req: Request) -> None:
            rep = prefill[router.choose(req, prefill)]
            served[req.req_id] = rep.replica_id
            handoff.submit_prefill(rep, req)

        def on_prefill(req: Request) -> bool:   # the client's whole response: one output token, done there
            return handoff.output_len[req.req_id] <= 1

        ClientPool.for_scenario(scn, [rep.engine for rep in prefill + decode], deliver, requests, lag,
                                fed=[rep.engine for rep in prefill],
                                answers=[on_prefill] * len(prefill) + [None] * len(decode)).start()
    else:
        env.process(_arrivals(env, requests, lag, router, prefill, handoff.submit_prefill, served))
    loops = [g.start() for g in groups["prefill"]] if "prefill" in groups else [rep.engine.start() for rep in prefill]
    for loop in groups["decode"] if "decode" in groups else [rep.engine for rep in decode]:
        loop.start()
    env.process(handoff.close_after(loops))
    try:
        env.run()
    finally:
        if bar is not None:
            bar.close()
    handoff.restore_lengths(requests)
    _check_ended(requests)
    _check_released(prefill + decode)
    res = cluster_result(scn, workload, prefill + decode, served, handoff, link, fe_out, fe_token,
                         time.perf_counter() - t0, lag, planned=planned, keep_steps=keep_steps)
    if groups:
        from sim.cluster.data_parallel import fleet_stats

        res.summary["cluster"]["data_parallel"] = {role: fleet_stats([g.counts for g in engines])
                                                  for role, engines in groups.items()}
    res.profile["compiled_core"] = False
    return res


def _build_pool(scn: Scenario, pool: Any, ids: range, role: str, env: simpy.Environment, check: bool, lag: float,
                groups: dict[str, list]) -> list[Replica]:
    """A prefill or decode pool's replicas: as ``build_pool`` builds them, or, for a data-parallel pool, the
    ranks of its engines (``data_parallel_size`` each, or all of them one), their ``LockstepGroup``s put in
    ``groups`` under ``role``."""
    if not pool.data_parallel:
        return build_pool(scn, ids, role, env, check, lag)
    from sim.cluster.data_parallel import build_engines

    reps, groups[role] = build_engines(scn, ids, pool.ranks_per_engine, role, env, check, lag)
    return reps


def _check_ended(requests: list[Request]) -> None:
    """Every request finished or was refused (a prefill replica waiting for memory that no transfer was
    going to free leaves some that never did)."""
    stuck = [r.req_id for r in requests
             if r.status not in (RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.ABORTED)]
    if stuck:
        raise KvsimError("engine", f"deadlock: {len(stuck)} requests never finished (first: {stuck[0]})")


def _run_disaggregated_in_core(requests: list[Request], prefill: list[Replica], decode: list[Replica],
                               handoff: Handoff, link: KVLink, router: Router, lag: float, served: dict[int, int],
                               bar: ProgressBar | None, client: tuple | None,
                               groups: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """The pools' run in the compiled core, the prefill router's choices made ahead, by its rule or by
    calling it at each arrival (as ``_run_in_core``'s); ``client``: sent by a client (``core_client``);
    ``groups``: a data-parallel pool's engines (``run_engines``' groups)."""
    reads = router.reads_load or router.reads_memory or router.reads_state
    ahead = None if reads else _route_ahead(router, requests, prefill, lag)
    rule = None if ahead is not None else router.core_rule(requests, len(prefill))
    attach = router.attach if isinstance(router, (DataParallelBalance, FleetRouter)) else None
    run_disaggregated(requests, prefill, decode, handoff, link, lag, served, dest=ahead,
                      rule=None if rule is None else rule.as_core_arg(), choose=router.choose,
                      progress=bar.at if bar else None, client=client, attach=attach, groups=groups)


def _pool_spans(cfg: Any, groups: dict[str, list]) -> np.ndarray:
    """The compiled core's spans of the data-parallel engines of the pools in ``groups`` (prefill first)."""
    from sim.cluster.data_parallel import group_spans

    n_p = cfg.prefill.replicas
    parts = [group_spans(0, n_p, cfg.prefill.ranks_per_engine)] if "prefill" in groups else []
    if "decode" in groups:
        parts.append(group_spans(n_p, cfg.decode.replicas, cfg.decode.ranks_per_engine))
    return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)
