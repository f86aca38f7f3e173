"""run_scenario: build the parts a scenario names, run the engine, return the tables and the summary."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.clients import (
    ClientPool,
    add_client_waits,
    client_intervals,
    core_client,
    in_send_order,
    planned_arrivals,
)
from sim.engine import Engine
from sim.engine_core import core_supported, run_core
from sim.errors import KvsimError
from sim.executors.base import make_executor, step_model
from sim.executors.drafter import make_drafter
from sim.executors.local_attention import LocalAttention
from sim.gc_pause import gc_paused
from sim.kv import make_kv_manager
from sim.limits import MAX_BLOCKS
from sim.lora import AdapterCache, add_lora_column, draw_adapters, gpu_lora_bytes, lora_summary
from sim.metrics import (
    SUMMARY_STEP_COLUMNS,
    Recorder,
    fanout_summary,
    requests_frame,
    summarize,
    with_latencies,
)
from sim.progress_bar import ProgressBar
from sim.scenario import Scenario
from sim.sched import make_scheduler
from sim.sched.base import batched_tokens
from sim.sched.records import PHASE_NAMES, TokenGaps, Transitions, intervals_frame, transition_intervals
from sim.small_pages import small_pages
from sim.specs import GiB, group_kv_bytes_per_block, hbm_budget, kv_capacity_blocks
from sim.speculative import Speculation, add_request_columns, drafter_bytes
from sim.workload import Workload, build_workload
from sim.workload.build import sample_output_lengths
from sim.workload.fanout import add_sample_columns

# a run in the compiled core (one engine, or a colocated cluster) takes its per-request table from the core's
# arrays (sim/core_requests.py); False reads it back from the Requests as the SimPy loop's runs do (the
# reference its tests compare with)
CORE_REQUEST_COLUMNS = True


@dataclass
class Result:
    """What a run produced: ``summary`` (the public summary keys), per-request and per-step DataFrames."""

    scenario: Scenario
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame | None   # None from ``run_scenario(..., keep_steps=False)``
    workload_stats: dict
    timeline: pd.DataFrame | None = None  # state intervals (req_id, phase, start_s, end_s) for timeline.png
    profile: dict = field(default_factory=dict)  # wall seconds per phase (load, simulate, summarise) and counts


def gpu_blocks(scn: Scenario) -> int:
    """KV capacity in blocks: the explicit ``num_gpu_blocks`` or what fits in HBM after the weights."""
    kv = scn.kv_cache
    if kv.num_gpu_blocks is not None:
        return kv.num_gpu_blocks
    try:
        return kv_capacity_blocks(scn.model_spec, scn.hardware_spec, kv.block_size, kv.gpu_memory_utilization,
                                  _reserve_bytes(kv), *draft_bytes(scn), lora_bytes=lora_slot_bytes(scn),
                                  data_parallel=data_parallel_size(scn))
    except ValueError as e:
        raise KvsimError(f"{scn.source}: model", str(e)) from None


def hbm_budget_of(scn: Scenario, num_gpu: int) -> dict[str, int] | None:
    """The HBM budget of the scenario's tensor-parallel group (sim.specs.hbm_budget) when its cache was sized
    from HBM; None when ``num_gpu_blocks`` was given (then HBM did not size it)."""
    kv = scn.kv_cache
    if kv.num_gpu_blocks is not None:
        return None
    return hbm_budget(scn.model_spec, scn.hardware_spec, kv.block_size, num_gpu, kv.gpu_memory_utilization,
                      _reserve_bytes(kv), *draft_bytes(scn), lora_bytes=lora_slot_bytes(scn),
                      data_parallel=data_parallel_size(scn))


def data_parallel_size(scn: Scenario) -> int:
    """The ranks of each of the scenario's data-parallel engines (``cluster.data_parallel``: its replicas, or
    ``data_parallel_size`` of them; a data-parallel prefill or decode pool's scenario: the pool's), else 1."""
    if scn._pool_ranks > 1:
        return scn._pool_ranks
    cl = scn.cluster
    return cl.ranks_per_engine if cl is not None else 1


def draft_bytes(scn: Scenario) -> tuple[int, int]:
    """(weights, KV bytes a block) of the scenario's speculative drafter over its tensor-parallel group; zeros
    without one (sim/speculative.py)."""
    if scn.speculative is None:
        return 0, 0
    return drafter_bytes(scn.speculative, scn.model_spec, scn.hardware_spec, scn.kv_cache.block_size)


def lora_slot_bytes(scn: Scenario) -> int:
    """Bytes of the scenario's LoRA adapter slots over its tensor-parallel group (0 without LoRA: sim/lora.py)."""
    if scn.lora is None:
        return 0
    return gpu_lora_bytes(scn.model_spec, scn.hardware_spec.tensor_parallel, scn.lora)


