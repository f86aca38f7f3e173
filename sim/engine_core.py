"""The compiled engine core: an engine's whole run in sim/csrc/core.c (or a colocated cluster's, its
replicas behind one arrival process), where the scenario is one it covers, with the results of
sim/engine.py's SimPy loop bit for bit.

Covered (``core_supported``): continuous batching under FCFS, round-robin, priority or
longest-prefix-first (without a prefix cache every match is empty: FCFS) with recompute or swap preemption, the paged manager with or without prefix caching (hits, evictions and a preempted
request finding its own blocks again: blocks by identity in sim/csrc/kvpool.c, where the manager's are
counts alone without a cache; the cache's host tier in sim/csrc/hostlru.c), requests of one sequence (shared-prefix groups included) or
of parallel samples (n > 1: forked after the first token, copy-on-write of the shared last block, siblings
recomputing their own blocks after a preemption; sim/kv/sharing.py), the cost model
as executor; static batching (FCFS or priority, the paged manager, no prefix cache: sim/sched/static.py's
batches, their finished members idle until the last one finishes); the contiguous allocators instead of
the paged manager (sim/kv/contiguous.py: a region a request, first fit over the free extents); models with
local attention (sliding windows, Llama 4's chunks: each entry's keys, pairs and cached reads as the local
layers see them, LocalAttention.step_stats), and vLLM's hybrid manager's window pages (sim/kv/window_pages.py:
each request's pages of the blocks its next query sees, freed before a step allocates and, behind a prefill
chunk, as the next step is planned; by identity with a prefix cache); in a cluster, a router that reads at most the replicas' loads and KV usage; a client with a concurrency limit in front (sim/clients.py: its sends, hand-overs, slot releases and pauses, sim/csrc/client.c; ``core_client``); speculative decoding (sim/speculative.py: each decode's drafts, the acceptance
draws from the Speculation's own generator, whose state the core takes and gives back, sim/csrc/speculate.c;
the rejected drafts' blocks trimmed; the drafter's passes priced from its executor's constants and size
terms); LoRA serving (sim/lora.py: the batch's adapter limit in admission, each plan's adapters made
resident in the GPU slots and host cache, their loads and kernels priced, ``lora_affinity`` routing over
the engines' residency; sim/csrc/core/lora.inc); pipeline stages (sim/executors/pipeline.py: chunks capped
at a batch's tokens, each step's microbatches priced on each stage kind's cost model, core/pricing.inc
``price_pipeline``); data-parallel engines of colocated ranks stepping in lockstep (sim/cluster/data_parallel.py,
core/lockstep.inc: one process a group, each rank priced on the group's padded tokens, the step the slowest
rank's; the router reading the ranks' running requests and the clock too, ``ReplicaState``). There a step
costs about a microsecond instead of tens: the requests'
state lives in typed arrays, each step is planned, priced, updated and recorded without a Python object,
and only the executor's GEMM, all-reduce and LM-head times (once per size), the recorder (a chunk of rows
at a time), the router (once per request, where it reads the replicas), the block hashes of each request's
shareable content (once per request: ``_hashes_of``) and the progress bar are called
back (and the drafter's size terms and the LoRA kernels' price, once per size). Disaggregated prefill/decode pools run here too
(sim/cluster/disagg_core.py). Everything else (beam search, the GPU executor) runs the SimPy loop. ``KVSIM_CORE=0`` (or
``KVSIM_NATIVE=0``, or ``enabled = False`` here) runs the SimPy loop for every scenario:
tests/test_engine_core.py and tests/test_engine_core_prefix.py compare them.

The core knows what a request's arrival does (the output cap, the reasons to reject it) only as flags:
``prepare`` applies them to the requests as ``add_request`` would, the core says when each was handed
over. After the run ``write_requests`` and ``write_engine`` put the requests' counters and times, each
scheduler's timeline and inter-token gaps and each manager's sums and peaks where the SimPy loop would
have left them, so the summary and tables are built by the same code either way; asked for the columns
(``columns=True``: sim/runner.py and the colocated clusters), the requests' table comes from the core's
arrays instead (sim/core_requests.py, checked against the table read back from the Requests), and the
Requests get only their status.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from sim.core_requests import request_columns
from sim.errors import KvsimError
from sim.executors.cost_model import BREAKDOWN_PARTS, CostModelExecutor
from sim.executors.data_parallel import DataParallelPricer
from sim.executors.engine_params import (
    ATTENTION_OPS_PER_LAYER,
    FUSED_ELEMENTWISE_KERNELS,
)
from sim.executors.pipeline import PipelineExecutor
from sim.kv.contiguous import ContiguousKVManager
from sim.kv.manager import KVCacheManager
from sim.kv.prefix_cache import NO_BLOCKS
from sim.kv.sliding_only import SlidingKVCacheManager
from sim.kv.window_pages import WindowedKVCacheManager
from sim.metrics import STEP_COLUMNS, Columns, Recorder
from sim.native import native
from sim.request import Request, RequestStatus
from sim.sched.continuous import ContinuousScheduler
from sim.sched.deadlines import timeout_reason
from sim.sched.static import StaticScheduler
from sim.workload.tokens import block_hash_array, shareable_blocks

enabled = os.environ.get("KVSIM_CORE", "1") != "0"
CONTIGUOUS_MODES = {"contiguous-max": 1, "contiguous-pow2": 2, "contiguous-oracle": 3}   # core.c's ``contig``
PROGRESS_EVERY = 500   # steps between two calls of the progress callback (as the SimPy loop's bar reads)


def core_supported(scheduler: Any, manager: Any, executor: Any, requests: list[Request] | None,
                   grouped: bool = False) -> bool:
    """Whether the compiled core runs this engine (the module docstring lists what it covers) over
    ``requests`` (None: they were checked already, ``requests_supported``); ``grouped``: as a rank of a
    data-parallel group (its executor a ``DataParallelPricer``, priced as the group's)."""
    if not enabled or native is None or not hasattr(native, "run_core"):
        return False
    cfg = scheduler.config
    if not _speculation_supported(scheduler, executor):
        return False
    if type(manager) is ContiguousKVManager:
        if manager.space.num_free != manager.num_blocks:
            return False   # (the core starts the space unused: one free extent)
        cache = None
    elif type(manager) not in (KVCacheManager, WindowedKVCacheManager, SlidingKVCacheManager):
        return False
    else:
        cache = manager.prefix_cache
        if manager.host is not None and len(manager.host):
            return False   # (the core starts a host tier empty)
        if manager.window_pages_held() or manager.stale_pages:
            return False   # (the core starts with no window pages)
    if type(scheduler) is StaticScheduler:
        if cache is not None:
            return False
    elif (type(scheduler) is not ContinuousScheduler
          or cfg.policy not in ("fcfs", "priority", "round_robin", "longest_prefix_first")
          or getattr(cfg, "batching", "continuous") != "continuous"):
        return False
    if cache is not None and (manager.pool.num_free != manager.num_blocks or cache.cached.any()):
        return False   # (the core starts a cache from an unused pool, its free queue in id order)
    if type(executor) is PipelineExecutor:   # (its stages' cost models; no drafts, adapters or forks with them)
        if not all(type(s) is CostModelExecutor and s._core_priced for s in executor.stages) or \
                scheduler.speculation is not None or scheduler.lora is not None or \
                executor.batch_tokens != scheduler.batch_tokens:
            return False
        return requests is None or requests_supported(requests)
    if grouped:
        if type(executor) is not DataParallelPricer or not executor.group_core_priced:
            return False
    elif type(executor) is not CostModelExecutor or not executor._core_priced:
        return False
    if (scheduler.lora is None) != (executor._lora is None) or (scheduler.lora is not None
                                                                and type(scheduler) is not ContinuousScheduler):
        return False   # (LoRA: the scheduler's adapters and the executor's kernels both, continuous batching)
    return requests is None or requests_supported(requests, forks_in_core(scheduler, manager))


def _speculation_supported(scheduler: Any, executor: Any) -> bool:
    """Whether the core prices this engine's speculation as ``execute`` does: none, or a scheduler that drafts
    with a drafter set on the executor (sim/executors/drafter.py), its model priced by the cost model."""
    drafter = getattr(executor, "drafter", None)
    if scheduler.speculation is None or drafter is None:
        return scheduler.speculation is None and drafter is None
    return drafter.executor is None or (type(drafter.executor) is CostModelExecutor
                                        and drafter.executor._core_priced)


def forks_in_core(scheduler: Any, manager: Any, executor: Any = None) -> bool:
    """Whether the core forks parallel samples on this engine (``core_supported`` otherwise): continuous
    batching over the paged manager, without drafts or pipeline stages (``executor``, where known)."""
    return (type(scheduler) is ContinuousScheduler and type(manager) is KVCacheManager
            and scheduler.speculation is None and type(executor) is not PipelineExecutor)


def requests_supported(requests: list[Request], forks: bool = False) -> bool:
    """Whether every request is one the core takes: one sequence, or (``forks``: ``forks_in_core`` of every
    engine) several samples; beams never."""
    if forks:
        return all(r.beam_width == 1 for r in requests)
    return all(r.n == 1 and r.beam_width == 1 for r in requests)


@dataclass
class CoreRun:
    """What the engine loop reports besides its results: steps taken and the events it waited on; asked
    for (``run_core``), ``requests_frame``'s first columns (sim/core_requests.py)."""

    steps: int
    waits: int
    columns: dict[str, Any] | None = None
    free_blocks: int = 0   # at the end, cached ones included (all of them, unless a block leaked)


def admission(prompt: np.ndarray, out: np.ndarray, scheduler: ContinuousScheduler, width: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``add_request``'s decisions for requests of these prompt and output lengths (and samples, ``width``;
    None: one each), as arrays: (the output as served, which are cut, which are rejected); they depend on
    the request and the settings only."""
    mml = scheduler.max_model_len
    capped = served_outputs(prompt, out, mml)
    mgr = scheduler.manager
    budget = scheduler.batch_tokens   # (one batch's: pipeline stages run several, sim/executors/pipeline.py)
    need = blocks_needed(prompt, capped, mgr, width)
    bad = (prompt >= mml) | (need > mgr.num_blocks) | (scheduler.max_num_batched_tokens < 1)
    if width is not None:
        bad |= width > budget   # a decode step of every sample at once
    if not scheduler.config.chunked_prefill:
        bad |= prompt > budget
    return capped, capped != out, bad


def served_outputs(prompt: np.ndarray, out: np.ndarray, max_model_len: int) -> np.ndarray:
    """Each request's output as served (``SchedulerBase.served_output_len``): generation stops at the context
    limit."""
    return np.where((prompt + out > max_model_len) & (prompt < max_model_len), max_model_len - prompt, out)


def blocks_needed(prompt: np.ndarray, capped: np.ndarray, mgr: Any, width: np.ndarray | None = None) -> np.ndarray:
    """The most blocks each request (prompt, output as served, samples) ever holds at once in ``mgr``
    (its ``can_ever_fit``): its tokens' blocks, a windowed cache's pages, samples' own blocks."""
    slots = mgr.region_tokens_of(prompt, capped) if type(mgr) is ContiguousKVManager else prompt + capped - 1
    need = -(-slots // mgr.block_size)
    if type(mgr) is WindowedKVCacheManager:   # and its window's pages (WindowedKVCacheManager.can_ever_fit)
        need = need + mgr.sliding_groups * mgr.window_blocks_max(slots)
    elif type(mgr) is SlidingKVCacheManager:   # its window's blocks alone (SlidingKVCacheManager.can_ever_fit)
        need = mgr.window_blocks_max(slots)
    if width is not None:   # n samples share the prompt's full blocks (KVCacheManager.can_ever_fit)
        need = need + (width - 1) * (need - prompt // mgr.block_size)
    return need


def request_lengths(requests: list[Request]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, output lengths) of ``requests``, int64 arrays."""
    n = len(requests)
    return (np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=n),
            np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n))


def prepare(requests: list[Request], scheduler: ContinuousScheduler, samples: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``add_request``'s output cap to every request and return (which would be queued (1) or
    rejected (0) when handed over, which were cut; ``samples``: each request's n, None: one each): both
    depend on the request and the settings only,
    and the cut are counted by the scheduler they are handed to (``run_engines``). Each rejected
    request gets its reason now (its status and time when handed over)."""
    prompt, out = request_lengths(requests)
    capped, cut, bad = admission(prompt, out, scheduler, samples if samples is not None and (samples > 1).any() else None)
    for i in np.flatnonzero(cut).tolist():
        requests[i].output_len = int(capped[i])
    for i in np.flatnonzero(bad).tolist():
        reason = scheduler.reject_reason(requests[i])
        if not reason:
            raise AssertionError(f"engine core: request {requests[i].req_id} flagged as rejected without a reason")
        requests[i].reject_reason = reason
    return (~bad).astype(np.int64), cut


def _pricing(ex: CostModelExecutor) -> tuple:
    """The cost model as core.c reads it: (mode, integer constants, float constants, the padded batch of
    each token count under CUDA graphs, the GEMM and all-reduce times by token count and graph, the LM
    head's by sequences), in ``CostModelExecutor.execute``'s and ``_engine_fixed_terms``' terms."""
    p = ex.params
    head = (ex._attn_flops_per_pair, ex._attn_peak, ex._attn_bw, ex._attn_kv_s, p.kernel_latency_s)
    span = ex._local.span if ex._local_layers else 0
    local = (ex._local_layers, span, int(ex._local_layers > 0 and ex._local.chunked))   # (layers, span, chunked)
    e = ex.engine
    if e is not None:
        ints = (ex._layers, ex._attn_new_bytes, ex._graph_max, FUSED_ELEMENTWISE_KERNELS, ATTENTION_OPS_PER_LAYER,
                ex._eager_ops, ex._attn_dec_new_bytes, *local)   # (eager ops over all layers: a mixture's router and more)
        floats = (*head, ex._eng_half, ex._eng_kv_s, ex._eng_qo_s, e.sampler_s, e.step_gap_s,
                  1.0 if e.overlap_cpu else 0.0, ex._swap_s_per_block, ex._fused_s_per_token, e.graph_kernel_s,
                  p.elementwise_latency_s, e.cpu_step_s, e.cpu_seq_s, e.eager_op_s, ex._empty_step_s, ex._copy_s_per_block)
        return 1, ints, floats, np.array(ex._pad, dtype=np.int64), ex._engine_linear, ex._lm_head

    def linear(tokens: int, _graph: bool) -> tuple[float, float]:
        return ex._linear(tokens)

    floats = (*head, ex._attn_seq, ex._attn_pre_seq, ex._elem_s_per_token, ex._elem_fixed, ex._overhead,
              ex._swap_s_per_block, ex._attn_dec_flops_per_pair, ex._attn_dec_kv_s, ex._copy_s_per_block)
    return 0, (ex._layers, ex._attn_new_bytes, 0, 0, 0, 0, ex._attn_dec_new_bytes, *local), floats, None, linear, \
        ex._lm_head


@dataclass
class EngineParts:
    """What the core runs one engine with: its scheduler, executor and recorder, and its loop's settings."""

    scheduler: ContinuousScheduler
    executor: CostModelExecutor
    recorder: Recorder
    async_scheduling: bool
    max_stall: int
    check_integrity: bool = False


def run_core(requests: list[Request], scheduler: ContinuousScheduler, executor: CostModelExecutor,
             recorder: Recorder, *, arrival_delay_s: float, async_scheduling: bool, max_stall: int,
             progress: Callable[[int], None] | None = None, check_integrity: bool = False,
             columns: bool = False, client: tuple | None = None) -> CoreRun:
    """Run the engine over ``requests`` (handed over at arrival + ``arrival_delay_s``, or sent by ``client``,
    sim/clients.py ``core_client``, and handed over ``arrival_delay_s`` after); ``progress`` is
    called every ``PROGRESS_EVERY`` steps with the requests finished or rejected so far;
    ``check_integrity`` checks the KV and scheduler invariants after every step (an AssertionError);
    ``columns``: the requests' results come back as the table's columns (``CoreRun.columns``), and the
    Requests get only their status."""
    parts = EngineParts(scheduler, executor, recorder, async_scheduling, max_stall, check_integrity)
    return run_engines(requests, [parts], arrival_delay_s, dest=[0] * len(requests), progress=progress,
                       columns=columns, client=client)[0][0]


def _admission_key(s: ContinuousScheduler) -> tuple:
    """The settings ``add_request`` decides by (``admission``): context and token limits, chunking, the cache."""
    m = s.manager
    return s.max_model_len, s.batch_tokens, s.max_num_batched_tokens, s.config.chunked_prefill, m.num_blocks


def same_admission(schedulers: list[ContinuousScheduler], requests: list[Request] | None = None) -> bool:
    """Whether the core can admit requests as each of these engines does: engines that cap and reject alike
    (the replicas of one pool); or, given ``requests``, any engines of one block size (a mixed fleet's groups:
    each engine then caps outputs and rejects requests by its own settings, ``own_admissions``)."""
    if len({_admission_key(s) + (s.manager.block_size,) for s in schedulers}) == 1:
        return True
    return requests is not None and len({s.manager.block_size for s in schedulers}) == 1


class OwnAdmission(NamedTuple):
    """One engine's ``admission`` of every request: outputs as it serves them, which it cuts, which it queues."""

    capped: np.ndarray
    cut: np.ndarray
    accepted: np.ndarray


def own_admissions(requests: list[Request], schedulers: list[ContinuousScheduler],
                   samples: np.ndarray) -> list[OwnAdmission] | None:
    """Each engine's admission of ``requests`` where the engines' settings differ so that some request is
    capped or rejected differently (a mixed fleet's groups); None where every engine admits alike. Read
    from the requests' own outputs, before ``prepare`` caps them."""
    if len({_admission_key(s) for s in schedulers}) == 1:
        return None
    prompt, out = request_lengths(requests)
    width = samples if (samples > 1).any() else None
    by_key: dict[tuple, OwnAdmission] = {}
    for s in schedulers:
        if _admission_key(s) not in by_key:
            capped, cut, bad = admission(prompt, out, s, width)
            by_key[_admission_key(s)] = OwnAdmission(capped, cut, (~bad).astype(np.int64))
    first = next(iter(by_key.values()))
    if all(np.array_equal(a.capped, first.capped) and np.array_equal(a.accepted, first.accepted)
           for a in by_key.values()):
        return None
    return [by_key[_admission_key(s)] for s in schedulers]


def run_engines(requests: list[Request], engines: list[EngineParts], lag: float, *, dest: list[int] | None = None,
                choose: Callable[[Request, list[ReplicaState]], int] | None = None,
                rule: tuple[int, np.ndarray | None, int] | None = None,
                progress: Callable[[int], None] | None = None, columns: bool = False, client: tuple | None = None,
                attach: Callable[[list[ReplicaState]], None] | None = None, groups: tuple[np.ndarray, np.ndarray] | None = None
                ) -> tuple[list[CoreRun], np.ndarray]:
    """Several engines fed by one arrival process: ``requests`` in hand-over order, each at its arrival +
    ``lag`` (or, given ``client``, sim/clients.py ``core_client``: sent in this order by a client with a
    concurrency limit, each handed over ``lag`` after it is sent, its ``arrival_s`` becoming its send time),
    to the engine ``dest[g]`` (chosen ahead), by ``rule`` (a router's ``CoreRule.as_core_arg``,
    applied by the core from the engines' counts) or ``choose(request, states)`` (a router reading the
    engines' ``ReplicaState`` as of that moment). The engines must admit alike (``same_admission``).
    Returns each engine's run and the engine each request went to (``columns``: the first run carries the
    requests' columns, and the Requests get only their status); errors are raised as the SimPy loop raises
    them. ``attach``: called with the engines' ``ReplicaState`` views before the first choice (a router
    that reads them: ``Router.attach``). ``groups``: (spans, counts) where some engines are data-parallel groups
    (sim/cluster/data_parallel.py ``group_spans``: each group's first engine and ranks, int64, ascending),
    each group's ranks stepping in lockstep, the (groups, 6) float table ``counts`` filled with each group's
    steps, tokens, token slots, busy and waiting seconds and dummy passes."""
    if not same_admission([p.scheduler for p in engines], requests):
        raise ValueError("run_engines: the engines cap or reject requests differently")
    n, m = len(requests), len(engines)
    samples = np.fromiter((r.n for r in requests), dtype=np.int64, count=n)   # (no beams here: requests_supported)
    own = own_admissions(requests, [p.scheduler for p in engines], samples)
    accepted, cut = prepare(requests, engines[0].scheduler, samples)
    ints_out = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=n)   # (as engine 0 serves them)
    ints = request_ints(requests, ints_out, accepted, samples)
    arrival = np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n)
    where = np.full(n, -1, dtype=np.int64) if dest is None else np.array(dest, dtype=np.int64)
    state = np.zeros((m, STATE_COLS), dtype=np.int64)
    route = core_route(requests, [p.scheduler.manager for p in engines], state, dest, rule, choose, attach)
    counters = np.empty((6, n), dtype=np.int64)
    times = np.empty((5, n), dtype=np.float64)
    caching = any(getattr(p.scheduler.manager, "prefix_cache", None) is not None for p in engines)
    hashes = _hashes_of(requests, engines[0].scheduler.manager.block_size) if caching else None
    drafts = draft_counts(n, [p.scheduler for p in engines])
    adapters = adapter_ids(requests) if any(p.scheduler.lora is not None for p in engines) else None
    specs = [_engine_spec(p, drafts, adapters) for p in engines]
    if own is not None:   # (each engine caps and rejects by its own settings)
        specs = [(*spec, (admit.capped, admit.accepted)) for spec, admit in zip(specs, own)]
    more = () if groups is None else (None, groups)   # (no prefill/decode pools here)
    results = native.run_core(n, ints, arrival, where, float(lag), route, state, progress, PROGRESS_EVERY,
                              counters, times, specs, hashes, client, *more)
    for err, _, _ in results:
        _raise(err)
    for e, (parts, spec) in enumerate(zip(engines, specs)):
        if spec[4] is not None:
            write_speculation(parts.scheduler.speculation, spec[4], requests, drafts, where == e)
        if spec[5] is not None:
            write_lora(parts.scheduler.adapters, spec[5][6])
    if client is not None:   # (the core wrote each request's send time over its arrival)
        for req, sent in zip(requests, arrival.tolist()):
            req.arrival_s = sent
    if own is not None:   # each request as its own engine served it (``prepare`` capped them as engine 0)
        served = ints_out.copy()
        for e, admit in enumerate(own):
            mine = where == e
            served[mine] = admit.capped[mine]
        ints[2] = served
        for g in np.flatnonzero(served != ints_out).tolist():
            requests[g].output_len = int(served[g])
    if len({_admission_key(p.scheduler) for p in engines}) > 1:   # a rejection's reason is its own engine's
        for g in np.flatnonzero((accepted == 0) | (times[4] == times[4])).tolist():   # (``prepare``: engine 0's)
            req = requests[g]
            req.reject_reason = engines[where[g]].scheduler.reject_reason(req) if times[4, g] == times[4, g] else None
    # (after the refusals' reasons: a request engine 0 would refuse that its own engine took and then aborted
    # keeps its abort's reason)
    abort_reasons(requests, counters, [p.scheduler for p in engines], where)
    table = None
    if columns:   # (request_columns leaves each request's final status in counters[0])
        table = request_columns(requests, ints, arrival, counters, times)
        write_status(requests, counters[0])
    else:
        write_requests(requests, counters, times)
    runs = []
    for e, (parts, (_, records, totals)) in enumerate(zip(engines, results)):
        mine = where == e
        parts.scheduler.num_truncated += int(np.count_nonzero((cut if own is None else own[e].cut) & mine))
        write_engine(parts.scheduler, [requests[g] for g in np.flatnonzero(mine).tolist()], records, totals)
        runs.append(CoreRun(steps=totals[5], waits=totals[6], free_blocks=totals[17]))
    runs[0].columns = table
    return runs, where


def request_ints(requests: list[Request], output: np.ndarray, accepted: np.ndarray,
                 samples: np.ndarray | None = None) -> np.ndarray:
    """core.c's per-request integers: req_id, prompt, output (as the engines serve it), whether it is queued
    (1) or rejected (0) when handed over, priority, shared-prefix length (0 outside a group), samples (n;
    ``samples``, None: one each)."""
    n = len(requests)
    ints = np.empty((7, n), dtype=np.int64)
    ints[0] = np.fromiter((r.req_id for r in requests), dtype=np.int64, count=n)
    ints[1] = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=n)
    ints[2] = output
    ints[3] = accepted
    ints[4] = np.fromiter((r.priority for r in requests), dtype=np.int64, count=n)
    ints[5] = np.fromiter((r.prefix_len if r.prefix_group >= 0 else 0 for r in requests), dtype=np.int64, count=n)
    ints[6] = 1 if samples is None else samples
    return ints


