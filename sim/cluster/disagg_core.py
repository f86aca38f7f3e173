"""Disaggregated prefill/decode in the compiled engine core (sim/csrc/core.c, handoff.c), with the results of
the SimPy loop's (sim/cluster/disagg.py, link.py) bit for bit.

    arrivals -> prefill engines (each request with one output token; the router's choices made ahead, by
                its rule, or by calling it, as a colocated pool's)
             -> at a prefill's end, its blocks held: pull: the decode router chooses (called with the decode
                engines' counts, ``ReplicaState``), the decode engine books the prompt's blocks when nothing of
                its own waits and a seat is free, then the transfer starts; push: the transfer starts now
             -> the link (capacity 1, first come first served; layer by layer for pushed KV), the latency
             -> the prefill engine lets go of the blocks and wakes; the decode engine takes the request (push:
                chosen now), queued ahead of everything when it holds its blocks; it decodes from its first step
             -> the decode engines stop once every prefill engine has and the last transfer has landed

Covered (``disagg_supported``): pools the core covers replica by replica, each admitting alike, with or
without a client in front (its answers: a decode engine's finished requests, a prefill engine's of one
output token, every refusal at once); a decode engine's queue ahead of its policy's, as sim/sched/queues.py
keeps it; a prefill router
the core covers for a colocated pool; a decode router applied by the core where its rule reads no order of
calls (least_requests, least_kv, prefix_affinity: its hits read from the decode engines' caches), else
called with the decode engines' counts; client timeouts (``workload.timeout_s``): a request given up on its
prefill engine, waiting for its decode engine's blocks (pull), in transfer, or on its decode engine, as
sim/cluster/disagg.py aborts it; a pool of data-parallel engines (their ranks in lockstep,
sim/csrc/core/lockstep.inc), its router and a fleet's decode router called with the ranks' running requests
and the clock too. Everything else runs the SimPy loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

import sim.engine_core as engine_core
from sim.clients import in_send_order
from sim.cluster.disagg import Handoff, decode_refusal
from sim.cluster.engine_fleet import FleetRouter, routes_in_core
from sim.cluster.link import KVLink
from sim.cluster.replica import Replica, check_released
from sim.cluster.routers import LeastKV, LeastRequests, PrefixAffinity, Router
from sim.engine_core import (
    ABORT_HANDOFF,
    STATE_COLS,
    EngineParts,
    ReplicaState,
    _engine_spec,
    _hashes_of,
    _raise,
    abort_reasons,
    admission,
    core_route,
    core_supported,
    draft_counts,
    request_ints,
    requests_supported,
    same_admission,
    write_engine,
    write_requests,
    write_speculation,
)
from sim.request import Request, RequestStatus


def disagg_supported(prefill: list[Replica], decode: list[Replica], requests: list[Request], router: Router,
                     decode_router: Router, client: bool, grouped: set[str] | frozenset = frozenset()) -> bool:
    """Whether the compiled core runs these pools (the module docstring; ``client``: one is in front;
    ``grouped``: the roles whose pools are data-parallel engines, sim/csrc/core/lockstep.inc)."""
    if not engine_core.enabled or not requests_supported(requests) or (client and not in_send_order(requests)):
        return False
    if grouped and any(r.n > 1 for r in requests):
        return False
    if not (routes_in_core(router) and routes_in_core(decode_router)):
        return False
    for role, pool in (("prefill", prefill), ("decode", decode)):
        if not same_admission([rep.scheduler for rep in pool]):
            return False
        if not all(core_supported(rep.scheduler, rep.manager, rep.engine.executor, None, grouped=role in grouped)
                   for rep in pool):
            return False
    return True


def _decode_rule(router: Router, requests: list[Request], md: int) -> tuple[int, int]:
    """(the core's rule, slack) for the decode router where its choice reads no order of calls (decode routing
    follows the prefills' ends, not the requests' order: pairs or earlier turns drawn ahead in request order
    would not fit), else (0, 0): called."""
    if not isinstance(router, (LeastRequests, LeastKV, PrefixAffinity)):
        return 0, 0
    rule = router.core_rule(requests, md)
    return (rule.kind, rule.slack) if rule is not None else (0, 0)


def _parts(rep: Replica) -> EngineParts:
    e = rep.engine
    return EngineParts(rep.scheduler, e.executor, e.recorder, e.async_scheduling, e.max_stall, e.check_integrity)


def run_disaggregated(requests: list[Request], prefill: list[Replica], decode: list[Replica], handoff: Handoff,
                      link: KVLink, lag: float, served: dict[int, int], *, dest: list[int] | None = None,
                      rule: tuple | None = None, choose: Callable | None = None,
                      progress: Callable[[int], None] | None = None, client: tuple | None = None,
                      attach: Callable | None = None, groups: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Run the pools in the core over ``requests`` (handed to the prefill pool at arrival + ``lag``, or sent by
    ``client``, sim/clients.py ``core_client``, and handed over ``lag`` after), then leave every result where
    the SimPy loop leaves it: on the Requests, the replicas' schedulers, managers and recorders, ``handoff``'s
    records, ``link``'s counters and ``served`` (each request's prefill replica). ``attach``: the prefill
    router's, given the prefill engines' views; a fleet's decode router is given the decode engines' (as the
    SimPy loop attaches it); ``groups``: data-parallel engines (``run_engines``')."""
    n, mp, md = len(requests), len(prefill), len(decode)
    prompt = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=n)
    own = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n)
    p_sched, d_sched = prefill[0].scheduler, decode[0].scheduler
    ones = np.ones(n, dtype=np.int64)
    _, _, bad_p = admission(prompt, ones, p_sched)            # (one output token: never cut)
    out_d, cut_d, bad_d = admission(prompt, own, d_sched)     # as the decode pool's add_request sees them
    refused_d = bad_d & ~bad_p & (own > 1)   # the decode pool would refuse them: refused at once (Handoff)
    for i in np.flatnonzero(refused_d).tolist():
        handoff.refused[requests[i].req_id] = decode_refusal(d_sched, requests[i])
    for req in requests:   # Handoff.submit_prefill: its own length kept, one token on the prefill side
        handoff.output_len[req.req_id] = req.output_len
        req.output_len = 1
    for i in np.flatnonzero(bad_p).tolist():   # refused where they arrive: the prefill pool's reason
        requests[i].reject_reason = p_sched.reject_reason(requests[i])
    for i in np.flatnonzero(refused_d).tolist():   # or the decode pool's
        requests[i].reject_reason = handoff.refused[requests[i].req_id]
    bad_p = bad_p | refused_d
    ints = request_ints(requests, ones, (~bad_p).astype(np.int64))
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    where = np.full(n, -1, dtype=np.int64) if dest is None else np.array(dest, dtype=np.int64)
    state = np.zeros((mp + md, STATE_COLS), dtype=np.int64)   # (the prefill engines' rows are read)
    route = core_route(requests, [rep.manager for rep in prefill], state, dest, rule, choose, attach)

    d_state = np.zeros((md, STATE_COLS), dtype=np.int64)
    d_views = [ReplicaState(d_state, j, rep.manager.num_blocks, rep.block_size, rep.has_prefix_cache())
               for j, rep in enumerate(decode)]
    if isinstance(handoff.router, FleetRouter):
        handoff.router.attach(d_views)

    def route_decode(g: int) -> int:   # (Handoff: the request's own length back before the decode router)
        req = requests[g]
        req.output_len = int(own[g])
        return handoff.router.choose(req, d_views)

    counters = np.empty((6, n), dtype=np.int64)
    times = np.empty((5, n), dtype=np.float64)
    hand_i = np.empty((2, n), dtype=np.int64)      # decode engine (world index, -1), cached tokens at the prefill
    hand_f = np.empty((3, n), dtype=np.float64)    # prefill end, transfer start, transfer seconds
    tot_i = np.zeros(3, dtype=np.int64)            # bytes sent, done on the prefill side, in flight at the end
    tot_f = np.zeros(1, dtype=np.float64)          # link busy seconds
    caching_p = any(rep.has_prefix_cache() for rep in prefill)
    caching_d = any(rep.has_prefix_cache() for rep in decode)
    hashes_p = _hashes_of(requests, p_sched.manager.block_size) if caching_p else None
    hashes_d = _hashes_of(requests, d_sched.manager.block_size) if caching_d else None
    bw, latency = link.bandwidth, link.latency_s
    disagg = (mp, int(handoff.pull), handoff.layers, handoff.kv_bytes_per_token, float(bw), float(latency), own,
              out_d, (~bad_d).astype(np.int64), route_decode, d_state, hashes_d, hand_i, hand_f, tot_i, tot_f,
              *_decode_rule(handoff.router, requests, md))
    parts = [_parts(rep) for rep in prefill + decode]
    drafts = draft_counts(n, [p.scheduler for p in parts])
    specs = [_engine_spec(p, drafts) for p in parts]
    results = engine_core.native.run_core(n, ints, arrival, where, float(lag), route, state, progress,
                                          engine_core.PROGRESS_EVERY, counters, times, specs, hashes_p, client, disagg,
                                          groups)
    for err, _, _ in results:
        _raise(err)
    if client is not None:   # (the core wrote each request's send time over its arrival)
        for req, sent in zip(requests, arrival.tolist()):
            req.arrival_s = sent
    dst = hand_i[0]
    aborted = counters[0] == int(RequestStatus.ABORTED)
    between = aborted & (counters[4] & ABORT_HANDOFF != 0)   # (given up in the hand-off: no engine's)
    on_prefill = aborted & ~between & (dst < 0)
    _write_back(requests, prefill, decode, handoff, link, served, where, dst, own, out_d, hand_i, hand_f, tot_i,
                tot_f, counters, times, between, on_prefill)
    abort_reasons(requests, counters, [p.scheduler for p in parts], np.where(dst >= 0, dst, where))
    for e, (part, spec, (_, records, totals)) in enumerate(zip(parts, specs, results)):
        mine = where == e if e < mp else dst == e
        if spec[4] is not None:   # (a request drafts on its decode engine only: one token on the prefill side)
            write_speculation(part.scheduler.speculation, spec[4], requests, drafts, mine & (e >= mp))
        if e >= mp:
            part.scheduler.num_truncated += int(np.count_nonzero(cut_d & mine))
        handed = [requests[g] for g in np.flatnonzero(mine).tolist()]
        write_engine(part.scheduler, handed, records, totals, collect=e >= mp)
        check_released((prefill + decode)[e], free_blocks=totals[17])
        if e < mp:   # a prefill engine finished every request it did not refuse or abort (some went on to the
            sched = part.scheduler   # decode pool)
            sched.rejected.extend(requests[g] for g in np.flatnonzero(mine & bad_p).tolist())
            sched.finished.extend(requests[g] for g in np.flatnonzero(mine & ~bad_p & ~on_prefill).tolist())
            sched.aborted.extend(requests[g] for g in np.flatnonzero(mine & on_prefill).tolist())


