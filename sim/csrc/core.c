/* The compiled engine core (sim/engine_core.py decides when it runs): an engine's whole run, or a
colocated cluster's, arrivals, scheduling, paged KV accounting, pricing and recording, over typed arrays
instead of Python objects.

It computes what sim/engine.py's SimPy loop computes (and sim/cluster/runner.py's, for several engines
behind one arrival process) with a ContinuousScheduler (FCFS, round-robin or priority; preemption by
recompute or by swap) or a StaticScheduler (FCFS or priority, no prefix cache: schedule_static), a
KVCacheManager with or without prefix caching, a WindowedKVCacheManager (window pages beside each table:
allocate_windowed), a SlidingKVCacheManager (every layer local: tables cut to the window, allocate_sliding)
or a ContiguousKVManager (allocate_region over extents.c),
with parallel samples (forked sequences: sharing.py's groups, below) but no beams, with or without client
timeouts (workload.timeout_s: ContinuousScheduler._expire, core/schedule.inc `expire`), and the cost model,
with or without speculative decoding (speculate.c's draws), with or without LoRA adapters (core/lora.inc),
with or without pipeline stages (sim/executors/pipeline.py: price_pipeline),
stepping one step per event as the plain loop does (no decode runs: a step here costs about a
microsecond):

  - the processes, the arrival process and each engine loop, ordered as SimPy orders their events: by
    time, then priority (a process's start is urgent), then the order in which they were scheduled; with a
    client that keeps at most N requests in flight (sim/clients.py), its sender in the arrival process's
    place and its hand-overs and slot releases, many pending at once, in client.h's heap;
  - the scheduler's step (sim/sched/continuous.py schedule, _rotate, _admit, _preempt, _swap_in; base.py
    update, _finish), the manager's block, slot and swap counters (sim/kv/manager.py, sharing.py: without
    a prefix cache only counts matter, so a table is its length; with one, blocks by identity, kvpool.c,
    and the prefix cache's hits, inserts and evictions), the recorder's row (sim/metrics.py
    record_step), the timeline's state changes and the inter-token gaps (sim/sched/records.py), the
    watchdog (sim/engine.py);
  - the cost model's step (sim/executors/cost_model.py execute, _engine_fixed_terms): the same float
    operations in the same order (local-attention layers over what their queries see: first_visible); the GEMM, all-reduce and LM-head times come from the executor itself
    (a Python call for the first step of each size, then a table lookup); a speculating engine's drafts
    (sim/sched/continuous.py's decodes with drafts, base.py update's acceptance and trim), its verifying
    decodes' prices and its drafter's passes (sim/executors/drafter.py, decode_work_s);
  - a router that reads the replicas (sim/cluster/routers.py) is called at each arrival, or, for the
    routers with a rule (RULE_*: ``Router.core_rule``), its choice is made here from the
    same counts.

  - disaggregated prefill/decode (sim/cluster/disagg.py, link.py; Disagg, handoff.h): the prefill pool's
    deferred frees, pulled KV's bookings, the transfers' processes and the link, the decode pool's queue
    ahead, client timeouts between the pools (a request given up while it waits for decode blocks or
    crosses the link; the decode engines' deadlines by time: deadlines.inc), in SimPy's event order.

Rows go to the caller a chunk at a time (``sink``); everything else comes back at the end.

The code lives in sim/csrc/core/, one concept a file, included below in the order they build on each other
(one translation unit, as the single file it was: every function stays static and the compiler inlines
across the parts). types.h holds the types and the few forward declarations; each .inc file starts by
saying what it holds. */
#include "native.h"

#include "client.h"
#include "extents.h"
#include "handoff.h"
#include "hostlru.h"
#include "kvpool.h"
#include "speculate.h"

#include <stdlib.h>
#include <string.h>

#include "core/types.h"
#include "core/counters.inc"
#include "core/prefix_cache.inc"
#include "core/regions.inc"
#include "core/window_pages.inc"
#include "core/sliding_only.inc"
#include "core/allocation.inc"
#include "core/forks.inc"
#include "core/release.inc"
#include "core/deadlines.inc"
#include "core/queues.inc"
#include "core/preemption.inc"
#include "core/lora.inc"
#include "core/admission.inc"
#include "core/schedule.inc"
#include "core/pricing.inc"
#include "core/update.inc"
#include "core/integrity.inc"
#include "core/routing.inc"
#include "core/disagg.inc"
#include "core/client.inc"
#include "core/loop.inc"
#include "core/lockstep.inc"
#include "core/engine_setup.inc"
#include "core/pool_setup.inc"
#include "core/module.inc"