def core_route(requests: list[Request], managers: list[Any], state: np.ndarray, dest: list[int] | None,
               rule: tuple | None, choose: Callable | None, attach: Callable | None = None
               ) -> tuple | Callable[[int], int] | None:
    """core.c's ``route`` for the engines of ``managers`` (the first rows of ``state``): None where ``dest``
    chose ahead, the router's rule (``CoreRule.as_core_arg``), else a call of ``choose`` with their
    ``ReplicaState`` views (given first to ``attach``, where there is one)."""
    if dest is not None:
        return None
    if rule is not None:
        if rule[1] is not None and len(rule[1]) != len(requests):
            raise ValueError("run_engines: the router's pairs are not one a request")
        return rule
    if choose is None:
        raise ValueError("run_engines: give dest or choose")
    views = [ReplicaState(state, e, mgr.num_blocks, mgr.block_size, getattr(mgr, "prefix_cache", None) is not None)
             for e, mgr in enumerate(managers)]
    if attach is not None:
        attach(views)

    def route(g: int) -> int:
        return choose(requests[g], views)
    return route


def draft_counts(n: int, schedulers: list[Any]) -> np.ndarray | None:
    """Each request's drafts verified and accepted (2 x n, the core counts into it), where an engine speculates."""
    return np.zeros((2, n), dtype=np.int64) if any(s.speculation is not None for s in schedulers) else None