def _write_back(requests: list[Request], prefill: list[Replica], decode: list[Replica], handoff: Handoff,
                link: KVLink, served: dict[int, int], where: np.ndarray, dst: np.ndarray, own: np.ndarray,
                out_d: np.ndarray, hand_i: np.ndarray, hand_f: np.ndarray, tot_i: np.ndarray, tot_f: np.ndarray,
                counters: np.ndarray, times: np.ndarray, between: np.ndarray, on_prefill: np.ndarray) -> None:
    """The run's per-request results onto the Requests (their lengths as each pool left them), the replicas'
    hand-over counts, ``served`` and the hand-off's and link's records (``between``: the requests given up in
    the hand-off, ``on_prefill``: on their prefill engine)."""
    mp = len(prefill)
    decoded = dst >= 0
    for req, g_dst, o_d, o in zip(requests, dst.tolist(), out_d.tolist(), own.tolist()):
        req.output_len = o_d if g_dst >= 0 else o   # (one that never left its prefill engine: its own, as
        # Handoff.restore_lengths gives it; one of one output token finished there with it)
    write_requests(requests, counters, times)
    d_sched = decode[0].scheduler
    for g in np.flatnonzero(decoded).tolist():   # refused on arrival at the decode pool: its reason, its prefill's
        req = requests[g]                         # counters and times (write_requests keeps a refusal's status only)
        if req.status == RequestStatus.REJECTED:
            req.reject_reason = d_sched.reject_reason(req)
            _, comp, gen, pre, int_zero, _ = counters[:, g].tolist()
            sched_s, first, last, _, _ = times[:, g].tolist()
            req.num_computed_tokens, req.num_generated, req.num_preemptions = comp, gen, pre
            req.first_scheduled_s = 0 if int_zero & 1 else sched_s
            req.first_token_s, req.last_token_s = first, last
    for e, rep in enumerate(prefill):
        rep.submitted = int(np.count_nonzero(where == e))
    for j, rep in enumerate(decode):
        rep.submitted = int(np.count_nonzero(dst == mp + j))
    ids = [r.req_id for r in requests]
    for rid, e in zip(ids, where.tolist()):
        served[rid] = prefill[e].replica_id
    cached = hand_i[1].tolist()
    prefill_end, start, took = (hand_f[k].tolist() for k in range(3))
    for g, req in enumerate(requests):
        rid = req.req_id
        if (req.status == RequestStatus.REJECTED and not decoded[g]) or on_prefill[g]:
            continue   # (refused, or given up, on its prefill replica: no hand-off)
        handoff.prefill_of[rid] = prefill[where[g]].replica_id
        handoff.cached_tokens[rid] = cached[g]
        if own[g] <= 1:
            continue
        handoff.prefill_end[rid] = prefill_end[g]
        if not math.isnan(start[g]):
            handoff.transfer_start[rid] = start[g]
        if not math.isnan(took[g]):
            handoff.transfer_s[rid] = took[g]
        if decoded[g]:
            handoff.decode_of[rid] = decode[dst[g] - mp].replica_id
    finish = times[3]
    for g in sorted(np.flatnonzero(between).tolist(), key=lambda g: finish[g]):   # (in the order they were given up)
        handoff.aborted_at[requests[g].req_id] = float(finish[g])
    handoff.done_on_prefill = int(tot_i[1])
    handoff.in_flight = int(tot_i[2])
    link.bytes_sent = int(tot_i[0])
    link.busy_s = float(tot_f[0])
