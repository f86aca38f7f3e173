"""A cluster run's results: requests.csv with the replica(s) of each request, steps.csv of every replica,
replicas.csv (one row per replica), and summary.json with a ``cluster`` block.

Definitions:
- requests: ``replica`` (where it finished: its decode replica under prefill/decode), ``prefill_replica``
  (where its prompt ran; the same replica when colocated), ``kv_wait_s`` (from the end of its prefill to
  the start of its KV transfer: pulled, the wait for a decode replica's seat and blocks; 0 pushed),
  ``transfer_s`` (from the start of the transfer to the last byte's arrival: the link's queue, its wire
  time and latency); both 0 colocated, empty when nothing was sent.
- per replica: ``busy_fraction`` = time executing steps / the cluster's makespan; ``kv_usage_mean``
  weighted by step duration; ``prefix_hit_rate`` its own cache's hit rate (0 on decode replicas, which
  receive prompts rather than look them up).
- cluster: ``load_imbalance`` = max / mean requests per replica (per pool under prefill/decode, the worse
  of the two); the cluster's ``prefix_cache_hit_rate`` pools the hit and looked-up tokens of the
  replicas that run prompts (colocated or prefill); KV usage and the memory breakdown are averaged over
  every replica's steps, weighted by step duration, each step as a share of its own replica's capacity.
Invariant: one colocated replica gives exactly the single engine's summary (no ``cluster`` block).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.clients import add_client_waits, with_client_rows
from sim.cluster.disagg import Handoff
from sim.cluster.link import KVLink
from sim.cluster.replica import Replica
from sim.executors.base import step_model
from sim.lora import add_lora_column, lora_summary
from sim.metrics import (
    SUMMARY_STEP_COLUMNS,
    fanout_summary,
    requests_frame,
    step_dtype,
    summarize,
    with_latencies,
)
from sim.runner import Result, hbm_budget_of
from sim.sched.records import TokenGaps, joined_gaps
from sim.specs import group_kv_bytes_per_block
from sim.speculative import add_request_columns
from sim.speculative import summary_of as speculation_summary
from sim.workload.fanout import add_sample_columns

SLOT_COLS = ["slots_token_states", "slots_reserved", "slots_internal_frag", "slots_external_frag", "slots_free"]


@dataclass
class ClusterResult(Result):
    replicas: pd.DataFrame | None = None   # replicas.csv


@dataclass
class _Merged:
    """The scheduler counters ``summarize`` reads, summed over replicas."""

    num_truncated: int
    num_preemptions: int
    swapped_blocks: int
    gaps: TokenGaps
    timeout_s: float | None = None   # workload.timeout_s (summarize then counts the aborted)


def _step_table(reps: list[Replica], only: list[str] | None = None,
                shares: bool = False) -> tuple[pd.DataFrame, list[int]]:
    """Every replica's per-step table (``steps_frame`` and ``kv_bytes_used``), one replica after another,
    each recorder read once straight into its rows and released; with several replicas, tagged with
    ``replica`` after ``step``, and a column some replica lacks is NaN in its rows (pd.concat's outer join).
    ``only``: just these columns, no ``step`` nor ``replica``. ``shares`` (a table for ``_merged_summary``
    alone): the slot columns as each step's share of its replica's capacity_slots (``_shares``, float64). Also the row offsets: replica i's rows are ``bounds[i]:bounds[i + 1]``."""
    recs = [rep.engine.recorder for rep in reps]
    lengths = [rec.num_steps for rec in recs]
    bounds = [0, *itertools.accumulate(lengths)]
    own = [[name for name in (*rec.step_names(), "kv_bytes_used") if only is None or name in only] for rec in recs]
    names = list(dict.fromkeys(name for cols in own for name in cols))
    cols = {}
    if only is None:
        starts = np.repeat(np.array(bounds[:-1], dtype=np.int64), lengths)
        cols["step"] = np.arange(bounds[-1], dtype=np.int64) - starts
        if len(reps) > 1:
            cols["replica"] = np.repeat(np.array([r.replica_id for r in reps], dtype=np.int64), lengths)
        del starts
    everywhere = set.intersection(*(set(c) for c in own))
    floats = set(SLOT_COLS) if shares else set()
    cols.update((name, np.empty(bounds[-1], dtype=_dtype(name) if name in everywhere and name not in floats
                                else np.float64)) for name in names)
    for rep, rec, at, has in zip(reps, recs, bounds, own):
        rows = slice(at, at + rec.num_steps)
        rec.read_steps(cols, at, release=True)
        if "kv_bytes_used" in cols:
            bpb = group_kv_bytes_per_block(rep.scn.model_spec, rep.scn.hardware_spec, rep.block_size)
            np.multiply(cols["kv_blocks_used"][rows], bpb, out=cols["kv_bytes_used"][rows])
        for name in set(names).difference(has):
            cols[name][rows] = np.nan
        for name in floats.intersection(names):
            np.divide(cols[name][rows], float(rep.manager.capacity_slots), out=cols[name][rows])
    return pd.DataFrame(cols, copy=False), bounds


def _dtype(name: str) -> type:
    """A step table column's dtype where every replica has it."""
    return np.int64 if name == "kv_bytes_used" else step_dtype(name)


def _step_models(reps: list[Replica]) -> dict:
    """What priced the replicas' steps: one description when every replica's is the same, else one a role
    (prefill and decode pools may run on different hardware), or a group of a mixed fleet ("group 0", ...)."""
    by_role = {}
    for rep in reps:
        by_role.setdefault(rep.role if rep.group is None else f"group {rep.group}", step_model(rep.engine.executor))
    models = list(by_role.values())
    return models[0] if all(m == models[0] for m in models) else by_role


def _hit_rate(reps: list[Replica]) -> float:
    caches = [r.manager.prefix_cache for r in reps if getattr(r.manager, "prefix_cache", None) is not None]
    query = sum(c.query_tokens for c in caches)
    return sum(c.hit_tokens for c in caches) / query if query else 0.0


def _imbalance(counts: list[int]) -> float:
    mean = float(np.mean(counts)) if counts else 0.0
    return max(counts) / mean if mean else math.nan


def replicas_frame(reps: list[Replica], steps: pd.DataFrame, bounds: list[int], makespan: float,
                   reqs: pd.DataFrame, handoff: Handoff | None = None) -> pd.DataFrame:
    """One row per replica; replica i's steps are rows ``bounds[i]:bounds[i + 1]`` of ``steps``. ``finished``:
    the requests that finished there (``reqs``' ``replica``: a prefill replica's are those of one output
    token), ``handed_off``: the prompts a prefill replica passed to the decode pool (0 elsewhere); each
    request is finished or rejected on exactly one replica."""
    finished = reqs.loc[reqs["status"] == "FINISHED", "replica"].value_counts()
    handed: dict[int, int] = {}
    dropped: dict[int, int] = {}   # aborted between the pools (a client timeout), by prefill replica
    if handoff is not None:
        for rid in handoff.aborted_at:
            src = handoff.prefill_of[rid]
            dropped[src] = dropped.get(src, 0) + 1
        for rid, src in handoff.prefill_of.items():   # (not one aborted before its transfer: it never left)
            if handoff.output_len[rid] > 1 and (rid not in handoff.aborted_at or rid in handoff.transfer_start):
                handed[src] = handed.get(src, 0) + 1
    rows = []
    for rep, lo, hi in zip(reps, bounds, bounds[1:]):
        st = steps.iloc[lo:hi]
        w = st["duration_s"].to_numpy()
        busy = float(w.sum())
        hw = rep.scn.hardware_spec
        rows.append({
            "replica": rep.replica_id, "role": rep.role, "hardware": hw.name, "tensor_parallel": hw.tensor_parallel,
            "num_gpu_blocks": rep.num_gpu_blocks, "requests": rep.submitted,
            "finished": int(finished.get(rep.replica_id, 0)), "handed_off": handed.get(rep.replica_id, 0),
            "rejected": len(rep.scheduler.rejected),
            **({"aborted": len(rep.scheduler.aborted) + dropped.get(rep.replica_id, 0)}
               if rep.scheduler.timeout_s is not None else {}),
            "busy_s": busy, "busy_fraction": busy / makespan if makespan else 0.0,
            "kv_usage_mean": float((st["kv_usage"] * w).sum() / busy) if busy else 0.0,
            "kv_usage_max": float(st["kv_usage"].max()) if len(st) else 0.0,
            "prefix_hit_rate": _hit_rate([rep]) if rep.role != "decode" else 0.0,
            "preemptions": int(rep.scheduler.num_preemptions), "num_steps": len(st),
        })
    table = pd.DataFrame(rows)
    stages = [rep.scn.hardware_spec.pipeline_parallel for rep in reps]
    if any(p > 1 for p in stages):   # pipeline stages somewhere: each replica's (its GPUs: TP x PP)
        table.insert(table.columns.get_loc("tensor_parallel") + 1, "pipeline_parallel", stages)
    if any(rep.group is not None for rep in reps):   # a mixed colocated fleet: each replica's group
        table.insert(1, "group", [rep.group for rep in reps])
    if any(rep.dp_engine is not None for rep in reps):   # data-parallel engines, several in a pool: each rank's
        table.insert(2, "engine", [-1 if rep.dp_engine is None else rep.dp_engine for rep in reps])
    return table


def cluster_result(scn, workload, reps: list[Replica], served: dict[int, int], handoff: Handoff | None,
                   link: KVLink | None, fe_out: float, fe_token: float, wall_time_s: float,
                   lag: float = 0.0, columns: dict[str, Any] | None = None,
                   planned: pd.Series | None = None, keep_steps: bool = True) -> ClusterResult:
    """``lag``: each request's frontend input latency and the router's decision time, from its arrival to
    its replica (the timeline's ``frontend`` interval); ``columns``: the requests' table's first columns
    from the compiled core (sim/core_requests.py), else it is read from the Requests; ``planned``: with a
    client, the workload's arrivals (sim/clients.py ``add_client_waits``)."""
    requests = workload.requests
    if handoff is not None:   # the prefix-cache hit of a request is its prefill's
        for r in requests:
            r.num_cached_tokens = handoff.cached_tokens.get(r.req_id, r.num_cached_tokens)
    if columns is not None:
        reqs = with_latencies(columns, output_latency_s=fe_out, token_latency_s=fe_token)
    else:
        reqs = requests_frame(requests, output_latency_s=fe_out, token_latency_s=fe_token)
    if planned is not None:
        add_client_waits(reqs, planned)
    add_sample_columns(reqs, workload.origin)
    shares = len(reps) > 1 and not keep_steps   # (a table the merged summary alone reads: its slots as shares)
    steps, bounds = _step_table(reps, None if keep_steps else SUMMARY_STEP_COLUMNS, shares=shares)
    if len(reps) == 1:   # the single engine's summary, built exactly as sim/runner.py builds it
        rep = reps[0]
        manager, sched = rep.manager, rep.scheduler
        hit = manager.prefix_cache_hit_rate() if hasattr(manager, "prefix_cache_hit_rate") else 0.0
        summary = summarize(reqs, steps, sched, capacity_slots=manager.capacity_slots, wall_time_s=wall_time_s,
                            prefix_cache_hit_rate=hit)
        summary["num_gpu_blocks"] = rep.num_gpu_blocks
        budget = hbm_budget_of(rep.scn, rep.num_gpu_blocks)
        if budget is not None:
            summary["hbm_budget"] = budget
        if hasattr(manager, "sharing_summary"):
            summary.update(manager.sharing_summary(group_kv_bytes_per_block(rep.scn.model_spec, rep.scn.hardware_spec,
                                                                            rep.block_size)))
        timeline = sched.timeline_frame() if hasattr(sched, "timeline_frame") else None
    else:
        summary, timeline = _merged_summary(scn, reqs, reps, steps, bounds, handoff, wall_time_s, shares_in=shares)
    ids = reqs["req_id"].to_numpy()
    pre = np.array([served.get(int(i), -1) for i in ids], dtype=np.int64)
    if handoff is not None:
        reqs["replica"] = [handoff.decode_of.get(int(i), p) for i, p in zip(ids, pre)]
        reqs["prefill_replica"] = pre
        reqs["kv_wait_s"] = [handoff.transfer_start[int(i)] - handoff.prefill_end[int(i)]
                             if int(i) in handoff.transfer_s else math.nan for i in ids]
        reqs["transfer_s"] = [handoff.transfer_s.get(int(i), math.nan) for i in ids]
    else:
        reqs["replica"] = pre
        reqs["prefill_replica"] = pre
        reqs["kv_wait_s"] = 0.0
        reqs["transfer_s"] = 0.0
    summary["step_model"] = _step_models(reps)
    if "sample_of" in reqs:
        summary["fanout"] = fanout_summary(reqs)
    caches = [rep.engine.scheduler.adapters for rep in reps if rep.engine.scheduler.adapters is not None]
    if caches:   # (LoRA: the replicas' adapter loads together, each request's adapter)
        summary["lora"] = lora_summary(caches)
        add_lora_column(reqs, workload.requests)
    speculating = [rep.engine.scheduler.speculation for rep in reps if rep.engine.scheduler.speculation is not None]
    if speculating:   # (the replicas' drafts and acceptances together)
        summary["speculative"] = speculation_summary(speculating)
        add_request_columns(reqs, speculating)
    if timeline is not None and lag > 0:
        timeline = _with_frontend(timeline, reqs, lag)
    if timeline is not None and planned is not None:
        timeline = with_client_rows(timeline, reqs, planned)
    table = replicas_frame(reps, steps, bounds, summary["makespan_s"], reqs, handoff)
    if len(reps) > 1:
        summary["cluster"] = _cluster_block(scn, reps, reqs, handoff, link)
        mixed = scn.cluster.groups is not None
        budgets = {f"group {rep.group}" if mixed else rep.role: hbm_budget_of(rep.scn, rep.num_gpu_blocks)
                   for rep in reps}
        if any(b is not None for b in budgets.values()):   # a pool's cache sized from HBM: one replica's budget
            summary["cluster"]["hbm_budget_per_replica"] = {key: b for key, b in budgets.items() if b is not None}
    return ClusterResult(scn, summary, reqs, steps if keep_steps else None, dict(workload.stats), timeline,
                         replicas=table)


def _merged_summary(scn, reqs, reps, steps: pd.DataFrame, bounds: list[int], handoff: Handoff | None,
                    wall_time_s: float, shares_in: bool = False):
    """The summary over every replica's steps (``_step_table``), and the merged timeline. ``shares_in``: the
    table's slot columns are the shares already (``_step_table(only=..., shares=True)``)."""
    gaps = joined_gaps([rep.scheduler.gaps for rep in reps])
    merged = _Merged(sum(r.scheduler.num_truncated for r in reps), sum(r.scheduler.num_preemptions for r in reps),
                     sum(r.scheduler.swapped_blocks for r in reps), gaps, reps[0].scheduler.timeout_s)
    # what summarize reads of the steps, each step's slots as a share of its own replica's capacity
    share = pd.DataFrame({"duration_s": steps["duration_s"].to_numpy(), "kv_usage": steps["kv_usage"].to_numpy(),
                          **{c: steps[c].to_numpy() if shares_in else _shares(steps[c].to_numpy(), reps, bounds)
                             for c in SLOT_COLS}}, copy=False)
    serving = [r for r in reps if r.role != "decode"]
    summary = summarize(reqs, share, merged, capacity_slots=1, wall_time_s=wall_time_s,
                        prefix_cache_hit_rate=_hit_rate(serving))
    summary["num_gpu_blocks"] = int(sum(r.num_gpu_blocks for r in reps))
    parts = [r.manager.sharing_summary(group_kv_bytes_per_block(r.scn.model_spec, r.scn.hardware_spec, r.block_size))
             for r in reps if hasattr(r.manager, "sharing_summary")]
    for k in dict.fromkeys(key for p in parts for key in p):   # (a pool may have a host tier the other has not)
        vals = [p.get(k, 0) for p in parts]
        summary[k] = float(np.mean(vals)) if k == "kv_sharing_saving" else sum(vals)
    hosts = [r.manager.host for r in reps if getattr(r.manager, "host", None) is not None]
    if hosts:   # the host tiers' rate pools their tokens, as the prefix cache's does
        query = sum(h.query_tokens for h in hosts)
        summary["host_cache_hit_rate"] = sum(h.hit_tokens for h in hosts) / query if query else 0.0
    timeline = None
    tls = [_decode_side(r.scheduler.timeline_frame()) if r.role == "decode" else r.scheduler.timeline_frame()
           for r in reps if hasattr(r.scheduler, "timeline_frame")]
    if tls:
        if handoff is not None:   # between its prefill and its decode replica: the wait for a decode seat
            ids = [i for i in handoff.transfer_start if i in handoff.transfer_s]   # (pulled), then the link
            start = np.array([handoff.transfer_start[i] for i in ids], dtype=float)
            end = start + np.array([handoff.transfer_s[i] for i in ids], dtype=float)
            ended = np.array([handoff.prefill_end[i] for i in ids], dtype=float)
            moving = pd.DataFrame({"req_id": ids, "phase": "transferring", "start_s": start, "end_s": end})
            waited = ended < start
            waiting = pd.DataFrame({"req_id": np.array(ids, dtype=np.int64)[waited], "phase": "kv_wait",
                                    "start_s": ended[waited], "end_s": start[waited]})
            # aborted by the handoff (a client timeout): waiting for blocks from the prefill's end, or after
            # the link, until the abort; the prefill replica's DONE point moves there
            gone = handoff.aborted_at
            queued = [i for i in gone if i not in handoff.transfer_start]
            handed = dict(handoff.transfer_start) | {i: handoff.prefill_end[i] for i in queued}
            held = pd.DataFrame({"req_id": np.array(queued, dtype=np.int64), "phase": "kv_wait",
                                 "start_s": [handoff.prefill_end[i] for i in queued],
                                 "end_s": [gone[i] for i in queued]})
            done = pd.DataFrame({"req_id": np.array(list(gone), dtype=np.int64), "phase": "done",
                                 "start_s": list(gone.values()), "end_s": list(gone.values())})
            tls = [_without_handed_done(tl, handed) for tl in tls] + [waiting, moving] + \
                [part for part in (held, done) if len(part)]
        timeline = pd.concat(tls).sort_values(["req_id", "start_s"], kind="stable").reset_index(drop=True)
    return summary, timeline


def _with_frontend(timeline: pd.DataFrame, reqs: pd.DataFrame, lag: float) -> pd.DataFrame:
    """``timeline`` with each request's ``frontend`` interval (arrival to arrival + ``lag``) ahead of its other
    rows (at equal times the frontend first), as the single engine's (sim.runner.timeline_with_frontend)."""
    arrive = reqs["arrival_s"].to_numpy(dtype=float)
    front = pd.DataFrame({"req_id": reqs["req_id"].to_numpy(), "phase": "frontend", "start_s": arrive,
                          "end_s": arrive + lag})
    rows = pd.concat([front, timeline.astype({"phase": str})], ignore_index=True)
    return rows.sort_values(["req_id", "start_s"], kind="stable").reset_index(drop=True)


def _shares(slots: np.ndarray, reps: list[Replica], bounds: list[int]) -> np.ndarray:
    """Each step's ``slots`` / its replica's capacity_slots, as float64 (the rows of replica i are
    ``bounds[i]:bounds[i + 1]``)."""
    out = np.empty(len(slots), dtype=np.float64)
    for rep, lo, hi in zip(reps, bounds, bounds[1:]):
        np.divide(slots[lo:hi], float(rep.manager.capacity_slots), out=out[lo:hi])
    return out


def _decode_side(tl: pd.DataFrame) -> pd.DataFrame:
    """A decode replica's timeline, its queue named ``decode_waiting`` (apart from the prefill side's)."""
    phase = tl["phase"].astype(str)
    return tl.assign(phase=phase.where(phase != "waiting", "decode_waiting"))


def _without_handed_done(tl: pd.DataFrame, transfer_start: dict[int, float]) -> pd.DataFrame:
    """Drop the DONE point a prefill replica marks for a request it hands on (at or before its transfer
    starts): the request finishes on its decode replica."""
    t0 = tl["req_id"].map(transfer_start)
    handed = (tl["phase"] == "done") & t0.notna() & (tl["start_s"] <= t0)
    return tl[~handed]


def _groups_block(reps: list[Replica], reqs: pd.DataFrame) -> list[dict]:
    """A mixed fleet's groups: each one's replicas, hardware, tensor-parallel degree, the requests routed
    to it and its finished requests' mean TTFT and E2E (client-side, as requests.csv's)."""
    done = reqs[reqs["status"] == "FINISHED"]
    where = {rep.replica_id: rep.group for rep in reps}
    group_of = done["replica"].map(where)
    out = []
    for g in sorted({rep.group for rep in reps}):
        mine = [rep for rep in reps if rep.group == g]
        hw = mine[0].scn.hardware_spec
        own = done[group_of == g]
        out.append({"group": g, "replicas": len(mine), "hardware": hw.name, "tensor_parallel": hw.tensor_parallel,
                    **({"pipeline_parallel": hw.pipeline_parallel} if hw.pipeline_parallel > 1 else {}),
                    "requests": sum(rep.submitted for rep in mine), "finished": len(own),
                    "ttft_s_mean": float(own["ttft_s"].mean()) if len(own) else math.nan,
                    "e2e_s_mean": float(own["e2e_s"].mean()) if len(own) else math.nan})
    return out


def _cluster_block(scn, reps: list[Replica], reqs: pd.DataFrame, handoff: Handoff | None,
                   link: KVLink | None) -> dict:
    cfg = scn.cluster
    counts = [r.submitted for r in reps]
    block = {"replicas": len(reps), "router": cfg.router.policy, "requests_per_replica": counts}
    if handoff is None:
        block["load_imbalance"] = _imbalance(counts)
        block.update(prefill_replicas=0, decode_replicas=0, transferred_kv_bytes=0, kv_wait_s_mean=0.0,
                     kv_wait_s_p90=0.0, transfer_s_mean=0.0, transfer_s_p90=0.0, link_busy_fraction=0.0)
        if cfg.groups is not None:
            block["groups"] = _groups_block(reps, reqs)
        return block
    pre = [r.submitted for r in reps if r.role == "prefill"]
    dec = [r.submitted for r in reps if r.role == "decode"]
    t = reqs["transfer_s"].dropna().to_numpy(dtype=float)
    w = reqs["kv_wait_s"].dropna().to_numpy(dtype=float)
    makespan = float(np.nanmax(reqs["finish_s"].to_numpy(dtype=float)) - reqs["arrival_s"].min()) if len(reqs) else 0.0
    block.update(
        prefill_replicas=len(pre), decode_replicas=len(dec),
        load_imbalance=max(_imbalance(pre), _imbalance(dec)),
        transferred_kv_bytes=int(link.bytes_sent),
        kv_wait_s_mean=float(w.mean()) if w.size else 0.0,
        kv_wait_s_p90=float(np.percentile(w, 90)) if w.size else 0.0,
        transfer_s_mean=float(t.mean()) if t.size else 0.0,
        transfer_s_p90=float(np.percentile(t, 90)) if t.size else 0.0,
        link_busy_fraction=link.busy_s / makespan if makespan > 0 else 0.0,
        link=cfg.link.link if isinstance(cfg.link.link, str) else cfg.link.link.model_dump(),
    )
    return block