STATE_COLS = 7   # core.c's STATE_COLS: ReplicaState's row


class CoreClock:
    """The core's clock as a router reads an engine's (``replica.engine.env.now``: ``dp_balance``), from the
    bits core.c writes into the first row of ``state`` before each choice."""

    def __init__(self, state: np.ndarray) -> None:
        self._bits = state[0, 5:6]
        self.env = self

    @property
    def now(self) -> float:
        return float(self._bits.view(np.float64)[0])


class ReplicaState:
    """What a router reads of an engine in the core (sim/cluster/replica.py Replica's ``load``,
    ``submitted``, ``running``, ``kv_usage``, ``block_size``, its prefix cache's hits for the request being
    routed, the clock as ``engine.env.now``), as of the arrival being routed: core.c writes ``state`` (per
    engine: handed over, finished or rejected, blocks in use, routed there with their KV on its way, running,
    the leading blocks of that request's prompt its cache holds; the clock) before each choice."""

    def __init__(self, state: np.ndarray, index: int, num_blocks: int, block_size: int, cache: bool = False) -> None:
        self._row = state[index]
        self._num_blocks = num_blocks
        self._cache = cache
        self.block_size = block_size
        self.engine = CoreClock(state)

    @property
    def submitted(self) -> int:
        return int(self._row[0])

    def load(self) -> int:
        """Requests handed over (or routed here, their KV on its way) and not yet finished or rejected."""
        return int(self._row[0] + self._row[3] - self._row[1])

    def running(self) -> int:
        """Requests in its running batch (the rest of ``load`` waits)."""
        return int(self._row[4])

    def kv_usage(self) -> float:
        return int(self._row[2]) / self._num_blocks

    def has_prefix_cache(self) -> bool:
        return self._cache

    def cached_prefix_blocks(self, req: Request, hashes: list[int]) -> int:
        """(the request being routed: core.c counted them from its own hashes, the same as ``hashes``)"""
        return int(self._row[6])

    # (a router that reads adapter slots is applied by its core rule, never through views; views of engines
    # serving adapters are read only by routers that do not: dp_balance, a data-parallel fleet's)
    def serves_adapters(self) -> bool:
        return False

    def adapter_residency(self, lora_id: int) -> int:
        return 0