def assign_adapters(scn: Scenario, workload: Any) -> None:
    """Each request's LoRA adapter, drawn from the ``lora`` section's population (``adapters`` > 0; with 0 the
    inline requests name their own). Before any fan-out: a request's samples share its adapter."""
    if scn.lora is None or not scn.lora.adapters:
        return
    ids = draw_adapters(scn.lora, len(workload.requests), scn.seed).tolist()
    for req, a in zip(workload.requests, ids, strict=True):
        req.lora_id = a


def _reserve_bytes(kv) -> int | None:
    """``kv_cache.activation_reserve_gb`` in bytes (None: the default share, sim.specs.activation_reserve)."""
    return None if kv.activation_reserve_gb is None else int(kv.activation_reserve_gb * GiB)


def cpu_blocks(scn: Scenario) -> int:
    """Swap blocks: ``swap_space_gb`` is per GPU (as in vLLM), so a tensor-parallel group of t GPUs has
    t times the swap space; a block holds the K and V of all heads, split over the t GPUs (with more GPUs
    than KV heads, each holds a copy of one: sim.specs.group_kv_bytes_per_block)."""
    block_bytes = group_kv_bytes_per_block(scn.model_spec, scn.hardware_spec, scn.kv_cache.block_size)
    total = scn.kv_cache.swap_space_gb * GiB * scn.hardware_spec.gpus
    return int(total // block_bytes)


def host_blocks(scn: Scenario) -> int:
    """Blocks of the prefix cache's host tier: ``cpu_offload_gib`` is the whole tensor-parallel group's (as
    vLLM's ``--kv-offloading-size``), each block the group's K and V of its tokens."""
    gib = scn.kv_cache.cpu_offload_gib
    if not gib:
        return 0
    block_bytes = group_kv_bytes_per_block(scn.model_spec, scn.hardware_spec, scn.kv_cache.block_size)
    blocks = int(gib * GiB // block_bytes)
    if blocks > MAX_BLOCKS:
        raise KvsimError(f"{scn.source}: kv_cache.cpu_offload_gib", f"{blocks:,} host blocks exceed the limit of "
                         f"{MAX_BLOCKS:,}; use less host memory or a larger kv_cache.block_size")
    if blocks < 1:
        raise KvsimError(f"{scn.source}: kv_cache.cpu_offload_gib", f"{gib} GiB holds no block of "
                         f"{block_bytes:,} bytes; use at least {block_bytes / GiB:.3g} GiB, or 0 for none")
    return blocks


def check_block_counts(scn: Scenario, num_gpu: int, num_cpu: int) -> None:
    """Refuse block counts beyond ``MAX_BLOCKS`` (memory for per-block state grows with them)."""
    if num_gpu > MAX_BLOCKS:
        raise KvsimError(f"{scn.source}: kv_cache", f"{num_gpu:,} GPU blocks exceed the limit of {MAX_BLOCKS:,}; "
                         "set kv_cache.num_gpu_blocks or a larger kv_cache.block_size")
    if num_cpu > MAX_BLOCKS:
        raise KvsimError(f"{scn.source}: kv_cache.swap_space_gb", f"{num_cpu:,} CPU blocks exceed the limit of "
                         f"{MAX_BLOCKS:,}; use less swap space")


_FANOUT_HINT = ", or set scheduler.parallel_sampling: fanout (each sample a request of its own, as vLLM v1)"


def fan_out_samples(scn: Scenario, workload: Workload) -> None:
    """``scheduler.parallel_sampling: fanout``: each request of n samples becomes n requests (a client sends
    them together, under one slot: sim/clients.py)."""
    if scn.scheduler.parallel_sampling != "fanout":
        return
    workload.fan_out(sample_output_lengths(scn.workload, workload.requests, scn.base_dir, scn.seed))


def _check_sequences_supported(scn: Scenario, requests: list) -> None:
    """Parallel samples and beams fork block tables: only the paged allocator with continuous batching does,
    without speculative decoding (its drafts are one sequence's). (Fanned out, samples are requests.)"""
    paged = scn.model_spec.kv_pages() is not None or scn.model_spec.sliding_only()
    staged = scn.hardware_spec.pipeline_parallel > 1
    if (scn.scheduler.batching == "continuous" and scn.kv_cache.allocator == "paged" and scn.speculative is None
            and not paged and not staged):
        return
    wide = next((r for r in requests if r.n > 1 or getattr(r, "beam_width", 1) > 1), None)   # (after any fan-out)
    if wide is not None and staged:
        raise KvsimError(f"{scn.source}: workload", f"request {wide.req_id} has n={wide.n}, "
                         f"beam_width={getattr(wide, 'beam_width', 1)}: forked samples and beams copy blocks, "
                         "which pipeline stages do not price (hardware.pipeline_parallel)"
                         + _FANOUT_HINT * (getattr(wide, "beam_width", 1) == 1))
    if wide is not None and paged:
        raise KvsimError(f"{scn.source}: workload", f"request {wide.req_id} has n={wide.n}, "
                         f"beam_width={getattr(wide, 'beam_width', 1)}: forked samples and beams with "
                         f"{scn.model_spec.name}'s window pages (vLLM's hybrid KV cache manager) are not "
                         "modelled; set kv_cache.hybrid_manager: false"
                         + _FANOUT_HINT * (getattr(wide, "beam_width", 1) == 1))
    if wide is not None and scn.speculative is not None:
        raise KvsimError(f"{scn.source}: speculative", f"request {wide.req_id} has n={wide.n}, "
                         f"beam_width={getattr(wide, 'beam_width', 1)}: speculative decoding drafts for one "
                         "sequence a request; drop the speculative section or the parallel samples and beams"
                         + _FANOUT_HINT * (getattr(wide, "beam_width", 1) == 1))
    if wide is not None:
        mode = "static batching" if scn.scheduler.batching == "static" else f"the {scn.kv_cache.allocator} allocator"
        raise KvsimError(f"{scn.source}: workload", f"request {wide.req_id} has n={wide.n}, "
                         f"beam_width={getattr(wide, 'beam_width', 1)}: parallel samples and beams need "
                         f"kv_cache.allocator: paged and scheduler.batching: continuous, not {mode}"
                         + _FANOUT_HINT * (getattr(wide, "beam_width", 1) == 1))


def window_pages(scn: Scenario) -> tuple[LocalAttention, int, int] | None:
    """The window pages' settings of the scenario's manager (sim/kv/window_pages.py): what the local layers
    see, the pages a logical block takes, and the most tokens one step computes for a request (the prefill
    budget with chunked prefill, else its whole KV); a model whose every layer is local (``sliding_only``,
    sim/kv/sliding_only.py) takes no pages (0); None where the model keeps every token
    (``ModelSpec.kv_pages``)."""
    model = scn.model_spec
    pages = model.kv_pages()
    if pages is None and not model.sliding_only():
        return None
    sch = scn.scheduler
    step_tokens = batched_tokens(sch, model.max_model_len) if sch.chunked_prefill else model.max_model_len
    return model.local_attention, pages[1] if pages else 0, step_tokens


def build_parts(scn: Scenario, num_gpu: int, num_cpu: int, executor: Any = None, replica_id: int = 0):
    """(KV manager, scheduler, executor, recorder) of one engine of ``scn`` with these block counts (the
    single engine's, and each cluster replica's: ``replica_id``). ``executor``: one already built for the
    same scenario and block counts, shared (a pure pricer: see ``shared_executor``)."""
    model = scn.model_spec
    manager = make_kv_manager(scn.kv_cache, num_gpu, num_cpu, model.max_model_len, host_blocks(scn),
                              window_pages(scn))
    scheduler = make_scheduler(scn.scheduler, manager, model.max_model_len)
    stages = scn.hardware_spec.pipeline_parallel
    if stages > 1:   # a step stands for the batches in flight, one a stage (sim/executors/pipeline.py)
        scheduler.max_num_batched_tokens *= stages
    if scn.speculative is not None:   # (each engine draws its acceptances from a stream of its own)
        scheduler.enable_speculation(Speculation(scn.speculative, scn.seed, replica_id))
    scheduler.timeout_s = scn.workload.timeout_s   # (aborts at a step's start: the SimPy loop steps singly)
    if executor is None:
        try:
            executor = make_executor(scn.executor.kind, model=model, hardware=scn.hardware_spec,
                                     config=scn.executor, kv=scn.kv_cache, num_gpu_blocks=num_gpu,
                                     num_cpu_blocks=num_cpu, base_dir=scn.base_dir, scheduler=scn.scheduler)
        except KeyError as e:
            raise KvsimError(f"{scn.source}: executor.kind", e.args[0]) from None
        if scn.speculative is not None:
            executor.drafter = make_drafter(scn)
        if scn.lora is not None:   # (its kernels: the cost model, the only executor that takes a lora section)
            executor.enable_lora(scn.lora)
    if scn.lora is not None:   # (each engine its own adapters' slots)
        hw = scn.hardware_spec
        scheduler.enable_lora(scn.lora, AdapterCache(scn.lora, model, hw.tensor_parallel, hw.host_link_bandwidth))
    _price_loads(scheduler, executor)
    return manager, scheduler, executor, Recorder(num_gpu, manager.capacity_slots)


def _price_loads(scheduler: Any, executor: Any) -> None:
    """A host tier's loads take the executor's time for a block over the host link (a GPU executor has none:
    they take no time there)."""
    if getattr(scheduler.manager, "host", None) is not None:
        scheduler.load_s_per_block = getattr(executor, "swap_s_per_block", 0.0)


def shared_executor(executor: Any) -> Any:
    """``executor`` if the other engines of the same scenario may price with it too (None: each builds its
    own): a pure pricer (the cost model) has no state but memos of its own prices, so replicas sharing one
    price each step size once instead of once each; a GPU executor holds a KV cache of its own."""
    return executor if getattr(executor, "shareable", False) else None


def _integrity_default() -> bool:
    return os.environ.get("KVSIM_CHECK_INTEGRITY", "") not in ("", "0")


def run_scenario(scn: Scenario, check_integrity: bool | None = None, progress: bool = False,
                 progress_after_s: float = 0.0, step_stream: Any = None, keep_steps: bool = True) -> Result:
    """Run one scenario to completion. ``check_integrity`` (default: env KVSIM_CHECK_INTEGRITY) checks
    every KV invariant after every step. ``progress``: a progress bar on stderr, shown once the run has
    taken ``progress_after_s`` seconds of wall time (so short runs show none). ``step_stream``: a
    ``sim.step_stream.StepTableStream`` that writes the per-step table while the engine runs (one engine;
    a cluster's is left untouched: its table is written afterwards). ``keep_steps=False``: no per-step table
    (``Result.steps`` is None; the summary, read from the few columns it needs, is the same to the bit), for
    callers that read only the summary and the requests (capacity searches, sweeps)."""
    # (filling the large per-step tables is erratic on huge pages: sim/small_pages.py; the cyclic collector
    # finds next to nothing in a run: sim/gc_pause.py)
    with small_pages(), gc_paused(), located_errors(scn):
        if scn.cluster is not None:   # replicas behind a router (sim/cluster/)
            from sim.cluster.runner import run_cluster

            return run_cluster(scn, check_integrity=check_integrity, progress=progress,
                               progress_after_s=progress_after_s, keep_steps=keep_steps)
        return _run_engine(scn, check_integrity, progress, progress_after_s, step_stream, keep_steps)


@contextlib.contextmanager
def located_errors(scn: Scenario) -> Iterator[None]:
    """An error found while building or running ``scn`` that names one of its keys (``executor.device``, or
    ``FILE: kv_cache``) is raised again with the key's line in the file (``Scenario.key_error``; the file
    alone where a command-line flag set the key)."""
    try:
        yield
    except KvsimError as e:
        key = _scenario_key(e.where, scn.source)
        if key is None:
            raise
        raise scn.key_error(key, e.what, name_flag=False) from None   # (commands add the flags they varied)


def _scenario_key(where: str, source: str) -> str | None:
    """The scenario key that ``where`` names (a dotted path of a scenario section, or ``SOURCE: key``), else None."""
    prefixed = where.startswith(f"{source}: ")
    key = where[len(source) + 2:] if prefixed else where
    if not _KEY.fullmatch(key) or key.split(".")[0] not in Scenario.model_fields or not (prefixed or "." in key):
        return None
    return key


_KEY = re.compile(r"[a-z_]+(\.[a-z0-9_]+)*")


def _run_engine(scn: Scenario, check_integrity: bool | None, progress: bool, progress_after_s: float,
                step_stream: Any = None, keep_steps: bool = True) -> Result:
    """``run_scenario`` of a scenario without a ``cluster`` section."""
    t0 = time.perf_counter()
    model = scn.model_spec
    num_gpu = gpu_blocks(scn)
    if num_gpu < 1:
        raise KvsimError(f"{scn.source}: kv_cache", "no room for a single KV block")
    num_cpu = cpu_blocks(scn)
    check_block_counts(scn, num_gpu, num_cpu)
    workload = build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source)
    assign_adapters(scn, workload)
    fan_out_samples(scn, workload)
    _check_sequences_supported(scn, workload.requests)
    manager, scheduler, executor, recorder = build_parts(scn, num_gpu, num_cpu)
    block_bytes = group_kv_bytes_per_block(model, scn.hardware_spec, scn.kv_cache.block_size)
    check = _integrity_default() if check_integrity is None else check_integrity
    bar = ProgressBar(len(workload.requests), progress_after_s) if progress else None
    fe_in, fe_out, fe_token = scn.frontend.latencies()
    engine = None
    clients = scn.workload.max_concurrency   # a client that keeps at most this many in flight (sim/clients.py)
    planned = planned_arrivals(workload.requests) if clients else None   # (the client's sends replace them)
    in_core = core_supported(scheduler, manager, executor, workload.requests) and \
        (clients is None or in_send_order(workload.requests))
    if step_stream is not None:
        recorder.stream_to(step_stream, block_bytes)
    if in_core:   # compiled (sim/engine_core.py)
        t_load = time.perf_counter()
        try:
            ran = run_core(workload.requests, scheduler, executor, recorder, arrival_delay_s=fe_in,
                           async_scheduling=scn.scheduler.async_scheduling,
                           max_stall=scn.scheduler.max_steps_without_progress, progress=bar.at if bar else None,
                           check_integrity=check, columns=CORE_REQUEST_COLUMNS,
                           client=core_client(scn, workload.requests, fe_out, fe_token) if clients else None)
        finally:
            if bar:
                bar.close()
        runs, waits = 0, ran.waits
    else:
        engine = Engine(None if clients else workload.requests, scheduler, executor, recorder,
                        check_integrity=check, max_steps_without_progress=scn.scheduler.max_steps_without_progress,
                        async_scheduling=scn.scheduler.async_scheduling, arrival_delay_s=fe_in,
                        multi_step=scn.scheduler.multi_step and scn.workload.timeout_s is None and scn.lora is None,
                        on_step=bar.stepper(lambda s=scheduler: len(s.finished) + len(s.rejected) + len(s.aborted))
                        if bar else None)
        if clients:
            ClientPool.for_scenario(scn, [engine], engine.submit, workload.requests, fe_in).start()
        t_load = time.perf_counter()
        try:
            engine.run()
        finally:
            if bar:
                bar.close()
        runs, waits = engine.num_runs, engine.num_waits
    t_sim = time.perf_counter()
    recorder.finish_stream()
    if in_core and ran.columns is not None:   # (the same table, from the core's arrays)
        reqs = with_latencies(ran.columns, output_latency_s=fe_out, token_latency_s=fe_token)
    else:
        reqs = requests_frame(workload.requests, output_latency_s=fe_out, token_latency_s=fe_token)
    if planned is not None:
        add_client_waits(reqs, planned)
    if scheduler.speculation is not None:
        add_request_columns(reqs, [scheduler.speculation])
    if scn.lora is not None:
        add_lora_column(reqs, workload.requests)
    add_sample_columns(reqs, workload.origin)
    # what the summary needs of the engine's parts; then the parts go (the Request objects with them), so
    # that the per-step and timeline tables are built without the run's objects in memory
    hit_rate = manager.prefix_cache_hit_rate() if hasattr(manager, "prefix_cache_hit_rate") else 0.0
    sharing = manager.sharing_summary(block_bytes) if hasattr(manager, "sharing_summary") else {}
    capacity_slots = manager.capacity_slots
    counters = _Counters(scheduler.num_truncated, scheduler.num_preemptions, scheduler.swapped_blocks,
                         scheduler.gaps, scheduler.timeout_s)
    transitions = getattr(scheduler, "transitions", None)
    profile = {"steps": recorder.num_steps, "decode_runs": runs, "engine_waits": waits,
               "arrivals": len(workload.requests), "compiled_core": engine is None}
    stats = dict(workload.stats)
    pricing = step_model(executor)
    speculation = scheduler.speculation
    adapters = scheduler.adapters
    del workload, engine, scheduler, manager, executor, bar
    # the engine's SimPy processes refer back to it: a cycle. Everything the run made is still in the
    # youngest generation (the collector was paused, so nothing was promoted): collecting that one frees
    # the cycle without scanning the whole process (a full pass costs ~0.1 s with torch and pandas loaded)
    gc.collect(0)
    # the timeline first (its transient arrays are the largest), then the per-step table
    timeline = None if transitions is None else timeline_with_frontend(transitions, reqs, fe_in, planned)
    del transitions
    # the recorder hands its rows over (never held twice); without a table kept, only the summary's columns
    steps = recorder.steps_frame(release=True, names=None if keep_steps else SUMMARY_STEP_COLUMNS)
    if keep_steps:
        steps["kv_bytes_used"] = steps["kv_blocks_used"] * block_bytes
    summary = summarize(reqs, steps, counters, capacity_slots=capacity_slots,
                        wall_time_s=time.perf_counter() - t0, prefix_cache_hit_rate=hit_rate)
    summary["num_gpu_blocks"] = num_gpu
    budget = hbm_budget_of(scn, num_gpu)
    if budget is not None:
        summary["hbm_budget"] = budget
    summary.update(sharing)
    summary["step_model"] = pricing
    if speculation is not None:
        summary["speculative"] = speculation.summary()
    if adapters is not None:
        summary["lora"] = lora_summary([adapters])
    if "sample_of" in reqs:
        summary["fanout"] = fanout_summary(reqs)
    profile = {"load_s": t_load - t0, "simulate_s": t_sim - t_load, "summarise_s": time.perf_counter() - t_sim,
               **profile}
    return Result(scn, summary, reqs, steps if keep_steps else None, stats, timeline, profile)


@dataclass
class _Counters:
    """What ``summarize`` reads of a scheduler."""

    num_truncated: int
    num_preemptions: int
    swapped_blocks: int
    gaps: TokenGaps
    timeout_s: float | None = None   # workload.timeout_s (summarize then counts the aborted)


def timeline_with_frontend(transitions: Transitions, reqs: pd.DataFrame, fe_in: float,
                           planned: pd.Series | None = None) -> pd.DataFrame:
    """The timeline table of ``transitions``; with a frontend input latency ``fe_in`` > 0 each request
    also has a ``frontend`` interval (client send -> engine) from its arrival, merged in by request and
    start time (at equal times the frontend interval first); with a client (``planned``: the workload's
    arrivals) each request it held back a ``client`` interval (planned arrival -> send) before those."""
    rid, phase, start, end = transition_intervals(transitions)
    names = [*PHASE_NAMES, "frontend", "client"]
    if fe_in > 0:
        rid, phase, start, end = _leading(rid, phase, start, end, reqs["req_id"].to_numpy(), len(PHASE_NAMES),
                                          reqs["arrival_s"].to_numpy(dtype=float), None, fe_in)
    if planned is not None:
        ids, sent_from, sent = client_intervals(reqs, planned)
        rid, phase, start, end = _leading(rid, phase, start, end, ids, len(PHASE_NAMES) + 1, sent_from, sent)
    return intervals_frame(rid, phase, start, end, names)


def _leading(rid: np.ndarray, phase: np.ndarray, start: np.ndarray, end: np.ndarray, ids: np.ndarray, code: int,
             begin: np.ndarray, until: np.ndarray | None, length: float = 0.0) -> tuple:
    """The interval columns with a row of phase ``code`` first among each request ``ids[k]``'s rows (they are
    sorted by request, then start; the new row starts no later than the request's others), from ``begin[k]``
    to ``until[k]`` (None: ``begin[k] + length``): inserted where its request begins, one column at a time."""
    at = np.searchsorted(rid, ids, side="left")
    rid = np.insert(rid, at, ids)
    phase = np.insert(phase, at, np.int8(code))
    end = np.insert(end, at, begin + length if until is None else until)
    start = np.insert(start, at, begin)
    return rid, phase, start, end