CONTENT_MEMO = 4096   # distinct prompt contents whose block hashes are kept (repeated prompts: hashed once)


def _hashes_of(requests: list[Request], block_size: int) -> Callable[[int, int], np.ndarray]:
    """core.c's ``hashes_of(g, full)``: the chained hashes (sim/workload/tokens.py) of request g's first
    full blocks up to the first that holds a token of its own (``shareable_blocks``), at most ``full``. The
    core gives a block past them a value of the request and the block alone: only equal hashes matter, and
    such a block equals no other request's."""
    by_content: dict[tuple, np.ndarray] = {}   # (the blocks before a request's own tokens are its content's)

    def hashes_of(g: int, full: int) -> np.ndarray:
        req = requests[g]
        k = min(full, shareable_blocks(req, block_size))
        if k <= 0:
            return NO_BLOCKS
        ids = req.hash_ids
        key = (req.prefix_group, req.prefix_len if req.prefix_group >= 0 else 0,
               ids if ids is None or type(ids) is tuple else tuple(ids), req.hash_block_tokens, req.sample_of, req.lora_id,
               k)
        hit = by_content.get(key)
        if hit is None:
            if len(by_content) >= CONTENT_MEMO:
                by_content.clear()
            hit = by_content[key] = block_hash_array(req, k, block_size)
        return hit
    return hashes_of


def _speculation(scheduler: Any, executor: CostModelExecutor, drafts: np.ndarray | None) -> tuple | None:
    """core.c's tuple for an engine's speculative decoding (sim/speculative.py; None: none): k, the survival of
    each draft position, the draws' generator state (its 624 words and position, written back at the end), the
    totals (verifications, drafted, accepted), the world's per-request counts ``drafts`` and the drafter's
    pricing (None: prompt lookup; else ``decode_work_s``' mode, integers, constants and ``Drafter.size_terms``)."""
    spec = scheduler.speculation
    if spec is None:
        return None
    _, words, _ = spec.stream.getstate()
    ex = executor.drafter.executor
    terms = executor.drafter.size_terms
    drafter = None
    if ex is not None and ex.engine is not None:
        drafter = (1, ex._layers, ex._attn_dec_new_bytes, (ex._eng_half, ex._eng_kv_s, ex._eng_qo_s), terms)
    elif ex is not None:   # (the drafter's passes are decodes: a decode's attention constants)
        drafter = (0, ex._layers, ex._attn_dec_new_bytes,
                   (ex._attn_dec_flops_per_pair, ex._attn_peak, ex._attn_dec_kv_s, ex._attn_bw,
                    ex.params.kernel_latency_s,
                    ex._attn_seq, ex._elem_s_per_token, ex._elem_fixed), terms)
    return (spec.k, tuple(spec._survival), np.array(words, dtype=np.int64), np.zeros(3, dtype=np.int64), drafts,
            drafter)


def write_speculation(spec: Any, args: tuple, requests: list[Request], drafts: np.ndarray, mine: np.ndarray) -> None:
    """An engine's draws back onto its Speculation, as the SimPy loop leaves it: the generator's state, the
    totals and each of its requests' drafts verified and accepted (``mine``: the requests it was handed)."""
    version, _, gauss = spec.stream.getstate()
    spec.stream.setstate((version, tuple(args[2].tolist()), gauss))
    verifications, drafted, accepted = args[3].tolist()
    spec.verifications += verifications
    spec.drafted += drafted
    spec.accepted += accepted
    by_request = spec.by_request
    for g in np.flatnonzero(mine & (drafts[0] > 0)).tolist():
        rid = requests[g].req_id
        counts = by_request.setdefault(rid, [0, 0])
        counts[0] += int(drafts[0, g])
        counts[1] += int(drafts[1, g])


def adapter_ids(requests: list[Request]) -> tuple[np.ndarray, int]:
    """Each request's LoRA adapter as core.c reads it (sim/csrc/core/lora.inc): dense ids 0..A-1 in the order of
    the adapters' own ids (-1: the base model), and A."""
    ids = np.fromiter((r.lora_id for r in requests), dtype=np.int64, count=len(requests))
    named = np.unique(ids[ids >= 0])
    return np.where(ids >= 0, np.searchsorted(named, ids), -1).astype(np.int64), len(named)


def _lora(scheduler: Any, executor: CostModelExecutor, adapters: tuple[np.ndarray, int] | None) -> tuple | None:
    """core.c's tuple for an engine's LoRA serving (sim/lora.py; None: none): max_loras, host entries, a disk
    load's and a slot copy's seconds, each request's dense adapter id and how many (``adapter_ids``), the
    loads' totals (written by the core: GPU loads, disk loads, seconds), and the kernels' price."""
    lora = scheduler.lora
    if lora is None or adapters is None:
        return None
    cache = scheduler.adapters
    return (lora.max_loras, lora.host_slots, float(lora.load_latency_s), float(cache.copy_s), adapters[0],
            adapters[1], np.zeros(3, dtype=np.float64), executor._lora_kernels)


def write_lora(cache: Any, totals: np.ndarray) -> None:
    """An engine's adapter loads back onto its AdapterCache (its counters, as the SimPy loop leaves them; the
    slots' and host cache's final contents stay in the core)."""
    gpu_loads, disk_loads, load_s = totals.tolist()
    cache.gpu_loads += int(gpu_loads)
    cache.disk_loads += int(disk_loads)
    cache.load_s += load_s


def _engine_spec(parts: EngineParts, drafts: np.ndarray | None, adapters: tuple[np.ndarray, int] | None = None
                 ) -> tuple:
    """core.c's tuple for one engine: settings, the cost model (``_pricing``; a pipeline's: its last stage's), the
    rows' sink, the chunk size, its speculation (``_speculation``, counting into ``drafts``), its LoRA adapters'
    state (``_lora``) and its pipeline stages (``_pipeline``), each None where it has none."""
    scheduler, recorder = parts.scheduler, parts.recorder
    mgr = scheduler.manager
    cfg = scheduler.config
    static = type(scheduler) is StaticScheduler   # (its queue: priority order, else FCFS; it never preempts)
    contig = type(mgr) is ContiguousKVManager      # (its regions are never swapped: preemption recomputes)
    settings = (mgr.block_size, mgr.num_blocks, cfg.max_num_seqs, scheduler.max_num_batched_tokens,
                int(cfg.chunked_prefill), int(parts.async_scheduling), int(cfg.victim == "most_generated"),
                parts.max_stall, mgr.space.num_free if contig else mgr.pool.num_free, int(parts.check_integrity),
                int(cfg.preemption == "swap" and not static and not contig),
                0 if contig else mgr.swap.num_blocks - mgr.swap.num_used,
                int(cfg.policy == "priority"), int(cfg.policy == "round_robin" and not static), cfg.rr_quantum_steps,
                int(getattr(mgr, "prefix_cache", None) is not None), int(cfg.policy == "longest_prefix_first" and not static),
                getattr(scheduler.waiting, "window", 0), getattr(scheduler.waiting, "max_bypass", 0), int(static),
                CONTIGUOUS_MODES.get(getattr(mgr, "mode", ""), 0), getattr(mgr, "max_model_len", 0),
                mgr.host.capacity if getattr(mgr, "host", None) is not None else 0, *_window_settings(mgr),
                int(np.float64(scheduler.timeout_s or 0.0).view(np.int64)),   # (the timeout's bits: core.c reads
                # the same double)
                scheduler.batch_tokens, int(type(mgr) is SlidingKVCacheManager))   # (tables cut to the window)
    width, chunk = len(STEP_COLUMNS), Columns.CHUNK_ROWS
    speculation = _speculation(scheduler, parts.executor, drafts)
    lora = _lora(scheduler, parts.executor, adapters)
    pipeline = _pipeline(parts.executor)
    extra = "lora" if lora is not None else "pipeline" if pipeline is not None else "draft"
    breakdown_parts = BREAKDOWN_PARTS if speculation is None and lora is None and pipeline is None \
        else (*BREAKDOWN_PARTS, extra)

    def sink(main: memoryview, breakdown: memoryview, m: int) -> None:
        rows = np.frombuffer(main, dtype=np.float64).reshape(width, chunk)[:, :m]
        bd = np.frombuffer(breakdown, dtype=np.float64).reshape(len(breakdown_parts), chunk)[:, :m]
        recorder.record_columns(rows, dict(zip(breakdown_parts, bd)))

    pricing = _pricing(parts.executor if pipeline is None else parts.executor.stages[-1])
    return settings, pricing, sink, chunk, speculation, lora, pipeline


def _pipeline(executor: Any) -> tuple | None:
    """core.c's tuple for an engine's pipeline stages (sim/executors/pipeline.py; None: none): each stage kind's
    pricing (``_pricing``), the kind of each stage, the hop's latency and seconds a token, a microbatch's
    tokens and whether a chunk over them is cut."""
    if type(executor) is not PipelineExecutor:
        return None
    kinds = list({id(s): s for s in executor.stages}.values())   # (in order of first appearance)
    kind_of = {id(s): k for k, s in enumerate(kinds)}
    return ([_pricing(s) for s in kinds], tuple(kind_of[id(s)] for s in executor.stages), float(executor.hop_latency_s),
            float(executor.hop_s_per_token), int(executor.batch_tokens), bool(executor.chunked))


def _window_settings(mgr: Any) -> tuple[int, int, int]:
    """core.c's window of a manager: (pages a logical block, span, chunked); (0, span, chunked) where every layer
    is local and the tables themselves are cut (``SlidingKVCacheManager``); (0, 0, 0): none."""
    if type(mgr) is SlidingKVCacheManager:
        return 0, mgr.local.span, int(mgr.local.chunked)
    if type(mgr) is not WindowedKVCacheManager:
        return 0, 0, 0
    return mgr.sliding_groups, mgr.local.span, int(mgr.local.chunked)


def _raise(err: tuple) -> None:
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
    if kind == 4:   # (a data-parallel group's: sim/cluster/data_parallel.py LockstepGroup's messages)
        raise KvsimError("engine", f"deadlock at t={t:.3f}s on rank {step}: {waiting} waiting, {running} running, "
                         "nothing can be scheduled")
    if kind == 5:
        raise KvsimError("engine", f"no progress for {stall} steps at t={t:.3f}s in the data-parallel group ({waiting} "
                         f"waiting, {running} running): livelock")


def write_status(requests: list[Request], status: np.ndarray) -> None:
    """Only each request's final status (refusals included) onto the Requests: what the schedulers'
    finished and rejected lists are made from, where the requests' table comes from the core's columns."""
    names = [RequestStatus(s) for s in range(len(RequestStatus))]
    for req, st in zip(requests, status.tolist()):
        req.status = names[st]


def write_requests(requests: list[Request], counters: np.ndarray, times: np.ndarray, chunk: int = 1 << 16) -> None:
    """The core's per-request results onto the Requests, as the SimPy loop leaves them (``chunk`` requests at
    a time: the Python numbers of one chunk at once, not of the whole run)."""
    for lo in range(0, len(requests), chunk):
        _write_chunk(requests[lo:lo + chunk], counters[:, lo:lo + chunk], times[:, lo:lo + chunk])


def _write_chunk(requests: list[Request], counters: np.ndarray, times: np.ndarray) -> None:
    status = list(RequestStatus)
    rejected = RequestStatus.REJECTED
    for req, st, comp, gen, pre, int_zero, cached, sched_s, first, last, fin, rej in zip(
            requests, *counters.tolist(), *times.tolist()):
        # a time taken while SimPy's clock was still its initial int 0 is that int (a column of them only is
        # an int column)
        if rej == rej:   # handed over and rejected (not NaN)
            req.status = rejected
            req.finish_s = 0 if int_zero & 2 else rej
            continue
        req.status = status[st]
        req.num_computed_tokens = comp
        req.num_generated = gen
        req.num_preemptions = pre
        req.num_cached_tokens = cached
        req.first_scheduled_s = 0 if int_zero & 1 else sched_s
        req.first_token_s = first
        req.last_token_s = last
        req.finish_s = fin


def write_engine(scheduler: ContinuousScheduler, requests: list[Request], records: tuple, totals: tuple,
                 collect: bool = True) -> None:
    """One engine's results where the SimPy loop leaves them: its scheduler's timeline, gaps, counters and
    finished and rejected requests (``requests``: those handed to it, in order; ``collect`` False: the caller
    fills the two lists), its manager's sums and peaks."""
    tr_rid, tr_time, tr_phase, gap_d, gap_n, other = records
    tr = scheduler.transitions
    tr.req_id.frombytes(tr_rid)
    tr.time.frombytes(tr_time)
    tr.phase.frombytes(tr_phase)
    gaps = scheduler.gaps
    gaps.step_gaps.durations.frombytes(gap_d)
    gaps.step_gaps.counts.frombytes(gap_n)
    gaps.other_gaps.frombytes(other)
    (preemptions, peak_used, peak_logical, sum_used, sum_logical, _, _, swapped_blocks, evicted, query_tokens,
     hit_tokens, peak_prefix, peak_prefix_logical, host_stored, host_evicted, host_loaded, host_hit_tokens,
     _free_blocks) = totals
    scheduler.num_preemptions += preemptions
    scheduler.swapped_blocks += swapped_blocks
    mgr = scheduler.manager
    if type(mgr) not in (KVCacheManager, WindowedKVCacheManager, SlidingKVCacheManager):   # (a contiguous allocator keeps neither peaks
        # nor sums: its rows say all)
        if collect:
            _collect(scheduler, requests)
        return
    peaks = mgr.peaks
    for key, value in (("used", peak_used), ("logical", peak_logical), ("prefix", peak_prefix),
                       ("prefix_logical", peak_prefix_logical)):
        peaks[key] = max(peaks[key], value)
    mgr._sum_used += sum_used
    mgr._sum_logical += sum_logical
    if collect:
        _collect(scheduler, requests)
    cache = mgr.prefix_cache
    if cache is not None:
        cache.num_evicted += evicted
        cache.record_lookup(query_tokens, hit_tokens)
    host = mgr.host
    if host is not None:   # (its hashes stay in the core: the counters say what it did)
        host.stored += host_stored
        host.evicted += host_evicted
        host.loaded += host_loaded
        host.query_tokens += query_tokens
        host.hit_tokens += host_hit_tokens


def _collect(scheduler: Any, requests: list[Request]) -> None:
    """The scheduler's finished, rejected and aborted lists from the requests handed to it (in that order)."""
    finished, refused, aborted = scheduler.finished, scheduler.rejected, scheduler.aborted
    for req in requests:
        if req.status == RequestStatus.FINISHED:
            finished.append(req)
        elif req.status == RequestStatus.REJECTED:
            refused.append(req)
        elif req.status == RequestStatus.ABORTED:
            aborted.append(req)


# where a request was when its client gave up: counters[4]'s bits (core/types.h ABORT_*); none of them: queued
ABORT_PLACES = ((4, "running"), (8, "swapped"), (16, "loading"), (32, "waiting for a decode seat"), (64, "in transfer"))
ABORT_HANDOFF = 32 | 64   # the two places between prefill and decode pools (no engine had the request then)


def abort_reasons(requests: list[Request], counters: np.ndarray, schedulers: list[Any], where: np.ndarray) -> None:
    """Each request the core aborted (its client's timeout) gets the SimPy loop's reason: where it was (bits 2
    to 6 of ``counters[4]``, ``ABORT_PLACES``: running, swapped out, loading from the host tier, or between
    prefill and decode pools waiting for a decode seat or in transfer; none: queued) and the tokens it had
    sent (``counters[2]``); ``where``: the engine whose scheduler's timeout it was."""
    for g in np.flatnonzero(counters[0] == int(RequestStatus.ABORTED)).tolist():
        limit = schedulers[where[g]].timeout_s
        bits = int(counters[4, g])
        state = next((place for bit, place in ABORT_PLACES if bits & bit), "queued")
        requests[g].reject_reason = timeout_reason(limit, state, int(counters[2, g]))
