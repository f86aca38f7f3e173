/* The compiled engine core (sim/engine_core.py decides when it runs): an engine's whole run, or a
colocated cluster's, arrivals, scheduling, paged KV accounting, pricing and recording, over typed arrays
instead of Python objects.

It computes what sim/engine.py's SimPy loop computes (and sim/cluster/runner.py's, for several engines
behind one arrival process) with a ContinuousScheduler (FCFS, round-robin or priority; preemption by
recompute or by swap) or a StaticScheduler (FCFS or priority, no prefix cache: schedule_static), a
KVCacheManager with or without prefix caching, a WindowedKVCacheManager (window pages beside each table:
allocate_windowed) or a ContiguousKVManager (allocate_region over extents.c),
with parallel samples (forked sequences: sharing.py's groups, below) but no beams, and the cost model, with
or without speculative decoding (speculate.c's draws),
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
    ahead, in SimPy's event order.

Rows go to the caller a chunk at a time (``sink``); everything else comes back at the end. */
#include "native.h"

#include "client.h"
#include "extents.h"
#include "handoff.h"
#include "hostlru.h"
#include "kvpool.h"
#include "speculate.h"

#include <stdlib.h>
#include <string.h>

enum { ST_WAITING = 0, ST_RUNNING = 1, ST_PREEMPTED = 2, ST_SWAPPED = 3, ST_FINISHED = 4 };
enum { PH_WAITING = 0, PH_PREFILL = 1, PH_DECODE = 2, PH_PREEMPTED = 3, PH_SWAPPED = 4, PH_IDLE = 5, PH_DONE = 6,
       PH_HOST_LOAD = 7 };
enum { MAIN_COLS = 18, BD_COLS = 8 };
enum { CFG_SIZE = 26 };   /* an engine's settings (engine_core._engine_spec) */   /* (the 8th, the draft part, where speculating) */
enum { ERR_NONE = 0, ERR_DEADLOCK = 1, ERR_DURATION = 2, ERR_LIVELOCK = 3 };
enum { URGENT = 0, NORMAL = 1 };
enum { ROLE_COLOCATED = 0, ROLE_PREFILL = 1, ROLE_DECODE = 2 };
/* routers chosen here (sim/cluster/routers.py, Router.core_rule): least_requests; least_kv; power_of_two
over the pairs drawn ahead; prefix_affinity over a pool without prefix caches; session (each request
follows an earlier one, found ahead, or goes to the least loaded) */
enum { RULE_CALL = 0, RULE_LEAST_LOAD = 1, RULE_LEAST_KV = 2, RULE_PAIR = 3, RULE_AFFINITY = 4, RULE_FOLLOW = 5 };

static int fail(const char *what, int64_t a, int64_t b);
static inline double py_max(double a, double b) { return b > a ? b : a; }   /* Python's max(a, b) */

/* a growable array of fixed-size items */
typedef struct {
    char *p;
    size_t n, cap, item;
} Vec;

static int vec_push(Vec *v, const void *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        char *p = realloc(v->p, cap * v->item);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        v->p = p;
        v->cap = cap;
    }
    memcpy(v->p + v->n * v->item, x, v->item);
    v->n++;
    return 0;
}

/* size terms of a step (the executor's), by (tokens, seqs, has_prefill), open addressing */
typedef struct {
    int64_t *keys;
    double *vals;
    size_t cap, n;
    int width;
} Terms;

/* a pending event of one process */
typedef struct {
    double t;
    int prio;
    int64_t eid;
    int active;
    int at_int;   /* scheduled at SimPy's integer start time 0 with no delay (its time is the int 0) */
} Event;

typedef struct World World;

/* one engine: its requests (local positions 0..N-1), scheduler, KV counters, pricing and results */
typedef struct {
    World *w;
    Py_ssize_t N;         /* requests in the world (the per-request arrays are the world's, shared) */
    int64_t index;        /* this engine's position in the world */
    /* its pool (disaggregated prefill/decode: the requests' KV arrays are the pool's, their counters and
    times the world's) and which requests are its (``mine[g] == index``); it stops once ``done`` (no more
    requests will come: ``arrivals_over``) and it has no work; ``may_block``: blocks held outside its scheduler (transfers)
    may be why nothing can start, so it waits for a wake instead of failing */
    int role, arrivals_over, may_block;
    const int64_t *mine;
    PyObject *hash_fn;
    /* a decode engine: requests queued ahead of everything (their KV arrived into blocks they hold: FCFS
    or priority, before the ring or heap), those routed here waiting for their blocks (pull), those holding
    blocks here whose KV is on its way, those routed here not yet handed over */
    Fifo ahead, pullq;
    int64_t reserved, incoming;
    const int64_t *rid, *prompt, *output, *accepted, *prio;
    const double *arrival;
    int64_t bs, num_blocks, max_seqs, max_batched, max_stall;
    int chunked, staging, victim_generated, check, swap, priority, rr;   /* the priority, round-robin policies */
    /* static batching (sim/sched/static.py): a batch formed when none runs, each member's prompt + output
    reserved at once, its finished members idle with their blocks (``idle``, in finish order) until its last
    one finishes */
    int staticb;
    int64_t *idle;
    Py_ssize_t nidle;
    /* a contiguous allocator (sim/kv/contiguous.py; ``contig``: 1 max, 2 pow2, 3 oracle, 0 paged): one region
    of whole blocks a request, its size by the mode, reserved first fit at its first allocation over the free
    extents (``ext``: extents.c) and given back at its free; a region's table length is its size, ``rstart``
    its first block, ``beyond`` its slots past the request's final length */
    int contig;
    int64_t max_model_len, *rstart;
    Extents ext;
    /* longest-prefix-first over a prefix cache (sim/sched/queues.py LongestPrefixQueue): the first ``window``
    of the queue ranked by cached blocks; the front overtaken at most ``max_bypass`` times; the position
    the last peek chose */
    int lpf;
    int64_t lpf_window, lpf_max_bypass, bypassed;
    Py_ssize_t lpf_at;
    int64_t quantum, step_index;   /* round-robin: a turn's steps; schedule() calls so far */   /* swap: preemption by swap where the CPU space has room */
    /* requests */
    int64_t *comp, *gen, *tlen, *beyond, *furthest, *npre, *cpu_held;   /* cpu_held: CPU blocks while swapped */
    int64_t *turn;       /* round-robin: the step at which a request's turn began */
    int8_t *stat, *in_pre;
    int64_t *int_zero;   /* bit 0: first scheduled, bit 1: rejected, while the clock was SimPy's int 0 */
    double *fsched, *ftok, *ltok, *fin, *rej;
    int64_t *dst;         /* disaggregated: the decode engine each request was routed to (-1: none) */
    /* queues: running (in rank order), waiting (a ring: preempted requests go to its front), staged */
    int64_t *running, *order, *done, *wq, *staged, *swapped, *tmp;
    double *staged_t;
    Py_ssize_t ndone;     /* the last step's finished, first ``ndone`` of ``done`` in finish order */
    Py_ssize_t nrun, wq_head, wq_len, nstaged, nswapped;
    /* the plan being made: entries (request, new tokens, context) and its counters */
    int64_t *e_idx, *e_new, *e_ctx, *e_draft;   /* e_draft: of the new tokens, drafts to verify */
    Py_ssize_t ne;
    int64_t st_prefill, st_decode, st_preempted, st_swap_out, st_swap_in;   /* swap: blocks copied this step */
    /* KV counters (sim/kv/manager.py) */
    int64_t free_blocks, held, beyond_final, logical, peak_used, peak_logical, sum_used, sum_logical;
    int64_t n_prefilling, num_preemptions, finished, rejected, submitted, swapped_blocks;
    /* parallel samples (sim/kv/sharing.py SeqGroup; as counts without a prefix cache, by identity with one):
    each request's samples (``nseq``: n; NULL where every request has one). Forked after its first token, a request's
    sequences hold tables of one length (tlen), all sharing its first ``gcom`` blocks, each owning the
    rest (``gk``: its sequences, 0 before the fork); ``gpriv``: each one's last block is its own; ``gsib``:
    tokens each sibling recomputes at its next step (after a re-fork); ``st_copy``: copies this step */
    const int64_t *nseq;
    int64_t *gk, *gcom, *gsib;
    int64_t **gtbl;          /* with a prefix cache, blocks by identity: the n - 1 siblings' tables, one after another */
    int8_t *gpriv, *e_sib;   /* e_sib: an entry of a sibling sequence (its request's entry is just before) */
    int64_t st_copy;
    /* the plan's entries: room for one a running request (e_base) and one more a forked request's sibling
    (sib_total: grow_entries at each fork) */
    Py_ssize_t e_cap, e_base;
    int64_t sib_total;
    double copy_s_per_block;
    int64_t num_swapped;   /* requests swapped out: in ``swapped``, or (round-robin) queued in ``wq`` */
    int64_t cpu_blocks, cpu_free;
    /* results */
    Vec tr_rid, tr_time, tr_phase, gap_d, gap_n, other;
    /* shared-prefix regions (SharingMixin._prefix_refs): blocks of each request's first prefix_len // bs
    (plen) in its table; distinct blocks and the sum of table entries, and their peaks */
    const int64_t *plen_tok;
    int64_t prefix_distinct, prefix_logical, peak_prefix, peak_prefix_logical;
    /* a prefix cache (kv_cache.prefix_caching): blocks by identity in ``pool``; each request's table, the
    blocks of it offered to the cache (upto), whether its first lookup was counted, the tokens it found
    cached then (ncached), the hashes of its full blocks (hashes_of) */
    int cache;
    KvPool pool;
    int64_t *pref;        /* per block: holders among shared-prefix regions */
    int64_t **tbl, **own, *upto, *memo, *memo_at, *ncached, *hs;
    int8_t *looked;
    Py_buffer *hbuf;
    int64_t query_tokens, hit_tokens;
    /* vLLM's hybrid KV cache manager (sim/kv/window_pages.py; ``wg`` 0: none): besides its table, each request
    holds ``wg`` pages a logical block for the blocks its next query sees on the local layers (a window of
    ``wspan`` tokens, or chunks of it: ``wchunked``): ``whave[i]`` logical blocks from ``wfirst[i]``, their
    pages by identity with a prefix cache (``wpg[i][k * wg + g]``: logical block k, group g), else counts;
    ``npages`` distinct pages held in all. ``stale``: the requests whose last step left pages behind the
    window, in the order marked (``wstale[i]``: its position + 1, 0 where not listed), freed as the next step
    is planned. With a prefix cache a full block's pages are cached with it (under ``page_hash``; ``wupto[i]``:
    the logical blocks whose pages were offered) and a hit shares them (``window_hit``) */
    int64_t wg, wspan, npages;
    int wchunked;
    int64_t *wfirst, *whave, *wstale, *wupto, **wpg;
    int64_t *stale;
    Py_ssize_t nstale, stale_cap;
    /* the cache's host tier (kv_cache.cpu_offload_gib; ``host.cap`` 0: none): hashes of blocks copied to host
    memory (hostlru.h), the tokens its loads served at first admissions, the blocks loaded in all and in the
    step being planned */
    HostLru host;
    int64_t host_hit_tokens, host_loaded;
    /* requests waiting for their loads (ContinuousScheduler.loading): a ring of N, in load order, each with
    the time its load ends; the host link's next free time */
    int64_t *ld_idx;
    double *ld_ready, link_free;
    Py_ssize_t ld_head, ld_len;
    int64_t *hw;          /* back from their loads, queued, holding their blocks (in load order) */
    Py_ssize_t nhw;
    double *main, *bd;
    Py_ssize_t fill, chunk;
    int64_t steps, waits;
    PyObject *sink, *linear_fn, *head_fn;
    /* pricing: the cost model's constants; GEMM and all-reduce times by token count (and graph), the LM
    head's by sequences, asked of the executor once each */
    int engine;
    double c[24];
    double swap_s_per_block;
    int64_t layers, new_bytes, graph_max, n_fused, attn_ops, eager_ops, dec_new_bytes;   /* (new_bytes: a prefill's) */
    int64_t *pad;         /* CUDA graphs: a batch of n tokens runs the graph captured for pad[n] (n <= graph_max) */
    /* local attention (sim/executors/local_attention.py; ``loc_layers`` 0: none): the layers that see only a
    sliding window of ``loc_span`` tokens, or the chunk of ``loc_span`` their query is in (``loc_chunked``) */
    int64_t loc_layers, loc_span;
    int loc_chunked;
    Terms lin, head;
    int bd_cols;          /* the breakdown's columns: BD_COLS with a draft part, else one fewer */
    /* the engine loop */
    Event ev_e;
    int busy, e_wakes;    /* e_wakes: the engine waits for an arrival (an untriggered wake) */
    int e_state;          /* 0: start, 1: after a wake, 2: after a step */
    Event ev_l;           /* Engine._load_ended: the timeout set for the first load's end (one at a time) */
    double start, end, d, bdv[BD_COLS];
    int64_t stall;
    /* an error: its kind and what its message says */
    int err;
    double err_t, err_d;
    int64_t err_step, err_waiting, err_running, err_stall;
    /* speculative decoding (sim/speculative.py; ``spec.k`` 0: none): the draws and counts; each request's drafts
    verified and accepted (``sp_counts``: two rows of the world's requests, shared by the engines); the
    drafter's pricing (sim/executors/drafter.py; ``dr_mode`` -1: no GPU work, else the cost model's mode, 1
    engine) from its constants and its size terms by sequences (``dr_terms_fn``'s, once each) */
    Speculate spec;
    int64_t *sp_drafted, *sp_accepted;
    Py_buffer sp_state, sp_totals, sp_counts;
    int sp_held;          /* the three buffers are held */
    int dr_mode;
    int64_t dr_layers, dr_new_bytes;
    double dr_c[8];
    PyObject *dr_terms_fn;
    Terms dr_terms;
} Core;

static void unhold(Core *c, int64_t r);
static int client_answered(World *w, int64_t r, double at);
static int prefill_stopped(World *w);
static int prefill_finished(Core *P, int64_t g);
static int reserve(World *w, Core *D);

/* the clock, the arrival process (one for every engine: request g goes to engine dest[g], where it is
request local[g]) and the engines, in the order their loops were started */
struct World {
    Py_ssize_t N, M;
    double *arrival;      /* with a client, each request's send time once sent (ClientPool: arrival_s) */
    Client *client;       /* NULL, or a client with a concurrency limit sends the requests (the arrival
                             process's event is then its sender's; its timeouts wait in client.h's heap) */
    int64_t *dest;        /* each request's engine: given (chosen ahead), or chosen at hand-over by ``route`` */
    PyObject *route;      /* None, or route(g) -> engine, reading ``state`` (a router that reads replicas) */
    PyObject *hash_fn;    /* None, or hashes_of(g, full blocks) -> int64 hashes of request g's shareable blocks */
    int rule;             /* RULE_CALL (``route`` is called), or the router's rule, applied here */
    const int64_t *pairs; /* RULE_PAIR: request g's two candidates, pairs[2g] < pairs[2g + 1];
                             RULE_FOLLOW: the earlier request g goes where it went (pairs[g] < g), or -1 */
    int64_t slack;        /* RULE_AFFINITY: the load slack */
    const int64_t *prompt;   /* each request's prompt length (RULE_AFFINITY) */
    int64_t *state;       /* per engine: requests handed over, finished or rejected, blocks in use */
    double lag, now;
    int int_clock;        /* the clock is still SimPy's initial int 0 (no event with a float time yet) */
    int arrivals_done;
    Event ev_a;
    int64_t eid;
    Py_ssize_t ai;        /* the next request the arrival process hands over (a client: sends) */
    int a_holds;          /* the arrival process waits to hand over (a client: send) request ai */
    Core *engines;
    PyObject *progress;
    int64_t progress_every, steps;
    int err;              /* an engine stopped with an error */
    Py_ssize_t mr;        /* the engines the arrival process routes to: the first mr (all, or the prefill pool) */
    struct Disagg *dg;    /* NULL, or disaggregated prefill/decode */
};

/* Disaggregated prefill/decode (sim/cluster/disagg.py Handoff, sim/cluster/link.py KVLink; handoff.h):
engines[0..mp) the prefill pool (each request runs there with one output token), engines[mp..M) the decode
pool. A prefill's blocks are held until its KV has crossed the link; pull: the decode engine, chosen at the
prefill's end, books the prompt's blocks first (``reserve``) and the transfer starts then; push: the KV
crosses at once and the decode engine is chosen when it has landed. Per request: ``src`` its prefill
engine, ``booked`` its blocks booked on the decode side before it arrives, ``kv_received`` its first step
there decodes, ``noted`` its received KV is counted as held at its first allocation there (push), and the
hand-off's times */
typedef struct Disagg {
    Py_ssize_t mp;
    int pull;
    int64_t layers, kv_bytes;   /* layers > 0: pushed KV leaves layer by layer; KV bytes a token */
    double bw, latency;
    const int64_t *out_full;    /* each request's own output length */
    int64_t *src, *next_pull, *next_ahead, *next_link, *cached;
    int8_t *booked, *kv_received, *noted, *ahead_flag, *in_tx;
    double *prefill_end, *tx_start, *tx_s;
    TxHeap ev;
    Fifo link_q;
    int link_busy;
    double idle_since, busy_s;
    int64_t bytes_sent, in_flight, done_on_prefill, prefill_running;
    PyObject *route;            /* route(g) -> a decode pool position, reading ``state`` */
    int rule;                   /* or the decode router's rule, applied here (RULE_LEAST_LOAD, _LEAST_KV, _AFFINITY) */
    int64_t slack;              /* RULE_AFFINITY: its load slack */
    int64_t *state;             /* per decode engine: handed over, finished or rejected, blocks used, incoming */
} Disagg;

/* ------------------------------------------------------------------ records */
static int mark(Core *c, int64_t i, int8_t phase, double t)
{
    if (vec_push(&c->tr_rid, &c->rid[i]) < 0 || vec_push(&c->tr_time, &t) < 0 || vec_push(&c->tr_phase, &phase) < 0)
        return -1;
    if (phase == PH_PREFILL) {
        if (!c->in_pre[i]) {
            c->in_pre[i] = 1;
            c->n_prefilling++;
        }
    } else if (c->in_pre[i]) {
        c->in_pre[i] = 0;
        c->n_prefilling--;
    }
    return 0;
}

/* ------------------------------------------------------------------ KV counters */
static void note_beyond(Core *c, int64_t i)
{
    const int64_t bs = c->bs, maxkv = c->prompt[i] + c->output[i] - 1;
    const int64_t last = (maxkv - 1) / bs, per = (last + 1) * bs - maxkv;
    int64_t b = (per && c->tlen[i] > last) ? per : 0;
    if (b && c->nseq && c->gk[i] > 1 && last >= c->gcom[i])   /* each sequence's own block there */
        b *= c->gk[i];
    if (b != c->beyond[i]) {
        c->beyond_final += b - c->beyond[i];
        c->beyond[i] = b;
    }
}

/* blocks of request i's shared-prefix region its table holds */
static inline int64_t prefix_blocks(const Core *c, int64_t i, int64_t tlen)
{
    const int64_t plen = c->plen_tok[i] / c->bs;
    return tlen < plen ? tlen : plen;
}

/* SharingMixin._note_table: request i's table grew from ``old`` blocks: logical blocks, shared-prefix
regions, slots past its final length, peaks */
static void note_table(Core *c, int64_t i, int64_t old)
{
    c->logical += c->tlen[i] - old;
    const int64_t from = prefix_blocks(c, i, old), to = prefix_blocks(c, i, c->tlen[i]);
    if (to > from) {
        c->prefix_logical += to - from;
        if (!c->cache)
            c->prefix_distinct += to - from;   /* nothing shared: one table a block */
        else
            for (int64_t k = from; k < to; k++)
                c->prefix_distinct += c->pref[c->tbl[i][k]]++ == 0;
    }
    note_beyond(c, i);
    const int64_t used = c->num_blocks - c->free_blocks;
    if (used > c->peak_used)
        c->peak_used = used;
    if (c->logical > c->peak_logical)
        c->peak_logical = c->logical;
    if (c->prefix_distinct > c->peak_prefix)
        c->peak_prefix = c->prefix_distinct;
    if (c->prefix_logical > c->peak_prefix_logical)
        c->peak_prefix_logical = c->prefix_logical;
}

/* ------------------------------------------------------------------ the prefix cache */
/* the hash of request i's full block k: given (sim/workload/tokens.py block_hashes) over the blocks whose
content others may share (k < hs[i]: found through the pool's index), else a value of (i, k) alone: such a
block holds tokens of request i's own (its own prompt or its output), so it equals no other request's
block and only its own request finds it (after a preemption), which is all the hash's value decides. Those
are found through the request's own array ``own[i][k]`` (the block last cached as its block k; live
where that block is still cached so), kept in the pool as ``KV_OWN`` blocks, outside its index */
static inline int64_t block_hash(const Core *c, int64_t i, int64_t k)
{
    if (k < c->hs[i])
        return ((const int64_t *)c->hbuf[i].buf)[k];
    return (int64_t)kv_mix64(((uint64_t)i << 24) ^ (uint64_t)k);   /* (blocks a request < 2**24): injective */
}

/* whether block b is cached as request i's block k */
static inline int holds(const Core *c, int64_t i, int64_t k, int64_t b)
{
    return c->pool.cached[b] == (k < c->hs[i] ? KV_INDEXED : KV_OWN) && c->pool.hash_at[b] == block_hash(c, i, k);
}

/* the block cached as request i's block k, or -1 */
static inline int64_t find_block(const Core *c, int64_t i, int64_t k)
{
    if (k < c->hs[i])
        return kvpool_find(&c->pool, block_hash(c, i, k));
    const int64_t b = c->own[i][k];
    return holds(c, i, k, b) ? b : -1;
}

/* PrefixCache.insert of request i's block k, b: findable, unless b is cached already or another block
holds that hash */
static inline void insert_block(Core *c, int64_t i, int64_t k, int64_t b)
{
    if (k < c->hs[i]) {
        kvpool_insert(&c->pool, b, block_hash(c, i, k));
        return;
    }
    if (c->pool.cached[b] || holds(c, i, k, c->own[i][k]))
        return;
    c->own[i][k] = b;
    c->pool.cached[b] = KV_OWN;
    c->pool.hash_at[b] = block_hash(c, i, k);
}

/* blocks request i can ever hold: its table's room (all its KV but the last token's) */
static inline int64_t max_blocks_of(const Core *c, int64_t i)
{
    const int64_t n = (c->prompt[i] + c->output[i] - 1 + c->bs - 1) / c->bs;
    return n > 1 ? n : 1;
}

/* the hashes of request i's shareable blocks (``hashes_of(i, full blocks)``), once */
static int fetch_hashes(Core *c, int64_t i)
{
    if (c->hs[i] >= 0)
        return 0;
    const int64_t full = (c->prompt[i] + c->output[i] - 1) / c->bs;
    PyObject *got = PyObject_CallFunction(c->hash_fn, "nL", (Py_ssize_t)i, (long long)full);
    if (!got)
        return -1;
    if (PyObject_GetBuffer(got, &c->hbuf[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(got);
        return -1;
    }
    Py_DECREF(got);
    const Py_ssize_t n = c->hbuf[i].itemsize ? c->hbuf[i].len / c->hbuf[i].itemsize : 0;
    if (c->hbuf[i].itemsize != 8 || n > full) {
        PyBuffer_Release(&c->hbuf[i]);
        PyErr_SetString(PyExc_ValueError, "run_core: a request's block hashes are not int64, at most its full blocks");
        return -1;
    }
    c->hs[i] = n;
    return 0;
}

/* a queued request's table room, own-block array and hashes */
static int open_request(Core *c, int64_t i)
{
    if (!c->cache || c->tbl[i])
        return 0;
    c->tbl[i] = malloc(max_blocks_of(c, i) * sizeof(int64_t));
    c->own[i] = calloc(max_blocks_of(c, i), sizeof(int64_t));   /* (block 0 where none: holds() says not) */
    if (c->nseq && c->nseq[i] > 1)
        c->gtbl[i] = malloc((c->nseq[i] - 1) * max_blocks_of(c, i) * sizeof(int64_t));
    if (c->wg)   /* (its window's pages by logical block) */
        c->wpg[i] = malloc(c->wg * max_blocks_of(c, i) * sizeof(int64_t));
    if (!c->tbl[i] || !c->own[i] || (c->nseq && c->nseq[i] > 1 && !c->gtbl[i]) || (c->wg && !c->wpg[i])) {
        PyErr_NoMemory();
        return -1;
    }
    return fetch_hashes(c, i);
}

/* a finished request's table room and hashes go */
static void close_request(Core *c, int64_t i)
{
    if (c->gtbl) {
        free(c->gtbl[i]);
        c->gtbl[i] = NULL;
    }
    if (c->wpg) {
        free(c->wpg[i]);
        c->wpg[i] = NULL;
    }
    free(c->own[i]);
    c->own[i] = NULL;
    free(c->tbl[i]);
    c->tbl[i] = NULL;
    if (c->hs[i] >= 0)
        PyBuffer_Release(&c->hbuf[i]);
    c->hs[i] = -1;
}

/* SharingMixin._cache_full_blocks: request i's full blocks among its first ``tokens`` offered to the cache */
static void cache_full(Core *c, int64_t i, int64_t tokens)
{
    int64_t full = tokens / c->bs;
    if (full > c->tlen[i])
        full = c->tlen[i];
    for (int64_t k = c->upto[i]; k < full; k++) {
        insert_block(c, i, k, c->tbl[i][k]);
        if (c->host.cap)   /* written through to host memory */
            hostlru_store(&c->host, block_hash(c, i, k));
    }
    if (full > c->upto[i])
        c->upto[i] = full;
}

/* SharingMixin._first_lookup: request i's first admission counts its prompt and the tokens it found in
the GPU cache (hit_tokens) and loaded from the host tier (the host tier's queries are the cache's) */
static void first_lookup(Core *c, int64_t i, int64_t hit_tokens, int64_t loaded_tokens)
{
    if (c->looked[i])
        return;
    c->looked[i] = 1;
    c->query_tokens += c->prompt[i];
    c->hit_tokens += hit_tokens;
    c->host_hit_tokens += loaded_tokens;
    c->ncached[i] = hit_tokens + loaded_tokens;
}

static int64_t window_hit(const Core *c, int64_t i, int64_t full);

/* SharingMixin.match_prefix_blocks: the cached blocks a fresh admission of request i reuses, at least one
token left to compute, into its table's room (empty while it waits). The run found last time is
remembered (``memo``): its blocks still cached under the same hashes are checked in the arrays, and
lookups begin at the first that is not (a waiting head matched again every step costs a pass over
its blocks, not a lookup each); with window pages, cut where they are not cached (``window_hit``) */
static int64_t match_prefix(Core *c, int64_t i)
{
    if (c->comp[i] || c->tlen[i])
        return 0;
    const int64_t end = (c->prompt[i] + c->gen[i] - 1) / c->bs;
    int64_t *run = c->tbl[i], m = 0;
    const int64_t known = c->memo[i] < end ? c->memo[i] : end;
    if (c->memo_at[i] == c->pool.evicted)   /* nothing evicted since: every block of the run is still cached */
        m = known;
    while (m < known && holds(c, i, m, run[m]))
        m++;
    for (; m < end; m++) {
        const int64_t b = find_block(c, i, m);
        if (b < 0)
            break;
        run[m] = b;
    }
    c->memo[i] = m;
    c->memo_at[i] = c->pool.evicted;
    return c->wg ? window_hit(c, i, m) : m;   /* (cut where the window's pages are not cached) */
}

/* SharingMixin.host_run: the blocks after request i's m GPU hits the host tier holds without a gap (at least
one token left to compute); a query */
static int64_t host_run(const Core *c, int64_t i, int64_t m)
{
    if (c->comp[i] || c->tlen[i])
        return 0;
    const int64_t end = (c->prompt[i] + c->gen[i] - 1) / c->bs;
    int64_t k = m;
    while (k < end && hostlru_has(&c->host, block_hash(c, i, k)))
        k++;
    return k - m;
}

/* SharingMixin._host_lookup: an admission from nothing looked request i's blocks up; those the host tier
holds become its most recent */
static void host_lookup(Core *c, int64_t i)
{
    const int64_t end = (c->prompt[i] + c->gen[i] - 1) / c->bs;
    for (int64_t k = 0; k < end; k++)
        hostlru_touch(&c->host, block_hash(c, i, k));
}

/* blocks from the free queue's head onto request i's table (from block ``at``) */
static void take_blocks(Core *c, int64_t i, int64_t at, int64_t n)
{
    for (int64_t k = at; k < at + n; k++)
        c->tbl[i][k] = kvpool_pop(&c->pool);
    c->free_blocks = c->pool.num_free;
}

/* ------------------------------------------------------------------ contiguous regions */
/* ContiguousKVManager.region_tokens: the slots the allocator reserves for request i */
static int64_t region_tokens(const Core *c, int64_t i)
{
    const int64_t maxkv = c->prompt[i] + c->output[i] - 1;
    if (c->contig == 1)
        return c->max_model_len;
    if (c->contig == 2) {
        int64_t p2 = 1;
        while (p2 < c->prompt[i] + c->output[i])
            p2 <<= 1;
        const int64_t cap = c->max_model_len > maxkv ? c->max_model_len : maxkv;
        return p2 < cap ? p2 : cap;
    }
    return maxkv;
}

static inline int64_t region_blocks(const Core *c, int64_t i) { return (region_tokens(c, i) + c->bs - 1) / c->bs; }

/* ContiguousKVManager.allocate_slots: request i's whole region, first fit, at its first call; 0 where no
free extent holds it */
static int allocate_region(Core *c, int64_t i)
{
    if (c->tlen[i])
        return 1;   /* (the region holds the request's every token) */
    const int64_t n = region_blocks(c, i), start = extents_take(&c->ext, n);
    if (start < 0)
        return 0;
    c->free_blocks = c->ext.num_free;
    c->rstart[i] = start;
    c->tlen[i] = n;
    c->logical += n;
    c->beyond[i] = n * c->bs - (c->prompt[i] + c->output[i] - 1);
    c->beyond_final += c->beyond[i];
    return 1;
}

/* ------------------------------------------------------------------ local attention and window pages */
/* LocalAttention.first_visible: the first token a query at position p sees on a local layer */
static inline int64_t first_visible(int64_t span, int chunked, int64_t p)
{
    if (chunked)
        return (p / span) * span;
    return p - span + 1 > 0 ? p - span + 1 : 0;
}

/* LocalAttention.pairs: (query, key) pairs of n new tokens after c cached ones on a local layer */
static int64_t local_pairs(int64_t span, int chunked, int64_t n, int64_t c)
{
    if (!chunked) {   /* window_pairs: the sum of min(x, span) over x = c + 1 .. c + n */
        const int64_t lo = c + 1, hi = c + n;
        if (hi <= span)
            return (lo + hi) * n / 2;
        if (lo >= span)
            return n * span;
        return (lo + span) * (span - lo + 1) / 2 + (hi - span) * span;
    }
    int64_t total = 0, p = c;   /* chunk_pairs: the sum of p % span + 1, a chunk at a time */
    const int64_t end = c + n;
    while (p < end) {
        const int64_t base = (p / span) * span, stop = end < base + span ? end : base + span;
        total += ((p - base + 1) + (stop - base)) * (stop - p) / 2;
        p = stop;
    }
    return total;
}

static void note_peaks(Core *c);

/* WindowedKVCacheManager._window_change: (pages freed, pages taken) when request i's window moves to logical
blocks first .. stop - 1 */
static inline void window_change(const Core *c, int64_t i, int64_t first, int64_t stop, int64_t *dropped,
                                 int64_t *taken)
{
    const int64_t have = c->whave[i];
    int64_t gone = 0, held_to = first;
    if (have) {
        gone = first - c->wfirst[i];
        gone = gone < 0 ? 0 : (gone > have ? have : gone);
        held_to = c->wfirst[i] + have;
    }
    const int64_t from = first > held_to ? first : held_to;
    *dropped = c->wg * gone;
    *taken = c->wg * (stop > from ? stop - from : 0);
}

/* pages of request i's logical blocks [a, b) back to the pool, group by group, each group's last block first
(WindowedKVCacheManager._give_back) */
static void give_pages(Core *c, int64_t i, int64_t a, int64_t b)
{
    const int64_t n = (b - a) * c->wg;
    if (c->cache) {   /* (a page shared by prefix hits stays held until its last holder gives it back) */
        const int64_t *pg = c->wpg[i];
        for (int64_t g = 0; g < c->wg; g++)
            for (int64_t k = b - 1; k >= a; k--) {
                const int64_t p = pg[k * c->wg + g];
                c->npages -= c->pool.refs[p] == 1;
                kvpool_decref(&c->pool, p);
            }
        c->free_blocks = c->pool.num_free;
    } else {
        c->free_blocks += n;
        c->npages -= n;
    }
    c->logical -= n;
}

/* WindowedKVCacheManager._drop_before: request i's pages of logical blocks before ``first`` (they left the
window) freed, in give_pages' order */
static void drop_before(Core *c, int64_t i, int64_t first)
{
    const int64_t have = c->whave[i], at = c->wfirst[i];
    int64_t gone = first - at;
    if (!have || gone <= 0)
        return;
    if (gone > have)
        gone = have;
    give_pages(c, i, at, at + gone);
    c->wfirst[i] = at + gone;
    c->whave[i] = have - gone;
}

/* the window's new pages (``taken``: wg a logical block) for request i's blocks up to ``stop``, in block order */
static void take_pages(Core *c, int64_t i, int64_t stop, int64_t taken)
{
    const int64_t blocks = taken / c->wg;
    if (!c->whave[i])
        c->wfirst[i] = stop - blocks;
    if (c->cache) {
        int64_t *pg = c->wpg[i];
        for (int64_t j = (stop - blocks) * c->wg; j < stop * c->wg; j++)
            pg[j] = kvpool_pop(&c->pool);
        c->free_blocks = c->pool.num_free;
    } else {
        c->free_blocks -= taken;
    }
    c->whave[i] += blocks;
    c->npages += taken;
    c->logical += taken;
    note_peaks(c);
}

/* request i's pages all freed (WindowedKVCacheManager.free, after its table) */
static void release_window(Core *c, int64_t i)
{
    c->wstale[i] = 0;
    if (c->cache)
        c->wupto[i] = 0;
    if (c->whave[i])
        give_pages(c, i, c->wfirst[i], c->wfirst[i] + c->whave[i]);
    c->whave[i] = 0;
}

/* the hash under which page g of a block of hash h is cached (window_pages.page_hashes: the same values) */
static inline int64_t page_hash(int64_t h, int64_t g)
{
    return (int64_t)kv_mix64((uint64_t)h + 0x9E3779B97F4A7C15ULL * (uint64_t)(g + 1));
}

/* the page cached as group g's of request i's logical block k, or -1 */
static inline int64_t find_page(const Core *c, int64_t i, int64_t k, int64_t g)
{
    return kvpool_find(&c->pool, page_hash(block_hash(c, i, k), g));
}

/* whether every page of request i's logical block k is cached */
static int pages_cached(const Core *c, int64_t i, int64_t k)
{
    for (int64_t g = 0; g < c->wg; g++)
        if (find_page(c, i, k, g) < 0)
            return 0;
    return 1;
}

/* WindowedKVCacheManager.window_hit: the prefix hit given the full group's run of ``full`` blocks, the longest
whose next query finds the pages it sees cached (vLLM's rule: a window's rightmost run of ceil((span - 1) / bs)
cached blocks, else the run from block 0; a chunk's cached blocks from its start) */
static int64_t window_hit(const Core *c, int64_t i, int64_t full)
{
    if (full <= 0)
        return 0;
    const int64_t bs = c->bs, span = c->wspan;
    if (c->wchunked) {
        int64_t k = (full * bs / span) * span / bs;
        if (k > full)
            k = full;
        while (k < full && pages_cached(c, i, k))
            k++;
        return k;
    }
    const int64_t need = (span - 1 + bs - 1) / bs;
    int64_t run = 0;
    for (int64_t k = full - 1; k >= 0; k--) {   /* right to left, as vLLM searches */
        if (!pages_cached(c, i, k)) {
            run = 0;
            continue;
        }
        if (++run >= need)
            return k + run;
    }
    return run;
}

/* WindowedKVCacheManager._cache_pages: the pages request i still holds of its full blocks among its first
``tokens`` offered to the cache */
static void cache_pages(Core *c, int64_t i, int64_t tokens)
{
    const int64_t full = tokens / c->bs, done = c->wupto[i];
    if (full <= done)
        return;
    c->wupto[i] = full;
    if (!c->whave[i])
        return;
    const int64_t at = c->wfirst[i], lo = done > at ? done : at, end = at + c->whave[i], hi = full < end ? full : end;
    for (int64_t k = lo; k < hi; k++)
        for (int64_t g = 0; g < c->wg; g++)
            kvpool_insert(&c->pool, c->wpg[i][k * c->wg + g], page_hash(block_hash(c, i, k), g));
}

/* request i's last step computed several tokens: the pages it leaves behind go as the next step is planned
(``stale_pages``: a dict in insertion order; a request listed already keeps its place) */
static void mark_stale(Core *c, int64_t i)
{
    if (c->wstale[i])
        return;
    if (c->nstale == c->stale_cap) {   /* (full of entries of requests freed since: keep the listed ones, in order) */
        Py_ssize_t k = 0;
        for (Py_ssize_t j = 0; j < c->nstale; j++) {
            const int64_t r = c->stale[j];
            if (c->wstale[r] == j + 1) {
                c->stale[k] = r;
                c->wstale[r] = ++k;
            }
        }
        c->nstale = k;
    }
    c->stale[c->nstale++] = i;
    c->wstale[i] = c->nstale;
}

/* WindowedKVCacheManager.free_stale_pages */
static void free_stale(Core *c)
{
    for (Py_ssize_t j = 0; j < c->nstale; j++) {
        const int64_t r = c->stale[j];
        if (c->wstale[r] != j + 1)
            continue;   /* (freed since, or listed again later) */
        c->wstale[r] = 0;
        drop_before(c, r, first_visible(c->wspan, c->wchunked, c->comp[r]) / c->bs);
    }
    c->nstale = 0;
}

/* the blocks request i still needs for comp + n tokens (KVCacheManager / ContiguousKVManager.blocks_needed) */
static inline int64_t blocks_needed(const Core *c, int64_t i, int64_t n)
{
    if (c->contig)
        return c->tlen[i] ? 0 : region_blocks(c, i);
    const int64_t need = (c->comp[i] + n + c->bs - 1) / c->bs - c->tlen[i];
    return need > 0 ? need : 0;
}

/* ------------------------------------------------------------------ KV allocation */
/* KVCacheManager.allocate_slots without forks: room for comp + n tokens, the last ``drafts`` of them speculative
(a block they fill joins the prefix cache only once they are accepted); 0 where blocks ran out */
static int allocate_group(Core *c, int64_t i, int64_t n);

static int allocate_table(Core *c, int64_t i, int64_t n, int64_t drafts);

/* WindowedKVCacheManager.allocate_slots without cached blocks: the pages behind the window freed first (fit
or not), then the table's blocks and the window's new pages together, or nothing */
static int allocate_windowed(Core *c, int64_t i, int64_t n)
{
    const int64_t bs = c->bs, comp = c->comp[i];
    const int64_t first = first_visible(c->wspan, c->wchunked, comp) / bs, stop = (comp + n + bs - 1) / bs;
    drop_before(c, i, first);
    int64_t dropped, taken;
    window_change(c, i, first, stop, &dropped, &taken);
    const int64_t need = stop - c->tlen[i];
    if ((need > 0 ? need : 0) + taken > c->free_blocks || !allocate_table(c, i, n, 0))
        return 0;
    if (n > 1)
        mark_stale(c, i);
    if (taken)
        take_pages(c, i, stop, taken);
    if (c->cache)
        cache_pages(c, i, comp + n);
    return 1;
}

static int allocate_drafts(Core *c, int64_t i, int64_t n, int64_t drafts)
{
    if (c->contig)
        return allocate_region(c, i);
    if (c->nseq && c->gk[i] > 1)
        return allocate_group(c, i, n);
    if (c->wg)
        return allocate_windowed(c, i, n);
    return allocate_table(c, i, n, drafts);
}

/* KVCacheManager.allocate_slots of request i's table alone */
static int allocate_table(Core *c, int64_t i, int64_t n, int64_t drafts)
{
    const int64_t old = c->tlen[i];
    const int64_t need = (c->comp[i] + n + c->bs - 1) / c->bs - old;
    if (need > c->free_blocks)
        return 0;
    if (need > 0 || old == 0) {
        if (need > 0) {
            c->tlen[i] = old + need;
            if (c->cache)
                take_blocks(c, i, old, need);
            else
                c->free_blocks -= need;
        }
        note_table(c, i, old);
    }
    if (c->cache) {
        if (old == 0) {
            first_lookup(c, i, 0, 0);
            if (c->host.cap && !c->comp[i])
                host_lookup(c, i);
        }
        cache_full(c, i, c->comp[i] + n - drafts);
    }
    return 1;
}

static inline int allocate(Core *c, int64_t i, int64_t n) { return allocate_drafts(c, i, n, 0); }

/* KVCacheManager.trim: the blocks of request i's table past its computed tokens given back, tail first (the
slots of rejected drafts: one reference each, in no prefix cache) */
static void trim(Core *c, int64_t i)
{
    const int64_t keep = (c->comp[i] + c->bs - 1) / c->bs, t = c->tlen[i];
    if (t <= keep)
        return;
    if (c->cache) {
        for (int64_t k = t - 1; k >= keep; k--)
            kvpool_decref(&c->pool, c->tbl[i][k]);
        c->free_blocks = c->pool.num_free;
    } else {
        c->free_blocks += t - keep;
    }
    c->logical -= t - keep;
    c->tlen[i] = keep;
    note_beyond(c, i);
}

/* ------------------------------------------------------------------ forked sequences (parallel samples) */
/* sequence q of forked request i's table (0: its own) */
static inline int64_t *seq_table(const Core *c, int64_t i, int64_t q)
{
    return q ? c->gtbl[i] + (q - 1) * max_blocks_of(c, i) : c->tbl[i];
}

/* the slots request i's computed tokens fill in blocks [a, b) of one table */
static inline int64_t filled(const Core *c, int64_t i, int64_t a, int64_t b)
{
    const int64_t f = c->comp[i] - a * c->bs, cap = (b - a) * c->bs;
    return f < 0 ? 0 : (f > cap ? cap : f);
}

static void note_peaks(Core *c)
{
    const int64_t used = c->num_blocks - c->free_blocks;
    if (used > c->peak_used)
        c->peak_used = used;
    if (c->logical > c->peak_logical)
        c->peak_logical = c->logical;
}

static int grow_entries(Core *c, Py_ssize_t cap);

/* SharingMixin._fork: request i's table shared by its n - 1 siblings. After a preemption (more than one token
generated) the siblings own fresh copies of the blocks past the prompt's full ones, filled as if recomputed
with sequence 0 (they recompute them at their next step: ``gsib``), where the pool has them */
static int fork_group(Core *c, int64_t i)
{
    const int64_t k = c->nseq[i], t = c->tlen[i];
    int64_t own_from = t;
    if (c->gen[i] > 1) {
        own_from = c->prompt[i] / c->bs < t ? c->prompt[i] / c->bs : t;
        if ((k - 1) * (t - own_from) > c->free_blocks)
            own_from = t;
    }
    if (own_from < t) {
        const int64_t redo = c->comp[i] - own_from * c->bs;
        c->gsib[i] = redo > 0 ? redo : 0;
        c->free_blocks -= (k - 1) * (t - own_from);
        c->held += (k - 1) * filled(c, i, own_from, t);
    }
    if (c->cache) {   /* blocks by identity: the shared ones gain the siblings' references, then each sibling's own */
        const int64_t *t0 = c->tbl[i];
        for (int64_t b = 0; b < own_from; b++)
            c->pool.refs[t0[b]] += k - 1;   /* (each is held by t0: none is free) */
        for (int64_t q = 1; q < k; q++) {
            int64_t *tq = seq_table(c, i, q);
            memcpy(tq, t0, own_from * sizeof(int64_t));
            for (int64_t b = own_from; b < t; b++)
                tq[b] = kvpool_pop(&c->pool);
        }
        c->free_blocks = c->pool.num_free;
    }
    c->gk[i] = k;
    c->gcom[i] = own_from;
    c->gpriv[i] = 0;
    c->logical += (k - 1) * t;
    note_beyond(c, i);
    note_peaks(c);
    c->sib_total += k - 1;   /* (each sibling an entry of the plans to come) */
    if (c->e_base + c->sib_total > c->e_cap)
        return grow_entries(c, c->e_base + c->sib_total > 2 * c->e_cap ? c->e_base + c->sib_total : 2 * c->e_cap);
    return 0;
}

/* a forked request's tables, each its own last block now, grown to ``len`` blocks: the counts and peaks */
static void group_grown(Core *c, int64_t i, int64_t len)
{
    c->logical += c->gk[i] * (len - c->tlen[i]);
    c->tlen[i] = len;
    c->gpriv[i] = 1;
    note_beyond(c, i);
    note_peaks(c);
}

/* allocate_group over blocks by identity (a prefix cache): each table in turn replaces each block it writes
into that others still hold (a copy where it holds tokens), then grows; the ref counts decide, as in
SharingMixin._allocate_group (a block the sequences share may also be a cache hit of other requests') */
static int allocate_group_blocks(Core *c, int64_t i, int64_t n)
{
    const int64_t bs = c->bs, pos = c->comp[i], k = c->gk[i], t = c->tlen[i];
    const int64_t total = (pos + n + bs - 1) / bs, first = pos / bs, upto = total < t ? total : t;
    const int64_t grow = total > t ? total - t : 0;
    int64_t need = k * grow, *refs = c->pool.refs;
    for (int64_t b = first; b < upto; b++) {
        if (b < c->gcom[i]) {   /* one block in every table: each sees the references the earlier ones left */
            const int64_t r = refs[c->tbl[i][b]] - 1;
            need += r < k ? r : k;
        } else {
            for (int64_t q = 0; q < k; q++)
                need += refs[seq_table(c, i, q)[b]] > 1;
        }
    }
    if (need > c->pool.num_free)
        return 0;
    int64_t common = c->gcom[i];
    for (int64_t q = 0; q < k; q++) {
        int64_t *tq = seq_table(c, i, q);
        for (int64_t b = first; b < upto; b++) {
            const int64_t src = tq[b];
            if (refs[src] <= 1)
                continue;
            tq[b] = kvpool_pop(&c->pool);
            kvpool_decref(&c->pool, src);
            if (b < common)
                common = b;
            const int64_t f = pos - b * bs;
            if (f > 0) {
                c->st_copy++;
                c->held += f < bs ? f : bs;
            }
        }
        for (int64_t b = t; b < total; b++)
            tq[b] = kvpool_pop(&c->pool);
    }
    c->free_blocks = c->pool.num_free;
    c->gcom[i] = common;
    group_grown(c, i, t + grow);
    return 1;
}

/* SharingMixin._allocate_group: room for every sequence's next n tokens; a write into a block the sequences
share first gives each but the last holder a block of its own, a copy where it holds tokens; 0 where blocks
ran out */
static int allocate_group(Core *c, int64_t i, int64_t n)
{
    const int64_t bs = c->bs, pos = c->comp[i], k = c->gk[i], t = c->tlen[i];
    if (n == 1 && pos % bs && c->gpriv[i]) {   /* inside every sequence's own last block */
        note_peaks(c);
        return 1;
    }
    if (c->cache)
        return allocate_group_blocks(c, i, n);
    const int64_t total = (pos + n + bs - 1) / bs, first = pos / bs;
    int64_t upto = total < t ? total : t;
    if (c->gcom[i] < upto)
        upto = c->gcom[i];
    const int64_t shared = upto > first ? upto - first : 0, grow = total > t ? total - t : 0;
    if ((k - 1) * shared + k * grow > c->free_blocks)
        return 0;
    for (int64_t b = first; b < first + shared; b++) {
        const int64_t f = pos - b * bs;
        if (f > 0) {
            c->st_copy += k - 1;
            c->held += (k - 1) * (f < bs ? f : bs);
        }
    }
    c->free_blocks -= (k - 1) * shared + k * grow;
    if (shared)
        c->gcom[i] = first;
    group_grown(c, i, t + grow);
    return 1;
}

/* SharingMixin._release of table tb from its block ``skip`` (its first ones kept as they are): a block losing
its last reference gives back what the table filled, tail first */
static void release_blocks(Core *c, int64_t i, const int64_t *tb, int64_t skip)
{
    const int64_t bs = c->bs, t = c->tlen[i], comp = c->comp[i];
    for (int64_t b = skip; b < t; b++)
        if (c->pool.refs[tb[b]] == 1) {
            const int64_t f = comp - b * bs;
            c->held -= f < 0 ? 0 : (f > bs ? bs : f);
        }
    for (int64_t b = t - 1; b >= skip; b--)
        kvpool_decref(&c->pool, tb[b]);
}

/* SharingMixin._free_shared of a forked request: every table but the last gives up its own blocks, the
shared ones lose those tables' references at once, then the last table is released whole (tail first,
each; no block offered to the cache) */
static void release_group(Core *c, int64_t i)
{
    const int64_t k = c->gk[i], t = c->tlen[i], own = t - c->gcom[i];
    if (c->cache) {
        for (int64_t q = 0; q < k - 1; q++)
            release_blocks(c, i, seq_table(c, i, q), c->gcom[i]);
        const int64_t *last = seq_table(c, i, k - 1);
        for (int64_t b = 0; b < c->gcom[i]; b++)
            c->pool.refs[last[b]] -= k - 1;
        release_blocks(c, i, last, 0);
        c->free_blocks = c->pool.num_free;
    } else {
        c->held -= filled(c, i, 0, t) + (k - 1) * filled(c, i, c->gcom[i], t);
        c->free_blocks += t + (k - 1) * own;
    }
    c->logical -= (k - 1) * t;   /* (sequence 0's table: the caller) */
    c->sib_total -= k - 1;
    c->gk[i] = c->gcom[i] = c->gsib[i] = 0;
    c->gpriv[i] = 0;
}

/* SharingMixin._allocate_cached: request i's table starts with the m blocks found (ref counts up), then h
fresh ones the host tier fills, then fresh ones for its n new tokens; 0 where blocks ran out */
static int allocate_cached(Core *c, int64_t i, int64_t n, int64_t m, int64_t h)
{
    const int64_t bs = c->bs;
    const int64_t *run = c->tbl[i];   /* the blocks match_prefix found */
    int64_t revive = 0;
    for (int64_t k = 0; k < m; k++)
        revive += c->pool.refs[run[k]] == 0;
    const int64_t need = ((m + h) * bs + n + bs - 1) / bs - m;
    int64_t wstop = 0, taken = 0, first = 0, wrevive = 0;   /* (the hybrid manager: the hit's pages, then new ones) */
    if (c->wg) {
        first = first_visible(c->wspan, c->wchunked, (m + h) * bs) / bs;
        wstop = ((m + h) * bs + n + bs - 1) / bs;
        drop_before(c, i, first);
        int64_t *pg = c->wpg[i];
        for (int64_t k = first; k < m; k++)   /* (window_hit found every one) */
            for (int64_t g = 0; g < c->wg; g++) {
                const int64_t b = find_page(c, i, k, g);
                pg[k * c->wg + g] = b;
                wrevive += c->pool.refs[b] == 0;
            }
        taken = c->wg * (wstop - (first > m ? first : m));
    }
    if (need + revive + wrevive + taken > c->free_blocks)
        return 0;
    if (c->wg && first < m) {   /* the hit's pages first, out of the free queue before any allocation */
        for (int64_t j = first * c->wg; j < m * c->wg; j++)
            kvpool_incref(&c->pool, c->wpg[i][j]);
        c->wfirst[i] = first;
        c->whave[i] = m - first;
        c->npages += wrevive;
        c->logical += (m - first) * c->wg;
    }
    if (c->wg)
        c->wupto[i] = m;
    c->held += (revive + h) * bs;
    for (int64_t k = 0; k < m; k++)
        kvpool_incref(&c->pool, run[k]);
    c->memo[i] = 0;
    c->tlen[i] = m;
    if (need > 0) {
        take_blocks(c, i, m, need);
        c->tlen[i] = m + need;
    }
    c->free_blocks = c->pool.num_free;
    c->comp[i] = (m + h) * bs;
    first_lookup(c, i, m * bs, h * bs);
    if (c->host.cap) {
        c->host_loaded += h;
        host_lookup(c, i);
    }
    note_table(c, i, 0);
    c->upto[i] = m;   /* the hits are cached under these very hashes */
    if (!h)   /* (loaded blocks join the cache when the request computes after its load) */
        cache_full(c, i, c->comp[i] + n);
    if (c->wg) {
        if (n > 1)
            mark_stale(c, i);
        if (taken)
            take_pages(c, i, wstop, taken);
        else if (wrevive)
            note_peaks(c);
        cache_pages(c, i, c->comp[i] + n);
    }
    return 1;
}

/* KVCacheManager.free: request i's table released (its full computed blocks cached first), tail first;
ContiguousKVManager.free: its region given back. -1 (an AssertionError set) where the extents break */
static int release(Core *c, int64_t i)
{
    const int64_t bs = c->bs, t = c->tlen[i], comp = c->comp[i] > 0 ? c->comp[i] : 0;
    if (c->contig) {   /* ContiguousKVManager.free */
        if (!t)
            return 0;
        if (extents_give(&c->ext, c->rstart[i], t) < 0)
            return -1;
        c->free_blocks = c->ext.num_free;
        c->held -= comp;
        c->logical -= t;
        c->tlen[i] = 0;
        c->beyond_final -= c->beyond[i];
        c->beyond[i] = 0;
        return 0;
    }
    const int64_t pre = prefix_blocks(c, i, t);
    c->prefix_logical -= pre;
    const int forked = c->nseq && c->gk[i] > 1;
    if (forked && !c->cache) {
        c->prefix_distinct -= pre;
        release_group(c, i);
    } else if (!c->cache) {
        c->prefix_distinct -= pre;
        const int64_t cap = t * bs;
        c->held -= comp < cap ? comp : cap;
        c->free_blocks += t;
    } else {
        if (c->wg)   /* (as the table's full blocks are) */
            cache_pages(c, i, comp);
        if (!forked)   /* (a forked request's blocks joined the cache up to its fork, no further) */
            cache_full(c, i, comp);
        const int64_t *tb = c->tbl[i];
        for (int64_t k = 0; k < pre; k++)
            c->prefix_distinct -= --c->pref[tb[k]] == 0;
        if (forked)
            release_group(c, i);
        else
            release_blocks(c, i, tb, 0);
        c->free_blocks = c->pool.num_free;
        c->upto[i] = 0;
        c->memo[i] = t;   /* the first run a lookup checks: a recomputed request's blocks may still be cached */
        c->memo_at[i] = -1;
    }
    c->logical -= t;
    c->tlen[i] = 0;
    c->beyond_final -= c->beyond[i];
    c->beyond[i] = 0;
    if (c->wg)
        release_window(c, i);
    return 0;
}

/* ------------------------------------------------------------------ queues */
/* the priority policy's order: lower priority value first, then earlier arrival, then lower req_id */
static int ranks_before(const Core *c, int64_t a, int64_t b)
{
    if (c->prio[a] != c->prio[b])
        return c->prio[a] < c->prio[b];
    if (c->arrival[a] != c->arrival[b])
        return c->arrival[a] < c->arrival[b];
    return c->rid[a] < c->rid[b];
}

/* The waiting queue: FCFS a ring (a preempted request goes to its front); priority a binary heap on
ranks_before (sim/sched/queues.py PriorityQueue: a preempted request keeps its rank) */
static void wq_push_back(Core *c, int64_t i)
{
    if (!c->priority) {
        c->wq[(c->wq_head + c->wq_len) % (c->N + 1)] = i;
        c->wq_len++;
        c->lpf_at = -1;
        return;
    }
    Py_ssize_t j = c->wq_len++;
    while (j > 0 && ranks_before(c, i, c->wq[(j - 1) / 2])) {
        c->wq[j] = c->wq[(j - 1) / 2];
        j = (j - 1) / 2;
    }
    c->wq[j] = i;
}

static void wq_push_front(Core *c, int64_t i)
{
    if (c->priority) {
        wq_push_back(c, i);
        return;
    }
    c->wq_head = (c->wq_head + c->N) % (c->N + 1);
    c->wq[c->wq_head] = i;
    c->wq_len++;
    c->bypassed = 0;
    c->lpf_at = -1;
}

static inline int64_t wq_at(const Core *c, Py_ssize_t j) { return c->wq[(c->wq_head + j) % (c->N + 1)]; }

/* LongestPrefixQueue._best: the position of the queued request with the most cached blocks among the
first ``window`` (ties: the earliest), or 0 (the front) when fewer than two wait or the front was overtaken
``max_bypass`` times */
static Py_ssize_t lpf_best(Core *c)
{
    if (c->wq_len < 2 || c->bypassed >= c->lpf_max_bypass)
        return 0;
    Py_ssize_t best = 0;
    int64_t best_len = -1;
    const Py_ssize_t n = c->wq_len < c->lpf_window ? c->wq_len : (Py_ssize_t)c->lpf_window;
    for (Py_ssize_t j = 0; j < n; j++) {
        const int64_t m = match_prefix(c, wq_at(c, j));
        if (m > best_len) {
            best = j;
            best_len = m;
        }
    }
    return best;
}

static int64_t wq_peek(Core *c)
{
    if (c->ahead.len)   /* (a disaggregated decode engine's requests queued ahead of everything) */
        return c->ahead.head;
    if (c->priority)
        return c->wq[0];
    if (c->lpf) {
        c->lpf_at = lpf_best(c);
        return wq_at(c, c->lpf_at);
    }
    return c->wq[c->wq_head];
}

/* the request the last wq_peek returned (longest-prefix-first: chosen again where the queue grew since)
leaves the queue */
static void wq_pop(Core *c)
{
    if (c->ahead.len) {   /* (the front: a new request is there) */
        fifo_pop(&c->ahead, c->w->dg->next_ahead);
        c->lpf_at = -1;
        c->bypassed = 0;
        return;
    }
    const Py_ssize_t at = !c->lpf ? 0 : (c->lpf_at >= 0 ? c->lpf_at : lpf_best(c));
    c->lpf_at = -1;
    if (at > 0) {   /* overtaking the front: the rest of the queue closes up */
        for (Py_ssize_t j = at; j + 1 < c->wq_len; j++)
            c->wq[(c->wq_head + j) % (c->N + 1)] = wq_at(c, j + 1);
        c->wq_len--;
        c->bypassed++;
        return;
    }
    if (!c->priority) {
        c->wq_head = (c->wq_head + 1) % (c->N + 1);
        c->wq_len--;
        c->bypassed = 0;   /* a new request is at the front */
        return;
    }
    const int64_t last = c->wq[--c->wq_len];
    Py_ssize_t j = 0;
    for (;;) {
        Py_ssize_t k = 2 * j + 1;
        if (k >= c->wq_len)
            break;
        if (k + 1 < c->wq_len && ranks_before(c, c->wq[k + 1], c->wq[k]))
            k++;
        if (!ranks_before(c, c->wq[k], last))
            break;
        c->wq[j] = c->wq[k];
        j = k;
    }
    if (c->wq_len)
        c->wq[j] = last;
}

/* SchedulerBase.add_request (the output cap and the reasons to reject were applied beforehand): 1 queued */
static int add_request(Core *c, int64_t i, double t)
{
    if (!c->accepted[i]) {
        c->rej[i] = t;
        c->int_zero[i] |= c->w->int_clock && t == 0.0 ? 2 : 0;
        c->rejected++;
        if (c->w->client && client_answered(c->w, i, t) < 0)   /* (the client has the error at once) */
            return -1;
        return 0;
    }
    c->stat[i] = ST_WAITING;
    if (open_request(c, i) < 0 || mark(c, i, PH_WAITING, t) < 0)
        return -1;
    if (c->w->dg && c->w->dg->ahead_flag[i]) {   /* ContinuousScheduler._enqueue: push_ahead */
        c->w->dg->ahead_flag[i] = 0;
        fifo_push(&c->ahead, c->w->dg->next_ahead, i);
        c->lpf_at = -1;   /* (LongestPrefixQueue.push_ahead: not overtaken by a better match either) */
        c->bypassed = 0;
        return 1;
    }
    wq_push_back(c, i);
    return 1;
}

static int admit_staged(Core *c)
{
    for (Py_ssize_t j = 0; j < c->nstaged; j++)
        if (add_request(c, c->staged[j], c->staged_t[j]) < 0)
            return -1;
    c->nstaged = 0;
    return 0;
}

/* ------------------------------------------------------------------ the step's plan */
static void add_entry(Core *c, int64_t i, int64_t n)
{
    c->e_idx[c->ne] = i;
    c->e_new[c->ne] = n;
    c->e_ctx[c->ne] = c->comp[i];
    if (c->spec.k)   /* (read only where speculating) */
        c->e_draft[c->ne] = 0;
    if (c->nseq)
        c->e_sib[c->ne] = 0;
    c->ne++;
}

/* SchedulerBase._add of a decode verifying ``drafts`` drafts: all its n tokens are decode tokens */
static void add_verifying(Core *c, int64_t i, int64_t n, int64_t drafts)
{
    add_entry(c, i, n);
    c->e_draft[c->ne - 1] = drafts;
    c->st_decode += n;
}

/* SchedulerBase._add: the entry and its tokens counted as prefill or decode; a forked request's siblings
each an entry after it, with the tokens they recompute after a re-fork (``gsib``, priced once) */
static void add_planned(Core *c, int64_t i, int64_t n)
{
    add_entry(c, i, n);
    const int64_t w = c->nseq && c->gk[i] > 1 ? c->gk[i] : 1;
    int64_t extra = 0;
    if (w > 1) {
        extra = c->gsib[i];
        c->gsib[i] = 0;
        for (int64_t s = 1; s < w; s++) {
            add_entry(c, i, n + extra);
            c->e_ctx[c->ne - 1] -= extra;
            c->e_sib[c->ne - 1] = 1;
        }
    }
    if (n == 1 && c->gen[i] > 0 && c->comp[i] + 1 == c->prompt[i] + c->gen[i])
        c->st_decode += w;
    else
        c->st_prefill += n * w;
    c->st_prefill += extra * (w - 1);
}

static int64_t pick_victim(Core *c, const int64_t *order, Py_ssize_t from, Py_ssize_t n)
{
    int64_t best = -1;
    for (Py_ssize_t j = from; j < n; j++) {
        const int64_t r = order[j];
        if (c->stat[r] != ST_RUNNING)
            continue;
        if (best < 0) {
            best = r;
            continue;
        }
        int greater;
        if (c->victim_generated && c->gen[r] != c->gen[best])
            greater = c->gen[r] > c->gen[best];
        else if (c->victim_generated && c->arrival[r] != c->arrival[best])
            greater = c->arrival[r] > c->arrival[best];
        else if (c->victim_generated)
            greater = c->rid[r] > c->rid[best];
        else if (c->priority)
            greater = ranks_before(c, best, r);   /* the worst rank: (priority, arrival, req_id) largest */
        else if (c->arrival[r] != c->arrival[best])
            greater = c->arrival[r] > c->arrival[best];
        else
            greater = c->rid[r] > c->rid[best];
        if (greater)
            best = r;
    }
    return best;
}

/* ContinuousScheduler._preempt: by swap where the CPU space has room, else by recompute; ``rotate``
(round-robin's time slice) requeues at the back, otherwise a swapped request joins ``swapped`` and a
recomputed one goes to the front of the queue */
static int preempt(Core *c, int64_t i, double now, int rotate)
{
    c->npre[i]++;
    c->num_preemptions++;
    c->st_preempted++;
    const int64_t blocks = c->tlen[i];
    /* (a forked request, whose sequences share blocks, is not swapped: it is recomputed) */
    if (c->swap && blocks > 0 && blocks <= c->cpu_free && !(c->nseq && c->gk[i] > 1)) {   /* KVCacheManager.swap_out: its KV kept on the CPU */
        c->cpu_held[i] = blocks;
        c->cpu_free -= blocks;
        c->st_swap_out += blocks;
        c->swapped_blocks += blocks;
        if (release(c, i) < 0)
            return -1;
        c->num_swapped++;
        c->stat[i] = ST_SWAPPED;
        if (mark(c, i, PH_SWAPPED, now) < 0)
            return -1;
        if (rotate)
            wq_push_back(c, i);
        else
            c->swapped[c->nswapped++] = i;
        return 0;
    }
    if (release(c, i) < 0)
        return -1;
    c->comp[i] = 0;
    c->stat[i] = ST_PREEMPTED;
    if (mark(c, i, PH_PREEMPTED, now) < 0)
        return -1;
    if (rotate)
        wq_push_back(c, i);
    else
        wq_push_front(c, i);
    return 0;
}

/* ContinuousScheduler._resume: swapped request r back with its next tokens (0: it does not fit now) */
static int64_t resume(Core *c, int64_t r, double now, int64_t budget)
{
    if (c->nrun >= c->max_seqs || budget <= 0)
        return 0;
    int64_t num_new = c->prompt[r] + c->gen[r] - c->comp[r];
    if (num_new > budget) {
        if (!c->chunked)
            return 0;
        num_new = budget;
    }
    const int64_t held = c->cpu_held[r], blocks = (c->comp[r] + num_new + c->bs - 1) / c->bs;
    if ((held > blocks ? held : blocks) > c->free_blocks)
        return 0;
    c->tlen[r] = held;   /* KVCacheManager.swap_in: its blocks back in fresh GPU blocks */
    if (c->cache)
        take_blocks(c, r, 0, held);
    else
        c->free_blocks -= held;
    c->cpu_free += held;
    c->cpu_held[r] = 0;
    c->st_swap_in += held;
    c->num_swapped--;
    note_table(c, r, 0);
    c->held += c->comp[r];
    if (!allocate(c, r, num_new)) {
        PyErr_SetString(PyExc_AssertionError, "engine core: swap-in checked the blocks it needs");
        return -1;
    }
    c->stat[r] = ST_RUNNING;
    c->turn[r] = c->step_index;
    c->running[c->nrun++] = r;
    if (mark(c, r, c->comp[r] < c->prompt[r] ? PH_PREFILL : PH_DECODE, now) < 0)
        return -1;
    add_planned(c, r, num_new);
    return num_new;
}

/* ContinuousScheduler._swap_in: swapped requests back, earliest arrival first, while they fit */
static int64_t swap_in(Core *c, double now, int64_t budget)
{
    int64_t *sw = c->swapped;
    for (Py_ssize_t a = 1; a < c->nswapped; a++) {   /* insertion sort by (arrival, req_id): a few */
        const int64_t x = sw[a];
        Py_ssize_t b = a;
        while (b > 0 && (c->priority ? ranks_before(c, x, sw[b - 1])
                         : c->arrival[sw[b - 1]] > c->arrival[x]
                               || (c->arrival[sw[b - 1]] == c->arrival[x] && c->rid[sw[b - 1]] > c->rid[x]))) {
            sw[b] = sw[b - 1];
            b--;
        }
        sw[b] = x;
    }
    Py_ssize_t n = 0;
    for (; n < c->nswapped; n++) {
        const int64_t got = resume(c, sw[n], now, budget);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        budget -= got;
    }
    memmove(sw, sw + n, (c->nswapped - n) * sizeof(int64_t));
    c->nswapped -= n;
    return budget;
}

/* ContinuousScheduler._admit (``ahead_only``: only those queued ahead) */
static int admit(Core *c, double now, int64_t budget, int ahead_only)
{
    Py_ssize_t seats = c->nrun;
    if (c->nseq) {   /* a request with n samples takes n seats */
        seats = 0;
        for (Py_ssize_t j = 0; j < c->nrun; j++)
            seats += c->nseq[c->running[j]];
    }
    Disagg *dg = c->w->dg;
    while ((c->wq_len || c->ahead.len) && seats < c->max_seqs && budget > 0) {
        if (ahead_only && !c->ahead.len)
            break;
        const int64_t r = wq_peek(c);
        if (c->stat[r] == ST_SWAPPED) {   /* round-robin: a rotated request swapped out, back at its turn */
            const int64_t got = resume(c, r, now, budget);
            if (got < 0)
                return -1;
            if (got == 0)
                break;
            wq_pop(c);
            budget -= got;
            continue;
        }
        const int64_t width = c->nseq ? c->nseq[r] : 1;
        if (seats + width > c->max_seqs && seats)
            break;
        const int64_t m = c->cache ? match_prefix(c, r) : 0;   /* reused blocks skip their compute */
        const int64_t h = c->host.cap ? host_run(c, r, m) : 0;   /* and so do those loaded back */
        if (h) {   /* its blocks now, its compute once they are loaded */
            if (!allocate_cached(c, r, 0, m, h))
                break;
            wq_pop(c);
            c->link_free = py_max(now, c->link_free) + (double)h * c->swap_s_per_block;
            const Py_ssize_t at = (c->ld_head + c->ld_len++) % c->N;
            c->ld_idx[at] = r;
            c->ld_ready[at] = c->link_free;
            if (mark(c, r, PH_HOST_LOAD, now) < 0)
                return -1;
            continue;
        }
        int64_t num_new = c->prompt[r] + c->gen[r] - c->comp[r] - m * c->bs;
        if (num_new > budget) {
            if (!c->chunked && c->ne)
                break;
            if (c->chunked)
                num_new = budget;
        }
        if (!(m ? allocate_cached(c, r, num_new, m, 0) : allocate(c, r, num_new)))
            break;
        if (dg && dg->noted[r]) {   /* its received prompt's KV is held here (Handoff's allocate_received) */
            dg->noted[r] = 0;
            c->held += c->comp[r];
            c->sum_used += c->num_blocks - c->free_blocks;
            c->sum_logical += c->logical;
        }
        wq_pop(c);
        if (c->nhw)
            unhold(c, r);
        seats += width;
        if (isnan(c->fsched[r])) {
            c->fsched[r] = now;
            c->int_zero[r] |= c->w->int_clock ? 1 : 0;
        }
        c->stat[r] = ST_RUNNING;
        c->turn[r] = c->step_index;
        c->running[c->nrun++] = r;
        const int received = dg && dg->kv_received[r];   /* (its first step here decodes) */
        if (received)
            dg->kv_received[r] = 0;
        if (mark(c, r, received ? PH_DECODE : PH_PREFILL, now) < 0)
            return -1;
        add_planned(c, r, num_new);
        budget -= num_new;
    }
    return 0;
}

/* ContinuousScheduler._loads_ended: the requests whose load has ended by ``now`` go back to the front of
the queue, in load order */
static int loads_ended(Core *c, double now)
{
    Py_ssize_t k = 0;
    while (k < c->ld_len && c->ld_ready[(c->ld_head + k) % c->N] <= now)
        k++;
    for (Py_ssize_t j = k - 1; j >= 0; j--)
        wq_push_front(c, c->ld_idx[(c->ld_head + j) % c->N]);
    for (Py_ssize_t j = 0; j < k; j++) {   /* (queued again from its load's end: waiting, or preempted) */
        const Py_ssize_t at = (c->ld_head + j) % c->N;
        const int64_t r = c->ld_idx[at];
        c->hw[c->nhw++] = r;
        if (mark(c, r, c->npre[r] ? PH_PREEMPTED : PH_WAITING, c->ld_ready[at]) < 0)
            return -1;
    }
    c->ld_head = (c->ld_head + k) % c->N;
    c->ld_len -= k;
    return 0;
}

/* request r, admitted, holds its blocks as any running request does */
static void unhold(Core *c, int64_t r)
{
    Py_ssize_t j = 0;
    while (j < c->nhw && c->hw[j] != r)
        j++;
    if (j == c->nhw)
        return;
    memmove(c->hw + j, c->hw + j + 1, (size_t)(c->nhw - j - 1) * sizeof(int64_t));
    c->nhw--;
}

/* ContinuousScheduler.release_held: nothing runs, nothing loads and nothing could start; the requests back
from their loads give their blocks back. The number released; -1 on an error */
static Py_ssize_t release_held(Core *c)
{
    const Py_ssize_t n = c->nhw;
    c->nhw = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (release(c, c->hw[j]) < 0)
            return -1;
        c->comp[c->hw[j]] = 0;
    }
    return n;
}

/* ContinuousScheduler._head_fits: whether the next to come back or be admitted gets its blocks now */
static int head_fits(Core *c)
{
    const int64_t r = c->nswapped ? c->swapped[0] : wq_peek(c);
    if (c->contig)   /* ContiguousKVManager.can_allocate: its region fits the largest free extent */
        return blocks_needed(c, r, 0) <= extents_largest(&c->ext);
    const int64_t blocks = (c->prompt[r] + c->gen[r] + c->bs - 1) / c->bs;   /* all its tokens computed */
    if (c->stat[r] == ST_SWAPPED)
        return (c->cpu_held[r] > blocks ? c->cpu_held[r] : blocks) <= c->free_blocks;
    int64_t need = blocks > c->tlen[r] ? blocks - c->tlen[r] : 0;
    if (c->wg) {   /* WindowedKVCacheManager.blocks_needed: and the window's pages, less those leaving it */
        int64_t dropped, taken;
        window_change(c, r, first_visible(c->wspan, c->wchunked, c->comp[r]) / c->bs, blocks, &dropped, &taken);
        need += taken - dropped;
        if (need < 0)
            need = 0;
    }
    return need <= c->free_blocks;
}

/* ContinuousScheduler._startable: how many queued requests this step's token budget could start (>= 1) */
static int64_t startable(Core *c)
{
    int64_t budget = c->max_batched - c->nrun, n = 0;
    int64_t ahead = c->ahead.head;   /* (then those queued ahead, then the ring) */
    for (Py_ssize_t j = 0; j < c->nswapped + c->ahead.len + c->wq_len; j++) {
        int64_t r;
        if (j < c->nswapped) {
            r = c->swapped[j];
        } else if (j < c->nswapped + c->ahead.len) {
            r = ahead;
            ahead = c->w->dg->next_ahead[ahead];
        } else {
            r = c->wq[(c->wq_head + j - c->nswapped - c->ahead.len) % (c->N + 1)];
        }
        const int64_t need = c->stat[r] == ST_SWAPPED ? 1 : c->prompt[r] + c->gen[r] - c->comp[r];
        if (budget <= 0 || (need > budget && !c->chunked))
            break;
        budget -= need;
        n++;
    }
    return n > 1 ? n : 1;
}

/* ContinuousScheduler._rotate: when the batch is full, turns that have lasted the quantum (longest first,
at most as many as can start) make way, to the back of the queue; a request still prefilling keeps its
turn (every turn samples a token: no livelock) */
static int rotate(Core *c, double now)
{
    if (c->nrun < c->max_seqs && head_fits(c))
        return 0;
    const int64_t limit = c->step_index - c->quantum, n = startable(c);
    Py_ssize_t out = 0;
    for (Py_ssize_t j = 0; j < c->nrun; j++) {   /* in turn order */
        const int64_t r = c->running[j];
        if (out == n || c->turn[r] > limit)
            break;
        if (!c->in_pre[r])
            c->done[out++] = r;
    }
    if (!out)
        return 0;
    Py_ssize_t k = 0, o = 0;
    for (Py_ssize_t j = 0; j < c->nrun; j++) {
        if (o < out && c->running[j] == c->done[o])
            o++;
        else
            c->running[k++] = c->running[j];
    }
    c->nrun = k;
    for (Py_ssize_t j = 0; j < out; j++)
        if (preempt(c, c->done[j], now, 1) < 0)
            return -1;
    return 0;
}

/* (priority, chunked prefill and still prefilling, arrival, req_id) of a running request, as the priority
policy sorts the batch */
static int batch_before(const Core *c, int64_t a, int64_t b)
{
    if (c->prio[a] != c->prio[b])
        return c->prio[a] < c->prio[b];
    const int pa = c->chunked && c->in_pre[a], pb = c->chunked && c->in_pre[b];
    if (pa != pb)
        return pa < pb;
    return ranks_before(c, a, b);
}

/* sort ``v`` (n requests, distinct keys) by batch_before: a bottom-up merge sort through c->tmp */
static void sort_by_rank(const Core *c, int64_t *v, Py_ssize_t n)
{
    int64_t *src = v, *dst = c->tmp;
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            const Py_ssize_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi)
                dst[k++] = batch_before(c, src[b], src[a]) ? src[b++] : src[a++];
            while (a < mid)
                dst[k++] = src[a++];
            while (b < hi)
                dst[k++] = src[b++];
        }
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v)
        memcpy(v, src, n * sizeof(int64_t));
}

/* StaticScheduler._form_batch: with no batch running, waiting requests in queue order join one while a
seat is free, each reserving its prompt + output (its most KV tokens) at once; the first that does not fit
(blocks, or after the first a prompt past the token budget left) ends the formation */
static int form_batch(Core *c, double now)
{
    int64_t budget = c->max_batched;
    while (c->wq_len && c->nrun < c->max_seqs) {
        const int64_t r = wq_peek(c);
        if (c->nrun && c->prompt[r] > budget)
            break;
        const int64_t maxkv = c->prompt[r] + c->output[r] - 1;
        if (blocks_needed(c, r, maxkv) > c->free_blocks || !allocate(c, r, maxkv))
            break;
        wq_pop(c);
        c->stat[r] = ST_RUNNING;
        c->fsched[r] = now;
        c->int_zero[r] = (c->int_zero[r] & ~(int64_t)1) | (c->w->int_clock ? 1 : 0);
        c->running[c->nrun++] = r;
        if (mark(c, r, PH_PREFILL, now) < 0)
            return -1;
        budget -= c->prompt[r];
    }
    return 0;
}

/* StaticScheduler.schedule: the batch (formed first if none runs) computes its next tokens, every member in
running order, within the memory it reserved */
static int schedule_static(Core *c, double now)
{
    c->st_prefill = c->st_decode = c->st_preempted = c->st_swap_out = c->st_swap_in = 0;
    c->ne = 0;
    c->step_index++;
    if (!c->nrun && form_batch(c, now) < 0)
        return -1;
    for (Py_ssize_t j = 0; j < c->nrun; j++) {
        const int64_t r = c->running[j];
        const int64_t num_new = c->prompt[r] + c->gen[r] - c->comp[r];
        if (!allocate(c, r, num_new))
            return fail("static batching: a member outgrew its reserved memory", c->rid[r], num_new);
        add_planned(c, r, num_new);
    }
    return 0;
}

/* ContinuousScheduler.schedule under FCFS, round-robin or priority, without forks (StaticScheduler.schedule
under static batching) */
static int schedule(Core *c, double now)
{
    if (c->staticb)
        return schedule_static(c, now);
    c->st_prefill = c->st_decode = c->st_preempted = c->st_swap_out = c->st_swap_in = c->st_copy = 0;
    c->ne = 0;
    int64_t budget = c->max_batched;
    c->step_index++;
    if (c->ld_len && loads_ended(c, now) < 0)
        return -1;
    if (c->nstale)   /* (window pages a prefill chunk left behind: freed before any allocation) */
        free_stale(c);
    if (c->rr && c->nrun && (c->wq_len || c->ahead.len || c->nswapped) && rotate(c, now) < 0)
        return -1;
    const int64_t rotated = c->st_preempted;   /* (its preemptions do not hold back admissions) */
    const int64_t *order = c->running;
    const Py_ssize_t n = c->nrun;
    if (c->priority) {   /* best rank first (prefills after decodes of the same priority when chunked) */
        memcpy(c->order, c->running, n * sizeof(int64_t));
        sort_by_rank(c, c->order, n);
        order = c->order;
    } else if (c->chunked && c->n_prefilling) {   /* decodes first, then the prefills, each in running order */
        Py_ssize_t k = 0;
        for (Py_ssize_t j = 0; j < n; j++)
            if (!c->in_pre[c->running[j]])
                c->order[k++] = c->running[j];
        for (Py_ssize_t j = 0; j < n; j++)
            if (c->in_pre[c->running[j]])
                c->order[k++] = c->running[j];
        order = c->order;
    }
    int64_t num_decode = 0;
    const int64_t bs = c->bs;
    for (Py_ssize_t idx = 0; idx < n; idx++) {
        const int64_t r = order[idx];
        if (c->stat[r] != ST_RUNNING)
            continue;   /* preempted earlier in this step */
        const int64_t computed = c->comp[r];
        int64_t num_new = c->prompt[r] + c->gen[r] - computed;
        int64_t drafts = 0;
        if (c->spec.k && num_new == 1 && c->gen[r]) {   /* a decode proposes drafts (not past its output) */
            drafts = c->output[r] - c->gen[r] - 1;
            if (c->spec.k < drafts)
                drafts = c->spec.k;
            if (budget - 1 < drafts)
                drafts = budget - 1;
            if (drafts < 0)
                drafts = 0;
            num_new += drafts;
            if (drafts && allocate_drafts(c, r, num_new, drafts)) {   /* (else: the general path preempts) */
                add_verifying(c, r, num_new, drafts);
                budget -= num_new;
                continue;
            }
        }
        const int64_t w = c->nseq && c->gk[r] > 1 ? c->gk[r] : 1;   /* a forked request: all its sequences */
        if (num_new == 1 && budget > 0 && c->gen[r] && w == 1 && (computed % bs || allocate(c, r, 1))) {
            add_entry(c, r, 1);
            num_decode++;
            budget--;
            continue;
        }
        if (c->chunked && num_new * w > budget)
            num_new = budget / w;
        if (num_new <= 0 || num_new * w > budget)
            continue;
        /* (a decode with drafts is here only because its allocation above failed: preempt at once) */
        int ok = !drafts && allocate(c, r, num_new);
        while (!ok) {
            const int64_t victim = pick_victim(c, order, idx, n);
            if (preempt(c, victim, now, 0) < 0)
                return -1;
            if (victim == r)
                break;
            ok = allocate_drafts(c, r, num_new, drafts);
        }
        if (ok) {
            if (drafts)
                add_verifying(c, r, num_new, drafts);
            else
                add_planned(c, r, num_new);
            budget -= num_new * w;
        }
    }
    if (c->st_preempted) {   /* (order may be running itself: filter after the loop) */
        Py_ssize_t k = 0;
        for (Py_ssize_t j = 0; j < c->nrun; j++)
            if (c->stat[c->running[j]] == ST_RUNNING)
                c->running[k++] = c->running[j];
        c->nrun = k;
    }
    c->st_decode += num_decode;
    if (c->st_preempted == rotated) {
        if (c->nswapped && (budget = swap_in(c, now, budget)) < 0)
            return -1;
        if (!c->nswapped && (c->wq_len || c->ahead.len))
            return admit(c, now, budget, 0);
        if (c->ahead.len)   /* (requests queued ahead hold their blocks: they start even while swapped ones cannot return) */
            return admit(c, now, budget, 1);
    }
    return 0;
}

/* ------------------------------------------------------------------ pricing (CostModelExecutor.execute) */
/* the slot of ``key`` in ``t`` (grown as needed); *found says whether it holds a value already */
static double *terms_slot(Terms *t, int64_t key, int *found)
{
    if (t->n * 2 >= t->cap) {   /* grow (and rehash) */
        size_t cap = t->cap ? t->cap * 2 : 1024;
        int64_t *keys = malloc(cap * sizeof(int64_t));
        double *vals = malloc(cap * t->width * sizeof(double));
        if (!keys || !vals) {
            free(keys);
            free(vals);
            PyErr_NoMemory();
            return NULL;
        }
        for (size_t j = 0; j < cap; j++)
            keys[j] = -1;
        for (size_t j = 0; j < t->cap; j++) {
            if (t->keys[j] < 0)
                continue;
            size_t h = ((uint64_t)t->keys[j] * 0x9E3779B97F4A7C15ull) & (cap - 1);
            while (keys[h] >= 0)
                h = (h + 1) & (cap - 1);
            keys[h] = t->keys[j];
            memcpy(vals + h * t->width, t->vals + j * t->width, t->width * sizeof(double));
        }
        free(t->keys);
        free(t->vals);
        t->keys = keys;
        t->vals = vals;
        t->cap = cap;
    }
    size_t h = ((uint64_t)key * 0x9E3779B97F4A7C15ull) & (t->cap - 1);
    while (t->keys[h] >= 0 && t->keys[h] != key)
        h = (h + 1) & (t->cap - 1);
    *found = t->keys[h] == key;
    if (!*found) {
        t->keys[h] = key;
        t->n++;
    }
    return t->vals + h * t->width;
}

/* (GEMMs, all-reduces) over all layers on ``tokens`` tokens, in a graph or not: linear_fn's, once */
static const double *linear_terms(Core *c, int64_t tokens, int graph)
{
    int found;
    double *v = terms_slot(&c->lin, tokens * 2 + graph, &found);
    if (!v || found)
        return v;
    PyObject *res = PyObject_CallFunction(c->linear_fn, "LO", (long long)tokens, graph ? Py_True : Py_False);
    if (!res)
        return NULL;
    const int bad = read_doubles(res, v, 2, "the GEMM and all-reduce times");
    Py_DECREF(res);
    return bad < 0 ? NULL : v;
}

/* the LM head on ``seqs`` sampled tokens: head_fn's, once */
static int head_term(Core *c, int64_t seqs, double *out)
{
    int found;
    double *v = terms_slot(&c->head, seqs, &found);
    if (!v)
        return -1;
    if (!found) {
        PyObject *res = PyObject_CallFunction(c->head_fn, "L", (long long)seqs);
        if (!res)
            return -1;
        v[0] = PyFloat_AsDouble(res);
        Py_DECREF(res);
        if (v[0] == -1.0 && PyErr_Occurred())
            return -1;
    }
    *out = v[0];
    return 0;
}

/* CostModelExecutor._engine_fixed_terms: (linear, allreduce, elementwise, attention kernel cost, cpu) of a
step of ``tokens`` tokens and ``seqs`` sequences, its GEMMs on the padded batch inside a CUDA graph */
static int engine_fixed(Core *c, int64_t tokens, int64_t seqs, int has_prefill, double *t)
{
    const double *k = c->c;
    int64_t padded = tokens;
    int graph = 0, full = 0;
    if (tokens <= c->graph_max) {
        padded = c->pad[tokens];
        graph = 1;
        full = !has_prefill;
    }
    const double *lc = linear_terms(c, padded, graph);
    double head;
    if (!lc || head_term(c, seqs, &head) < 0)
        return -1;
    /* k[12..17]: fused_s_per_token, graph_kernel_s, elementwise_latency_s, cpu_step_s, cpu_seq_s, eager_op_s */
    const double k_elem = graph ? k[13] : k[14];
    const int64_t eager_ops = full ? 0 : (graph ? c->layers * c->attn_ops : c->eager_ops);   /* (eager_ops: all layers') */
    t[0] = lc[0] + head;
    t[1] = lc[1];
    t[2] = (double)c->layers * ((double)padded * k[12] + (double)c->n_fused * k_elem);
    t[3] = full ? k[13] : k[4];
    t[4] = k[15] + k[16] * (double)seqs + k[17] * (double)eager_ops;
    return 0;
}


/* Drafter.price: the GPU work of the step's k draft passes over ``seqs`` verifying sequences with ``drafts``
drafts in all, whose contexts (each with its last sampled token) sum to ``ctx0``: the first pass over the
verified tokens (CostModelExecutor.first_pass_s), the k - 1 others of one token a sequence (decode_work_s),
then an EAGLE head's extra GEMMs (Drafter.extra_s); the terms asked once a (seqs, drafts), the same float
operations in the same order */
static int draft_price(Core *c, int64_t seqs, int64_t drafts, int64_t ctx0, double *out)
{
    *out = 0.0;
    if (c->dr_mode < 0 || seqs == 0)
        return 0;
    int found;
    double *t = terms_slot(&c->dr_terms, (seqs << 32) | drafts, &found);
    if (!t)
        return -1;
    if (!found) {
        PyObject *res = PyObject_CallFunction(c->dr_terms_fn, "LL", (long long)seqs, (long long)drafts);
        if (!res)
            return -1;
        const int bad = read_doubles(res, t, c->dr_terms.width, "the drafter's size terms");
        Py_DECREF(res);
        if (bad < 0)
            return -1;
    }
    const double *k = c->dr_c, layers = (double)c->dr_layers, n = (double)seqs;
    const int64_t tokens = seqs + drafts;
    const double ctx_first = (double)(ctx0 + drafts), m = (double)tokens;
    double first, rest = 0.0;
    if (c->dr_mode == 0) {   /* k: fpp, attn_peak, kv_s, attn_bw, kernel_latency, attn_seq, elem_s, elem_fixed;
                                t: the first pass's (linear, allreduce), the others', extra */
        const double per_first = py_max(k[0] * ctx_first / k[1],
                                         k[2] * ctx_first + (double)(c->dr_new_bytes * tokens) / k[3]) + k[4];
        first = t[0] + t[1] + layers * (m * k[6] + k[7]) + layers * (per_first + n * k[5]);
        const double fixed = t[2] + t[3] + layers * (n * k[6] + k[7]);
        const double fresh = (double)(c->dr_new_bytes * seqs) / k[3];
        for (int64_t j = 1; j < c->spec.k; j++) {
            const double ctx = (double)(ctx0 + seqs * j);
            const double per_layer = py_max(k[0] * ctx / k[1], k[2] * ctx + fresh) + k[4];
            rest += fixed + layers * (per_layer + n * k[5]);
        }
    } else {   /* k: half, eng_kv_s, qo_s; t: the first pass's (linear, allreduce, elementwise, attention kernel
                  cost, cpu), the others', extra */
        first = t[0] + t[2] + t[1] + layers * ((ctx_first + n * k[0]) * k[1] + m * k[2] + t[3]);
        const double fixed = t[5] + t[7] + t[6];
        for (int64_t j = 1; j < c->spec.k; j++) {
            const double ctx = (double)(ctx0 + seqs * j);
            rest += fixed + layers * ((ctx + n * k[0]) * k[1] + n * k[2] + t[8]);
        }
    }
    *out = first + rest + t[c->dr_terms.width - 1];
    return 0;
}

/* the step's breakdown (BREAKDOWN_PARTS: linear, attention, elementwise, allreduce, swap, copy, overhead, and
draft where speculating; no copy-on-write without forks) */
static void set_breakdown(double *bd, double linear, double attention, double elementwise, double comm, double swap,
                          double copy, double overhead)
{
    bd[0] = linear;
    bd[1] = attention;
    bd[2] = elementwise;
    bd[3] = comm;
    bd[4] = swap;
    bd[5] = copy;
    bd[6] = overhead;
}

/* one layer's attention time of a step's prefills: ``n`` new tokens, their (query, key) ``pairs`` and the ``cached``
tokens they read (both step models: _operator_attention and _engine_attention) */
static inline double prefill_attention(const Core *c, int64_t n, int64_t pairs, int64_t cached)
{
    const double *k = c->c;
    return py_max(k[0] * (double)pairs / k[1], (double)(c->new_bytes * n) / k[2] + k[3] * (double)cached) + k[4];
}

/* _operator_attention's one layer of decodes: ``seqs`` of them (``drafts`` more queries) reading ``ctx`` keys */
static inline double decode_attention(const Core *c, int64_t ctx, int64_t seqs, int64_t drafts)
{
    const double *k = c->c;
    return py_max(k[11] * (double)ctx / k[1], k[12] * (double)ctx + (double)(c->dec_new_bytes * (seqs + drafts)) / k[2])
           + k[4];
}

/* _engine_attention's one layer of decodes, its paged kernel's launch ``k_attn`` included */
static inline double engine_decode_attention(const double *k, double k_attn, int64_t ctx, int64_t seqs, int64_t drafts)
{
    return ((double)ctx + (double)seqs * k[5]) * k[6] + (double)(seqs + drafts) * k[7] + k_attn;
}

/* CostModelExecutor.execute of the plan: the step's duration (``d``) and breakdown (``bdv``). A decode verifying
d drafts is a decode of 1 + d queries reading c + 1 + d tokens of KV, with a row of logits for each query; a
speculating engine's every step has a draft part, the drafter's passes (0.0 where none verifies). Where
not speculating, drafts and draft are 0 and every sum below is the one without them (x + 0.0 == x). */
static int price(Core *c)
{
    int64_t tokens = 0, seqs = 0, pairs = 0, pre_new = 0, pre_ctx = 0, dec_seqs = 0, dec_ctx = 0;
    int64_t drafts = 0, ver_seqs = 0, ver_ctx = 0;
    for (Py_ssize_t j = 0; j < c->ne; j++) {
        const int64_t n = c->e_new[j], ctx = c->e_ctx[j];
        tokens += n;
        seqs++;
        if (n == 1 && ctx > 0) {
            dec_seqs++;
            dec_ctx += ctx + 1;
        } else if (c->spec.k && c->e_draft[j]) {
            dec_seqs++;
            dec_ctx += ctx + n;
            drafts += n - 1;
            ver_seqs++;
            ver_ctx += ctx + 1;
        } else {
            pre_new += n;
            pre_ctx += ctx;
            pairs += n * ctx + n * (n + 1) / 2;
        }
    }
    int64_t w_dec = 0, w_pairs = 0, w_cached = 0;   /* what the local layers see (LocalAttention.step_stats) */
    for (Py_ssize_t j = 0; c->loc_layers && j < c->ne; j++) {
        const int64_t n = c->e_new[j], ctx = c->e_ctx[j], first = first_visible(c->loc_span, c->loc_chunked, ctx);
        if (n == 1 && ctx > 0) {
            w_dec += ctx + 1 - first;
        } else if (c->spec.k && c->e_draft[j]) {
            w_dec += ctx + n - first;
        } else {
            w_pairs += local_pairs(c->loc_span, c->loc_chunked, n, ctx);
            w_cached += ctx - first;
        }
    }
    const double full_layers = (double)(c->layers - c->loc_layers), loc_layers = (double)c->loc_layers;
    const double *k = c->c;
    double *bd = c->bdv;
    const double swap = (double)(c->st_swap_out + c->st_swap_in) * c->swap_s_per_block;
    const double copy = (double)c->st_copy * c->copy_s_per_block;   /* copy-on-write of forked sequences' blocks */
    double draft = 0.0, more_logits = 0.0;   /* the draft passes; the LM head's rows for the drafts */
    if (c->spec.k) {
        double h_all, h_seqs;
        if (draft_price(c, ver_seqs, drafts, ver_ctx, &draft) < 0)
            return -1;
        if (tokens && (head_term(c, seqs + drafts, &h_all) < 0 || head_term(c, seqs, &h_seqs) < 0))
            return -1;
        if (tokens)
            more_logits = h_all - h_seqs;
    }
    bd[7] = draft;
    if (c->engine && tokens) {
        /* k: fpp, attn_peak, attn_bw, kv_s, kernel_latency, half, eng_kv_s, qo_s, sampler, step_gap, overlap */
        double t[5];
        if (engine_fixed(c, tokens, seqs, pre_new > 0, t) < 0)
            return -1;
        const double linear = t[0] + more_logits, comm = t[1], elementwise = t[2], k_attn = t[3], cpu = t[4];
        double per_layer = 0.0, local = 0.0;   /* (_engine_attention: every layer's; the local layers') */
        if (pre_new)
            per_layer = per_layer + prefill_attention(c, pre_new, pairs, pre_ctx);
        if (dec_seqs)
            per_layer = per_layer + engine_decode_attention(k, k_attn, dec_ctx, dec_seqs, drafts);
        if (c->loc_layers) {
            if (pre_new)
                local = local + prefill_attention(c, pre_new, w_pairs, w_cached);
            if (dec_seqs)
                local = local + engine_decode_attention(k, k_attn, w_dec, dec_seqs, drafts);
        }
        const double attention = c->loc_layers ? full_layers * per_layer + loc_layers * local
                                               : (double)c->layers * per_layer;
        const double gpu = linear + attention + elementwise + comm + k[8] + draft;
        const double busy = k[10] != 0.0 ? py_max(gpu, cpu) : gpu + cpu;
        const double duration = busy + k[9] + swap + copy;
        set_breakdown(bd, linear, attention, elementwise, comm, swap, copy,
                      duration - (linear + attention + elementwise + comm + swap + copy + draft));
        c->d = duration;
        return 0;
    }
    /* k: fpp, attn_peak, attn_bw, kv_s, kernel_latency, attn_seq, attn_pre_seq, elem_s, elem_fixed, overhead,
       swap, then a decode's fpp and kv_s (k[11], k[12]: a prefill's and a decode's differ under latent attention) */
    double linear = 0.0, attention = 0.0, elementwise = 0.0, comm = 0.0;
    if (tokens) {
        const double *lc = linear_terms(c, tokens, 0);
        double head;
        if (!lc || head_term(c, seqs, &head) < 0)
            return -1;
        linear = lc[0] + head + more_logits;
        comm = lc[1];
        double per_layer = 0.0, local = 0.0;   /* (_operator_attention: every layer's; the local layers') */
        if (pre_new)
            per_layer = per_layer + prefill_attention(c, pre_new, pairs, pre_ctx);
        if (dec_seqs)
            per_layer = per_layer + decode_attention(c, dec_ctx, dec_seqs, drafts);
        if (!c->loc_layers) {
            attention = (double)c->layers * (per_layer + (double)dec_seqs * k[5] + (double)(seqs - dec_seqs) * k[6]);
        } else {
            if (pre_new)
                local = local + prefill_attention(c, pre_new, w_pairs, w_cached);
            if (dec_seqs)
                local = local + decode_attention(c, w_dec, dec_seqs, drafts);
            const double per_seq = (double)dec_seqs * k[5] + (double)(seqs - dec_seqs) * k[6];
            attention = full_layers * (per_layer + per_seq) + loc_layers * (local + per_seq);
        }
        elementwise = (double)c->layers * ((double)tokens * k[7] + k[8]);
    }
    const double overhead = c->engine ? k[18] : k[9];   /* (a step of no tokens in engine mode: swaps alone) */
    set_breakdown(bd, linear, attention, elementwise, comm, swap, copy, overhead);
    c->d = linear + attention + elementwise + comm + swap + copy + overhead + draft;
    return 0;
}

/* ------------------------------------------------------------------ the step's update */
static int update(Core *c, double now, int *progressed)
{
    const double step_start = now - c->d;
    int64_t regular = 0, computed = 0, sampled = 0;
    Py_ssize_t ndone = 0;
    int64_t n0 = 0;   /* the new tokens of the last request's own entry */
    for (Py_ssize_t j = 0; j < c->ne; j++) {
        const int64_t r = c->e_idx[j];
        if (c->nseq && c->e_sib[j]) {   /* a sibling sequence: the same new tokens as its request's entry */
            computed += n0;
            continue;
        }
        n0 = c->e_new[j];
        int64_t cc = c->comp[r] += c->e_new[j];
        computed += c->e_new[j];
        if (cc < c->prompt[r] + c->gen[r])
            continue;   /* a prefill chunk: no token sampled yet */
        int64_t accepted = 0;
        const int64_t drafts = c->spec.k ? c->e_draft[j] : 0;
        if (drafts) {   /* the accepted drafts and one token of the target's */
            accepted = speculate_accept(&c->spec, drafts);
            c->sp_drafted[r] += drafts;
            c->sp_accepted[r] += accepted;
            const int64_t rejected = drafts - accepted;
            if (rejected) {   /* their KV is discarded, their slots given back */
                cc = c->comp[r] -= rejected;
                computed -= rejected;
                if (c->tlen[r] * c->bs - cc >= c->bs)   /* (a whole block past the computed tokens) */
                    trim(c, r);
            }
        }
        const int64_t g = c->gen[r] += 1 + accepted;
        sampled += 1 + accepted;
        if (c->in_pre[r] && mark(c, r, PH_DECODE, now) < 0)
            return -1;
        if (g == 1) {
            c->ftok[r] = now;
        } else if (c->ltok[r] == step_start) {
            regular++;
        } else {
            const double gap = now - c->ltok[r];
            if (vec_push(&c->other, &gap) < 0)
                return -1;
        }
        c->ltok[r] = now;
        if (g >= c->output[r])
            c->done[ndone++] = r;
        else if (c->nseq && c->nseq[r] > 1 && c->gk[r] <= 1 && fork_group(c, r) < 0)
            return -1;   /* (its samples part after the prompt's first token) */
    }
    c->held += computed;
    c->sum_used += c->num_blocks - c->free_blocks;
    c->sum_logical += c->logical;
    if (regular && (vec_push(&c->gap_d, &c->d) < 0 || vec_push(&c->gap_n, &regular) < 0))
        return -1;
    for (Py_ssize_t j = 0; j < ndone; j++) {
        const int64_t r = c->done[j];
        c->stat[r] = ST_FINISHED;
        c->fin[r] = now;
        if (c->staticb) {   /* StaticScheduler._finish: idle with its memory until the batch ends */
            c->finished++;
            c->idle[c->nidle++] = r;
            if (mark(c, r, PH_IDLE, now) < 0)
                return -1;
            continue;
        }
        if (c->role == ROLE_PREFILL) {   /* the hand-off holds its blocks until its KV has crossed (disagg.py) */
            if (prefill_finished(c, r) < 0)
                return -1;
        } else {
            if (release(c, r) < 0)
                return -1;
            if (c->cache)
                close_request(c, r);
        }
        c->finished++;
        if (mark(c, r, PH_DONE, now) < 0)
            return -1;
    }
    if (ndone) {
        Py_ssize_t k = 0;
        for (Py_ssize_t j = 0; j < c->nrun; j++)
            if (c->stat[c->running[j]] != ST_FINISHED)
                c->running[k++] = c->running[j];
        c->nrun = k;
    }
    if (c->staticb && ndone && !c->nrun) {   /* the batch is over: everyone's memory is released */
        for (Py_ssize_t j = 0; j < c->nidle; j++) {
            if (release(c, c->idle[j]) < 0 || mark(c, c->idle[j], PH_DONE, now) < 0)
                return -1;
        }
        c->nidle = 0;
    }
    c->ndone = ndone;
    *progressed = sampled || ndone;
    return 0;
}

/* Engine._advanced: whether a scheduled request computed past its furthest computed token so far */
static int advanced(Core *c)
{
    int moved = 0;
    for (Py_ssize_t j = 0; j < c->ne; j++) {
        const int64_t r = c->e_idx[j], reached = c->e_ctx[j] + c->e_new[j];
        if (reached > c->furthest[r]) {
            c->furthest[r] = reached;
            moved = 1;
        }
    }
    return moved;
}

static int flush_rows(Core *c)
{
    if (!c->fill)
        return 0;
    PyObject *m = PyMemoryView_FromMemory((char *)c->main, MAIN_COLS * c->chunk * sizeof(double), PyBUF_READ);
    PyObject *b = m ? PyMemoryView_FromMemory((char *)c->bd, c->bd_cols * c->chunk * sizeof(double), PyBUF_READ) : NULL;
    PyObject *res = b ? PyObject_CallFunction(c->sink, "OOn", m, b, c->fill) : NULL;
    Py_XDECREF(m);
    Py_XDECREF(b);
    if (!res)
        return -1;
    Py_DECREF(res);
    c->fill = 0;
    return 0;
}

static int record(Core *c)
{
    const Py_ssize_t f = c->fill, w = c->chunk;
    const int64_t used = c->num_blocks - c->free_blocks, bs = c->bs;
    const int64_t states = c->held + c->npages * bs;   /* (window pages count whole as token states) */
    const double row[MAIN_COLS] = {
        c->start, c->d, (double)c->ne, (double)c->st_prefill, (double)c->st_decode, (double)c->nrun,
        (double)(c->wq_len + c->ahead.len - (c->num_swapped - c->nswapped) + c->ld_len), (double)c->num_swapped, (double)used, (double)c->st_preempted, (double)c->st_swap_out,
        (double)c->st_swap_in, (double)c->st_copy, (double)states,
        (double)(used * bs - states - c->beyond_final), (double)c->beyond_final,
        c->contig ? (double)((c->free_blocks - extents_largest(&c->ext)) * bs) : 0.0,
        (double)((c->contig ? extents_largest(&c->ext) : c->free_blocks) * bs)};
    for (int j = 0; j < MAIN_COLS; j++)
        c->main[j * w + f] = row[j];
    for (int j = 0; j < c->bd_cols; j++)
        c->bd[j * w + f] = c->bdv[j];
    c->fill = f + 1;
    c->steps++;
    if (c->fill == w && flush_rows(c) < 0)
        return -1;
    World *world = c->w;
    world->steps++;
    if (world->progress != Py_None && world->steps % world->progress_every == 0) {
        int64_t done = 0;   /* (disaggregated: where requests end: the decode pool, refused prefills, one token) */
        for (Py_ssize_t e = 0; e < world->M; e++)
            done += (world->engines[e].role == ROLE_PREFILL ? 0 : world->engines[e].finished)
                + world->engines[e].rejected;
        if (world->dg)
            done += world->dg->done_on_prefill;
        PyObject *res = PyObject_CallFunction(world->progress, "L", (long long)done);
        if (!res)
            return -1;
        Py_DECREF(res);
    }
    if ((world->steps & 8191) == 0 && PyErr_CheckSignals() < 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ integrity (check_integrity) */
/* whether request i is engine c's now: handed to it and, on a prefill engine, not yet handed on */
static inline int is_mine(const Core *c, Py_ssize_t i)
{
    if (c->mine[i] != c->index)
        return 0;
    return c->role != ROLE_PREFILL || c->w->dg->src[i] < 0 || c->w->dg->in_tx[i];
}

static int fail(const char *what, int64_t a, int64_t b)
{
    PyErr_Format(PyExc_AssertionError, "engine core: %s (%lld against %lld)", what, (long long)a, (long long)b);
    return -1;
}

/* With a prefix cache: each block's ref count is the tables holding it, the free queue holds exactly the
unreferenced blocks, a cached block is findable by its hash, the blocks' holders fill them alike;
``held`` becomes the slots of distinct blocks (SharingMixin._check_sharing) */
static int check_pool(Core *c, int64_t *held)
{
    const KvPool *p = &c->pool;
    const int64_t nb = c->num_blocks, bs = c->bs;
    int64_t *count = calloc(nb > 0 ? nb : 1, sizeof(int64_t)), *fill = malloc((nb > 0 ? nb : 1) * sizeof(int64_t));
    int8_t *queued = calloc(nb > 0 ? nb : 1, 1);
    int rc = -1;
    if (!count || !fill || !queued) {
        PyErr_NoMemory();
        goto out;
    }
    for (int64_t b = 0; b < nb; b++)
        fill[b] = -1;
    *held = 0;
    for (Py_ssize_t i = 0; i < c->N; i++) {
        if (!is_mine(c, i) || !c->tlen[i])
            continue;
        const int64_t seqs = c->nseq && c->gk[i] > 1 ? c->gk[i] : 1;
        for (int64_t kq = 0; kq < c->tlen[i] * seqs; kq++) {   /* every sequence's table */
            const int64_t k = kq % c->tlen[i], q = kq / c->tlen[i];
            const int64_t b = seq_table(c, i, q)[k], f0 = c->comp[i] - k * bs, f = f0 < 0 ? 0 : (f0 > bs ? bs : f0);
            count[b]++;
            if (fill[b] < 0) {
                fill[b] = f;
                *held += f;
            } else if (fill[b] != f) {
                fail("a block filled differently by its holders", b, f);
                goto out;
            }
        }
        for (int64_t j = c->wg ? c->wfirst[i] * c->wg : 0; c->wg && j < (c->wfirst[i] + c->whave[i]) * c->wg; j++)
            count[c->wpg[i][j]]++;   /* (its window's pages: one holder each) */
    }
    int64_t n = 0;
    for (int64_t b = p->head, prev = -1; b >= 0; prev = b, b = p->next[b]) {
        if (n++ > nb || p->prev[b] != prev || queued[b]) {
            fail("the free queue is not a list of distinct blocks", b, n);
            goto out;
        }
        queued[b] = 1;
    }
    if (n != p->num_free || p->num_free != c->free_blocks) {
        fail("the free queue's length is not the free blocks", n, c->free_blocks);
        goto out;
    }
    for (int64_t b = 0; b < nb; b++) {
        if (p->refs[b] != count[b]) {
            fail("a block's ref count is not the tables holding it", b, p->refs[b]);
            goto out;
        }
        if (queued[b] != (p->refs[b] == 0)) {
            fail("a block is free exactly when unreferenced, not", b, p->refs[b]);
            goto out;
        }
        if (p->cached[b] == KV_INDEXED && kvpool_find(p, p->hash_at[b]) != b) {
            fail("a cached block is not found by its hash", b, p->hash_at[b]);
            goto out;
        }
    }
    rc = 0;
out:
    free(count);
    free(fill);
    free(queued);
    return rc;
}

/* ExtentAllocator.check_integrity: the free extents are sorted, disjoint and not adjacent, add up to the free
blocks, and with the regions tile the space */
static int check_extents(Core *c)
{
    const int64_t nb = c->num_blocks;
    int8_t *seen = calloc(nb > 0 ? nb : 1, 1);
    if (!seen) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = -1;
    int64_t total = 0;
    const Extents *e = &c->ext;
    for (Py_ssize_t j = 0; j < e->n; j++) {
        if (e->len[j] < 1 || (j && e->start[j - 1] + e->len[j - 1] >= e->start[j])) {
            fail("free extents are not sorted, disjoint and merged", e->start[j], e->len[j]);
            goto out;
        }
        total += e->len[j];
    }
    if (total != c->free_blocks || total != e->num_free) {
        fail("the free extents are not the free blocks", total, c->free_blocks);
        goto out;
    }
    for (Py_ssize_t i = -1; i < c->N; i++) {   /* -1: the free extents; then each region */
        if (i >= 0 && (!is_mine(c, i) || !c->tlen[i]))
            continue;
        const Py_ssize_t parts = i < 0 ? e->n : 1;
        for (Py_ssize_t j = 0; j < parts; j++) {
            const int64_t start = i < 0 ? e->start[j] : c->rstart[i], n = i < 0 ? e->len[j] : c->tlen[i];
            if (start < 0 || start + n > nb) {
                fail("a run is outside the space", start, n);
                goto out;
            }
            for (int64_t b = start; b < start + n; b++)
                if (seen[b]++) {
                    fail("two runs share a block", b, start);
                    goto out;
                }
        }
    }
    for (int64_t b = 0; b < nb; b++)
        if (!seen[b]) {
            fail("a block is in no run", b, nb);
            goto out;
        }
    rc = 0;
out:
    free(seen);
    return rc;
}

/* the distinct window pages this engine's requests hold (prefix hits share them); -1 (MemoryError) on failure */
static int64_t distinct_pages(const Core *c)
{
    int8_t *seen = calloc((size_t)c->num_blocks, 1);
    if (!seen) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t n = 0;
    for (Py_ssize_t i = 0; i < c->N; i++) {
        if (!is_mine(c, i) || !c->whave[i])
            continue;
        for (int64_t j = c->wfirst[i] * c->wg; j < (c->wfirst[i] + c->whave[i]) * c->wg; j++) {
            n += !seen[c->wpg[i][j]];
            seen[c->wpg[i][j]] = 1;
        }
    }
    free(seen);
    return n;
}

/* The invariants KVCacheManager.check_integrity and ContinuousScheduler.check_integrity assert, on the
core's counters: blocks held add up, slots add up to the capacity, each running request's table covers
exactly its computed tokens, nobody else holds a block. */
static int check_integrity(Core *c)
{
    int64_t tables = 0, phys = 0, held = 0, beyond = 0, pre = 0, idle = 0, sibs = 0, pages = 0;
    const int64_t bs = c->bs;
    if (c->host.cap && hostlru_check(&c->host) < 0)
        return -1;
    for (Py_ssize_t j = 0; j < c->nrun; j++) {
        const int64_t r = c->running[j];
        if (c->stat[r] != ST_RUNNING)
            return fail("a request in running is not running", c->rid[r], c->stat[r]);
        if (c->comp[r] > c->prompt[r] + c->gen[r])
            return fail("a request computed past its tokens", c->comp[r], c->prompt[r] + c->gen[r]);
        if (!c->staticb && !c->contig && c->tlen[r] != (c->comp[r] + bs - 1) / bs)
            return fail("a running request's blocks do not cover its computed tokens", c->tlen[r], c->comp[r]);
        pre += c->in_pre[r];
    }
    for (Py_ssize_t i = 0; i < c->N; i++) {
        if (!is_mine(c, i))
            continue;
        const int64_t k = c->nseq && c->gk[i] > 1 ? c->gk[i] : 1, t = c->tlen[i];
        if (k > 1) {   /* a forked request: its sequences share the first gcom blocks */
            if (c->gk[i] != c->nseq[i] || c->gcom[i] > t || c->stat[i] != ST_RUNNING)
                return fail("a forked request's sequences are not its samples, running, sharing its blocks",
                            c->rid[i], c->gcom[i]);
            if (c->gpriv[i] && c->gcom[i] >= t)
                return fail("a forked request's last block is shared though marked its sequences' own", c->rid[i], t);
            for (int64_t q = 1; c->cache && q < k; q++)
                for (int64_t b = 0; b < t; b++)
                    if ((seq_table(c, i, q)[b] == c->tbl[i][b]) != (b < c->gcom[i]))
                        return fail("a forked request's sequences share other blocks than their first gcom", c->rid[i], b);
            held += (k - 1) * filled(c, i, c->gcom[i], t);
            sibs += k - 1;
        } else if (c->nseq && (c->gcom[i] || c->gsib[i] || c->gpriv[i])) {
            return fail("a request not forked keeps a fork's state", c->rid[i], c->gcom[i]);
        }
        tables += k * t;
        phys += t + (k - 1) * (k > 1 ? t - c->gcom[i] : 0);
        beyond += c->beyond[i];
        if (c->tlen[i]) {
            /* (besides running ones: a static batch's idle members; requests holding a prefix loaded, or
            being loaded, from the host tier, waiting for their compute) */
            /* (disaggregated: a prefill's blocks held while its KV crosses; a decode engine's booked for it) */
            const int handing = c->w->dg && (c->w->dg->in_tx[i] || c->w->dg->booked[i]);
            if (c->stat[i] != ST_RUNNING && !(c->staticb && c->stat[i] == ST_FINISHED)
                && !(c->host.cap && (c->stat[i] == ST_WAITING || c->stat[i] == ST_PREEMPTED)) && !handing)
                return fail("a request that is not running holds blocks", c->rid[i], c->tlen[i]);
            idle += c->stat[i] == ST_FINISHED && !handing;
            held += c->comp[i] < c->tlen[i] * bs ? c->comp[i] : c->tlen[i] * bs;
        }
        if (c->wg && c->whave[i]) {   /* window pages: a whole number of logical blocks, ending at its table's */
            if (c->wfirst[i] + c->whave[i] != t || c->wfirst[i] < 0)
                return fail("a request's window pages do not end at its table's last block", c->rid[i], c->wfirst[i]);
            tables += c->wg * c->whave[i];
            phys += c->wg * c->whave[i];
            pages += c->wg * c->whave[i];
        }
    }
    if (c->cache && c->wg && (pages = distinct_pages(c)) < 0)
        return -1;
    if (pages != c->npages)
        return fail("window pages miscounted", c->npages, pages);
    if (c->contig && check_extents(c) < 0)
        return -1;
    if (c->cache) {
        if (check_pool(c, &held) < 0)
            return -1;
    } else if (c->free_blocks < 0 || c->free_blocks + phys != c->num_blocks) {
        return fail("free + held blocks is not the pool", c->free_blocks + phys, c->num_blocks);
    }
    if (tables != c->logical)
        return fail("logical blocks differ from the tables", c->logical, tables);
    if (sibs != c->sib_total || c->e_base + sibs > c->e_cap)
        return fail("forked requests' siblings miscounted, or the plan has no room for them", c->sib_total, sibs);
    if (idle != c->nidle)
        return fail("finished requests holding blocks are not the idle members of the batch", idle, c->nidle);
    if (held != c->held)
        return fail("held slots differ from the computed tokens", c->held, held);
    if (beyond != c->beyond_final)
        return fail("slots beyond final lengths differ", c->beyond_final, beyond);
    const int64_t reserved = (c->num_blocks - c->free_blocks) * bs - c->held - c->npages * bs - c->beyond_final;
    if (reserved < 0 || c->held < 0 || c->beyond_final < 0)
        return fail("a negative slot count", reserved, c->beyond_final);
    if (pre != c->n_prefilling)
        return fail("prefilling requests miscounted", c->n_prefilling, pre);
    int64_t cpu = 0, swapped = 0;
    for (Py_ssize_t i = 0; i < c->N; i++) {
        if (!is_mine(c, i) || c->stat[i] != ST_SWAPPED)
            continue;
        if (c->tlen[i] || !c->cpu_held[i])
            return fail("a swapped request is not held on the CPU alone", c->rid[i], c->cpu_held[i]);
        cpu += c->cpu_held[i];
        swapped++;
    }
    if (swapped != c->num_swapped)
        return fail("swapped requests miscounted", c->num_swapped, swapped);
    if (c->cpu_free < 0 || c->cpu_free + cpu != c->cpu_blocks)
        return fail("free + held CPU blocks is not the swap space", c->cpu_free + cpu, c->cpu_blocks);
    return 0;
}

/* ------------------------------------------------------------------ the processes */
/* an event at t; ``delayed``: a timeout (a float delay: its time is a float even from the int 0) */
static void schedule_event(World *w, Event *ev, double t, int prio, int delayed)
{
    ev->t = t;
    ev->prio = prio;
    ev->eid = w->eid++;
    ev->active = 1;
    ev->at_int = w->int_clock && !delayed;
}

static void trigger_wake(Core *c)
{
    if (c->e_wakes) {
        c->e_wakes = 0;
        schedule_event(c->w, &c->ev_e, c->w->now, NORMAL, 0);
    }
}

/* Replica.load: requests handed over (or routed here, their KV on its way), less those finished or rejected */
static inline int64_t load_of(const Core *c)
{
    return c->submitted + c->incoming - (c->finished + c->rejected);
}

/* routers.least_loaded's order: the least load, then the fewest submitted (a tie keeps the lower index) */
static inline int less_loaded(const Core *c, const Core *o)
{
    const int64_t lc = load_of(c), lo = load_of(o);
    return lc < lo || (lc == lo && c->submitted < o->submitted);
}

/* the choice of a router whose rule is applied here (RULE_*), in sim/cluster/routers.py's terms */
/* PrefixAffinity's hits: the leading blocks of request g's prompt (at most (prompt - 1) // bs) engine e's
prefix cache holds (only its shareable ones can be there: g has not run yet) */
static int64_t cached_prefix(const Core *e, Py_ssize_t g)
{
    const int64_t most = (e->prompt[g] - 1) / e->bs, n = e->hs[g] < most ? e->hs[g] : most;
    const int64_t *h = e->hbuf[g].buf;
    int64_t k = 0;
    while (k < n && kvpool_find(&e->pool, h[k]) >= 0)
        k++;
    return k;
}

/* the engine (a position among engines[first .. first + count)) the router's rule chooses for request g; -1 on
an error (set); PAIR and FOLLOW read the choices drawn ahead (the arrival process's router only) */
static Py_ssize_t rule_choice(World *w, int rule, int64_t slack, Py_ssize_t first, Py_ssize_t count, Py_ssize_t g)
{
    Core *E = w->engines + first;
    if (rule == RULE_PAIR) {
        const int64_t a = w->pairs[2 * g], b = w->pairs[2 * g + 1];
        return less_loaded(&E[b], &E[a]) ? b : a;
    }
    if (rule == RULE_FOLLOW && w->pairs[g] >= 0)
        return w->dest[w->pairs[g]];
    if (rule == RULE_LEAST_LOAD || rule == RULE_FOLLOW) {
        Py_ssize_t best = 0;
        for (Py_ssize_t e = 1; e < count; e++)
            if (less_loaded(&E[e], &E[best]))
                best = e;
        return best;
    }
    if (rule == RULE_LEAST_KV) {   /* the fewest blocks in use (one block count for all), then the load */
        Py_ssize_t best = 0;
        for (Py_ssize_t e = 1; e < count; e++) {
            const int64_t ue = E[e].num_blocks - E[e].free_blocks, ub = E[best].num_blocks - E[best].free_blocks;
            if (ue < ub || (ue == ub && load_of(&E[e]) < load_of(&E[best])))
                best = e;
        }
        return best;
    }
    /* RULE_AFFINITY: the engines within the slack of the least load; of those the least loaded (and fewest
    submitted, for a prompt of at most one block or one engine), else the most blocks of the prompt cached
    (over prefix caches), then the load, then the index */
    int64_t low = load_of(&E[0]);
    for (Py_ssize_t e = 1; e < count; e++)
        if (load_of(&E[e]) < low)
            low = load_of(&E[e]);
    const int64_t floor = low + slack;
    Py_ssize_t among = 0, best = -1;
    for (Py_ssize_t e = 0; e < count; e++)
        if (load_of(&E[e]) <= floor)
            among++;
    const int by_submitted = (w->prompt[g] - 1) / E[0].bs <= 0 || among == 1;
    if (!by_submitted && E[0].cache && fetch_hashes(&E[0], g) < 0)   /* over prefix caches: hits first */
        return -1;
    int64_t best_hits = 0;
    for (Py_ssize_t e = 0; e < count; e++) {
        const int64_t le = load_of(&E[e]);
        if (le > floor)
            continue;
        const int64_t hits = !by_submitted && E[e].cache ? cached_prefix(&E[e], g) : 0;
        if (best < 0 || (by_submitted ? less_loaded(&E[e], &E[best])
                         : hits > best_hits || (hits == best_hits && le < load_of(&E[best])))) {
            best = e;
            best_hits = hits;
        }
    }
    return best;
}

/* ``route(g)``, a router's choice among engines[first .. first + count) as of now: ``state`` holds each one's
handed over, finished or rejected, blocks in use and routed there with their KV on its way (ReplicaState);
the position chosen, or -1 on an error (set) */
static Py_ssize_t call_router(World *w, PyObject *route, int64_t *state, Py_ssize_t first, Py_ssize_t count,
                              int64_t g)
{
    for (Py_ssize_t j = 0; j < count; j++) {
        const Core *c = &w->engines[first + j];
        state[4 * j] = c->submitted;
        state[4 * j + 1] = c->finished + c->rejected;
        state[4 * j + 2] = c->num_blocks - c->free_blocks;
        state[4 * j + 3] = c->incoming;
    }
    PyObject *res = PyObject_CallFunction(route, "L", (long long)g);
    if (!res)
        return -1;
    const long j = PyLong_AsLong(res);
    Py_DECREF(res);
    if (j == -1 && PyErr_Occurred())
        return -1;
    if (j < 0 || j >= count) {
        PyErr_Format(PyExc_ValueError, "run_core: the router chose replica %ld of %zd", j, count);
        return -1;
    }
    return j;
}

/* a router that reads the replicas chooses request g's engine: by its rule, or called with ``state`` as of
now (Replica.load: handed over less finished or rejected; Replica.kv_usage: blocks in use) */
static int route(World *w, Py_ssize_t g)
{
    if (w->rule != RULE_CALL) {
        const Py_ssize_t e = rule_choice(w, w->rule, w->slack, 0, w->mr, g);
        if (e < 0)
            return -1;
        w->dest[g] = e;
        return 0;
    }
    const Py_ssize_t e = call_router(w, w->route, w->state, 0, w->mr, g);
    if (e < 0)
        return -1;
    w->dest[g] = e;
    return 0;
}

/* Engine.submit: request g reaches its engine (chosen now by the router, where it reads the engines) */
static int hand_over(World *w, Py_ssize_t g)
{
    if (w->route != Py_None && route(w, g) < 0)
        return -1;
    Core *c = &w->engines[w->dest[g]];
    c->submitted++;
    if (c->staging && c->busy) {
        c->staged[c->nstaged] = g;
        c->staged_t[c->nstaged++] = w->now;
        return 0;
    }
    const int q = add_request(c, g, w->now);
    if (q < 0)
        return -1;
    if (q)
        trigger_wake(c);
    return 0;
}

/* Engine.end_arrivals on every engine the arrival process feeds (a disaggregated decode pool's come with
the last transfer: decode_arrivals_end): no more requests will come */
static void end_arrivals(World *w)
{
    w->arrivals_done = 1;
    for (Py_ssize_t e = 0; e < w->mr; e++) {
        w->engines[e].arrivals_over = 1;
        trigger_wake(&w->engines[e]);
    }
}

/* the arrival process (Engine._arrivals; a cluster's _arrivals_ahead) from where it waits (its start, or
the timeout of request ai): hands each request to its engine (Engine.submit), then ends the arrivals */
static int arrivals_resume(World *w)
{
    w->ev_a.active = 0;
    for (;;) {
        if (w->a_holds) {
            w->a_holds = 0;
            if (hand_over(w, w->ai++) < 0)
                return -1;
        }
        if (w->ai == w->N) {
            end_arrivals(w);
            return 0;
        }
        const double delay = w->arrival[w->ai] + w->lag - w->now;
        w->a_holds = 1;
        if (delay > 0) {
            schedule_event(w, &w->ev_a, w->now + delay, NORMAL, 1);
            return 0;
        }
    }
}

/* ------------------------------------------------------------------ disaggregated prefill/decode (Disagg) */
/* Engine.end_arrivals on every decode engine (Handoff.close_after) */
static void decode_arrivals_end(World *w)
{
    for (Py_ssize_t e = w->dg->mp; e < w->M; e++) {
        w->engines[e].arrivals_over = 1;
        trigger_wake(&w->engines[e]);
    }
}

/* a prefill engine's loop has ended: once every one has and no transfer is in flight, the decode engines are
told that no more requests will come (Handoff.close_after) */
static int prefill_stopped(World *w)
{
    Disagg *dg = w->dg;
    if (dg && --dg->prefill_running == 0 && dg->in_flight == 0)
        decode_arrivals_end(w);
    return 0;
}

/* the decode pool's router chooses request g's decode engine (Handoff's router.choose over the decode
replicas as of now: handed over, routed here with their KV on its way, finished or rejected, blocks used;
by its rule where it has one that reads no order of calls); its world index, or -1 on an error (set) */
static Py_ssize_t route_decode(World *w, int64_t g)
{
    Disagg *dg = w->dg;
    const Py_ssize_t j = dg->rule != RULE_CALL ? rule_choice(w, dg->rule, dg->slack, dg->mp, w->M - dg->mp, g)
                                               : call_router(w, dg->route, dg->state, dg->mp, w->M - dg->mp, g);
    return j < 0 ? -1 : dg->mp + j;
}

/* Handoff._hand_over: request g reaches decode engine D (``booked``: its received KV is booked there) */
static int decode_hand_over(World *w, int64_t g, Core *D, int booked)
{
    Disagg *dg = w->dg;
    dg->kv_received[g] = 1;
    if (!booked)
        dg->noted[g] = 1;
    D->submitted++;
    if (D->staging && D->busy) {
        D->staged[D->nstaged] = g;
        D->staged_t[D->nstaged++] = w->now;
    } else {
        const int q = add_request(D, g, w->now);
        if (q < 0)
            return -1;
        if (q)
            trigger_wake(D);
    }
    if (--dg->in_flight == 0 && dg->prefill_running == 0)
        decode_arrivals_end(w);
    return 0;
}

/* env.process(a transfer of request g): its start is URGENT, now */
static int start_transfer(World *w, int64_t g)
{
    return txheap_push(&w->dg->ev, (TxEvent){w->now, URGENT, w->eid++, g, TX_START});
}

/* Handoff._reserve: the requests routed to decode engine D take their blocks there (prompt and next token),
oldest first, while nothing of its own waits (waiting, queued ahead or swapped) and a seat is free for each
(running, and those whose KV is on its way); one it would reject reserves nothing; each one's transfer
starts */
static int reserve(World *w, Core *D)
{
    Disagg *dg = w->dg;
    while (D->pullq.len) {
        const int64_t g = D->pullq.head;
        if (D->wq_len || D->ahead.len || D->nswapped || D->nrun + D->reserved >= D->max_seqs)
            return 0;
        const int book = D->accepted[g] != 0;
        if (book) {
            if (open_request(D, g) < 0)
                return -1;
            if (!allocate(D, g, 1))
                return 0;
            D->held += D->comp[g];   /* note_computed: the prompt's KV is written there (pulled) */
            D->sum_used += D->num_blocks - D->free_blocks;
            D->sum_logical += D->logical;
            D->reserved++;
        }
        dg->booked[g] = (int8_t)book;
        fifo_pop(&D->pullq, dg->next_pull);
        if (start_transfer(w, g) < 0)
            return -1;
    }
    return 0;
}

/* the prefill manager's free of request g, deferred (Handoff.attach_prefill): one output token is done
here; else its blocks stay held, and pull: its decode engine is chosen now and books its blocks; push: its
KV leaves now */
static int prefill_finished(Core *P, int64_t g)
{
    World *w = P->w;
    Disagg *dg = w->dg;
    dg->cached[g] = P->ncached[g];
    if (dg->out_full[g] <= 1) {   /* nothing to decode */
        dg->done_on_prefill++;
        if (release(P, g) < 0)
            return -1;
        if (P->cache)
            close_request(P, g);
        return 0;
    }
    dg->in_flight++;
    dg->in_tx[g] = 1;
    dg->src[g] = P->index;
    dg->prefill_end[g] = w->now;
    if (!dg->pull)
        return start_transfer(w, g);
    const Py_ssize_t e = route_decode(w, g);
    if (e < 0)
        return -1;
    Core *D = &w->engines[e];
    P->dst[g] = e;
    D->incoming++;
    fifo_push(&D->pullq, dg->next_pull, g);
    return reserve(w, D);
}

/* the KV of request g has landed (KVLink.send has returned): the prefill side lets go of its blocks (and its
engine wakes), then the request goes to its decode engine: the one that booked its blocks (pull), or the
one the router chooses now (push) */
static int landed(World *w, int64_t g)
{
    Disagg *dg = w->dg;
    Core *P = &w->engines[dg->src[g]];
    dg->bytes_sent += dg->kv_bytes * P->prompt[g];
    if (release(P, g) < 0)
        return -1;
    if (P->cache)
        close_request(P, g);
    dg->in_tx[g] = 0;
    trigger_wake(P);
    dg->tx_s[g] = w->now - dg->tx_start[g];
    if (dg->pull) {
        Core *D = &w->engines[P->dst[g]];
        D->incoming--;
        const int booked = dg->booked[g];
        if (booked) {   /* it holds its blocks: queued ahead of everything */
            D->reserved--;
            dg->ahead_flag[g] = 1;
        }
        if (decode_hand_over(w, g, D, booked) < 0)
            return -1;
        return D->pullq.len ? reserve(w, D) : 0;
    }
    const Py_ssize_t e = route_decode(w, g);
    if (e < 0)
        return -1;
    P->dst[g] = e;
    return decode_hand_over(w, g, &w->engines[e], 0);
}

/* BaseResource._trigger_put: the link, free, goes to the first transfer waiting for it (its grant, an event) */
static int link_grant(World *w)
{
    Disagg *dg = w->dg;
    if (dg->link_busy || !dg->link_q.len)
        return 0;
    const int64_t g = fifo_pop(&dg->link_q, dg->next_link);
    dg->link_busy = 1;
    return txheap_push(&dg->ev, (TxEvent){w->now, NORMAL, w->eid++, g, TX_GRANT});
}

/* a transfer's event, due now (handoff.h's kinds; KVLink.send) */
static int transfer_event(World *w, TxEvent x)
{
    Disagg *dg = w->dg;
    const int64_t g = x.g;
    if (x.kind == TX_RELEASE)   /* the release is processed: the next waiting is granted */
        return link_grant(w);
    if (x.kind == TX_LAND)
        return landed(w, g);
    const double nbytes = (double)(dg->kv_bytes * w->engines[0].prompt[g]);
    if (x.kind == TX_START) {   /* Handoff._send: the transfer starts now and asks for the link */
        dg->tx_start[g] = w->now;
        fifo_push(&dg->link_q, dg->next_link, g);
        return link_grant(w);
    }
    if (x.kind == TX_GRANT) {   /* the wire time: layer by layer, the time the link stood idle since the prefill's
                                   first step (or the last transfer) counts as sent, down to the last layer's */
        const double full = nbytes / dg->bw;
        double wire = full;
        const Core *P = &w->engines[dg->src[g]];
        if (dg->layers && !P->npre[g] && w->now == dg->tx_start[g]) {
            const double ahead = dg->tx_start[g] - py_max(P->fsched[g], dg->idle_since);
            wire = py_max(full - py_max(ahead, 0.0), nbytes / (double)dg->layers / dg->bw);
        }
        return txheap_push(&dg->ev, (TxEvent){w->now + wire, NORMAL, w->eid++, g, TX_WIRE});
    }
    /* TX_WIRE: the bytes have left; the link is released (an event), then the latency */
    dg->busy_s += nbytes / dg->bw;
    dg->idle_since = w->now;
    dg->link_busy = 0;
    if (txheap_push(&dg->ev, (TxEvent){w->now, NORMAL, w->eid++, -1, TX_RELEASE}) < 0)
        return -1;
    if (dg->latency > 0)
        return txheap_push(&dg->ev, (TxEvent){w->now + dg->latency, NORMAL, w->eid++, g, TX_LAND});
    return landed(w, g);
}

/* ------------------------------------------------------------------ a client (sim/clients.py, client.h) */
/* ClientPool._end_if_sent: every request sent and handed over ends the arrivals (once) */
static void client_end_if_sent(World *w)
{
    if (w->client->all_sent && w->client->in_transit == 0 && !w->arrivals_done)
        end_arrivals(w);
}

/* ClientPool._answered: the client has request r's whole response at ``at`` (>= now); its slot is free a pause
later (a sample sent with others: once the last of theirs is in too) */
static int client_answered(World *w, int64_t r, double at)
{
    Client *cl = w->client;
    if (cl->lead && cl->due[cl->lead[r]] > 0) {
        const int64_t f = cl->lead[r];
        cl->due_at[f] = py_max(cl->due_at[f], at);
        if (--cl->due[f])
            return 0;
        at = cl->due_at[f];
    }
    const double delay = py_max(at + client_next_pause(cl) - w->now, 0.0);
    return client_push(cl, w->now + delay, w->eid++, CLIENT_RELEASE);
}

/* ClientPool._collect: the responses engine c's last step finished, in finish order */
static int client_collect(Core *c)
{
    const Client *cl = c->w->client;
    for (Py_ssize_t j = 0; j < c->ndone; j++) {
        const int64_t r = c->done[j];
        if (c->role == ROLE_PREFILL && c->w->dg->out_full[r] > 1)
            continue;   /* (its response goes on from a decode engine) */
        const int64_t more = c->output[r] - 1 > 0 ? c->output[r] - 1 : 0;
        if (client_answered(c->w, r, c->fin[r] + cl->output_s + cl->token_s * (double)more) < 0)
            return -1;
    }
    return 0;
}

/* ClientPool._send from where it waits (its start, a free slot, or request ai's arrival): sends each request
in order once fewer than its limit are in flight and it has arrived; it reaches the engines the input
latency (``lag``) later */
static int sender_resume(World *w)
{
    Client *cl = w->client;
    w->ev_a.active = 0;
    for (;;) {
        if (w->a_holds) {   /* its arrival has come: sent now (a batch of samples: all of them) */
            w->a_holds = 0;
            const Py_ssize_t g = w->ai;
            Py_ssize_t end = g + 1;
            while (cl->lead && end < w->N && cl->lead[end] == g)
                end++;
            cl->in_flight++;
            if (end - g > 1) {
                cl->due[g] = end - g;
                cl->due_at[g] = 0.0;
            }
            for (Py_ssize_t h = g; h < end; h++) {
                w->arrival[h] = w->now;
                cl->in_transit++;
                if (client_push(cl, w->now + w->lag, w->eid++, h) < 0)
                    return -1;
            }
            w->ai = end;
        }
        if (w->ai == w->N) {
            cl->all_sent = 1;
            client_end_if_sent(w);
            return 0;
        }
        if (cl->in_flight >= cl->limit[w->ai]) {   /* on to a slot's release */
            cl->waits_slot = 1;
            return 0;
        }
        const double wait = w->arrival[w->ai] - w->now;
        w->a_holds = 1;
        if (wait > 0) {
            schedule_event(w, &w->ev_a, w->now + wait, NORMAL, 1);
            return 0;
        }
    }
}

/* the client's earliest timeout, due now: a hand-over (ClientPool._hand_over) or a release (_release) */
static int client_timeout(World *w)
{
    Client *cl = w->client;
    const Timeout x = client_pop(cl);
    if (x.what == CLIENT_RELEASE) {
        cl->in_flight--;
        if (cl->waits_slot) {   /* the sender's slot event, triggered now */
            cl->waits_slot = 0;
            schedule_event(w, &w->ev_a, w->now, NORMAL, 0);
        }
        return 0;
    }
    cl->in_transit--;
    if (hand_over(w, x.what) < 0)
        return -1;
    client_end_if_sent(w);
    return 0;
}

static int has_work(Core *c)
{
    return c->nrun > 0 || c->wq_len > 0 || c->ahead.len > 0 || c->nswapped > 0 || c->ld_len > 0;
}

/* Engine._loop (one timeout a step) from where it waits */
static int engine_resume(Core *c)
{
    World *w = c->w;
    c->ev_e.active = 0;
    if (c->e_state == 2) {   /* the step has run: update and record it */
        c->busy = 0;
        int progressed;
        if (update(c, c->end, &progressed) < 0 || record(c) < 0 || (c->check && check_integrity(c) < 0)
            || (w->client && client_collect(c) < 0))
            return -1;
        if (c->pullq.len && reserve(w, c) < 0)   /* (a decode engine's on_step: its queue for blocks goes on) */
            return -1;
        c->stall = (progressed || advanced(c)) ? 0 : c->stall + 1;
        if (c->stall >= c->max_stall) {
            c->err = ERR_LIVELOCK;
            c->err_stall = c->stall;
            c->err_t = w->now;
            c->err_waiting = c->wq_len + c->ahead.len - (c->num_swapped - c->nswapped) + c->ld_len;
            c->err_running = c->nrun;
            return 0;
        }
    }
    for (;;) {
        if (c->nstaged && !has_work(c) && admit_staged(c) < 0)
            return -1;
        if (!has_work(c)) {
            if (c->arrivals_over)
                return c->role == ROLE_PREFILL ? prefill_stopped(w) : 0;   /* the engine stops */
            c->e_wakes = 1;
            c->e_state = 1;
            return 0;
        }
        c->start = w->now;
        if (schedule(c, c->start) < 0)
            return -1;
        const int arrived = c->nstaged > 0;
        if (arrived && admit_staged(c) < 0)
            return -1;
        const int empty = c->ne == 0 && !c->st_swap_out && !c->st_swap_in;   /* (StepPlan.is_empty) */
        if (empty && c->ld_len) {   /* requests wait for loads from the host tier */
            if (c->st_preempted || arrived)   /* made room, or requests came: plan again now */
                continue;
            if (!c->ev_l.active)
                schedule_event(w, &c->ev_l, w->now + (c->ld_ready[c->ld_head] - w->now), NORMAL, 1);
            c->e_wakes = 1;   /* on to the first one's end, or an arrival */
            c->e_state = 1;
            return 0;
        }
        if (empty && c->nhw) {   /* blocks held by loaded prefixes: freed */
            const Py_ssize_t freed = release_held(c);
            if (freed < 0)
                return -1;
            if (freed)
                continue;
        }
        if (empty && c->may_block) {   /* blocks held by KV transfers: a wake when they are freed */
            if (c->st_preempted || arrived)   /* made room, or requests came: plan again now */
                continue;
            c->e_wakes = 1;
            c->e_state = 1;
            return 0;
        }
        if (empty) {
            c->err = ERR_DEADLOCK;
            c->err_t = c->start;
            c->err_waiting = c->wq_len + c->ahead.len - (c->num_swapped - c->nswapped) + c->ld_len;
            c->err_running = c->nrun;
            return 0;
        }
        if (price(c) < 0)
            return -1;
        if (!(c->d > 0)) {
            c->err = ERR_DURATION;
            c->err_step = c->steps;
            c->err_d = c->d;
            return 0;
        }
        c->end = c->start + c->d;
        c->busy = 1;
        c->waits++;
        schedule_event(w, &c->ev_e, w->now + c->d, NORMAL, 1);
        c->e_state = 2;
        return 0;
    }
}

static int before(const Event *a, const Event *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->prio != b->prio)
        return a->prio < b->prio;
    return a->eid < b->eid;
}

/* SimPy's event loop over the processes' pending events (at most one each) */
static int run(World *w)
{
    w->int_clock = 1;
    schedule_event(w, &w->ev_a, 0.0, URGENT, 0);   /* the arrival process (or sender) starts first, then each engine loop */
    for (Py_ssize_t e = 0; e < w->M; e++)
        schedule_event(w, &w->engines[e].ev_e, 0.0, URGENT, 0);
    for (;;) {
        const Event *next = w->ev_a.active ? &w->ev_a : NULL;
        Core *who = NULL;
        for (Py_ssize_t e = 0; e < w->M; e++) {
            Core *c = &w->engines[e];
            if (c->ev_e.active && (!next || before(&c->ev_e, next))) {
                next = &c->ev_e;
                who = c;
            }
            if (c->ev_l.active && (!next || before(&c->ev_l, next))) {
                next = &c->ev_l;
                who = c;
            }
        }
        Event due;   /* the client's earliest timeout, as an event (NORMAL, a float time) */
        if (w->client && w->client->len) {
            due = (Event){w->client->heap[0].t, NORMAL, w->client->heap[0].eid, 1, 0};
            if (!next || before(&due, next)) {
                next = &due;
                who = NULL;
            }
        }
        Event tx;   /* a transfer's earliest event */
        if (w->dg && w->dg->ev.len) {
            const TxEvent *h = &w->dg->ev.heap[0];
            tx = (Event){h->t, h->prio, h->eid, 1, 0};
            if (!next || before(&tx, next)) {
                next = &tx;
                who = NULL;
            }
        }
        if (!next)
            break;
        w->now = next->t;
        w->int_clock = next->at_int;
        if (next == &tx) {
            if (transfer_event(w, txheap_pop(&w->dg->ev)) < 0)
                return -1;
            continue;
        }
        if (next == &due) {
            if (client_timeout(w) < 0)
                return -1;
            continue;
        }
        if (who && next == &who->ev_l) {   /* a load's end: wake the engine if it waits */
            who->ev_l.active = 0;
            trigger_wake(who);
            continue;
        }
        if ((who ? engine_resume(who) : w->client ? sender_resume(w) : arrivals_resume(w)) < 0)
            return -1;
        if (who && who->err) {
            w->err = 1;
            return 0;
        }
    }
    for (Py_ssize_t e = 0; e < w->M; e++)
        if (flush_rows(&w->engines[e]) < 0)
            return -1;
    return 0;
}

/* ------------------------------------------------------------------ the module function */
static PyObject *vec_bytes(const Vec *v) { return PyBytes_FromStringAndSize(v->p ? v->p : "", v->n * v->item); }

static void *alloc_n(Py_ssize_t n, size_t item, int *failed)
{
    void *p = calloc(n > 0 ? (size_t)n : 1, item);
    if (!p)
        *failed = 1;
    return p;
}

/* the plan's entry arrays grown to ``cap`` entries (their contents kept) */
static int grow_entries(Core *c, Py_ssize_t cap)
{
    int64_t **arrays[] = {&c->e_idx, &c->e_new, &c->e_ctx, &c->e_draft};
    for (size_t j = 0; j < sizeof arrays / sizeof arrays[0]; j++) {
        int64_t *p = realloc(*arrays[j], (size_t)cap * sizeof(int64_t));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        *arrays[j] = p;
    }
    int8_t *sib = realloc(c->e_sib, (size_t)cap);
    if (!sib) {
        PyErr_NoMemory();
        return -1;
    }
    c->e_sib = sib;
    c->e_cap = cap;
    return 0;
}

static void free_engine(Core *c)
{
    void *bufs[] = {c->running, c->order, c->done, c->wq, c->staged, c->staged_t, c->e_idx, c->e_new, c->e_ctx, c->e_draft, c->swapped,
                    c->tmp, c->idle, c->e_sib,
                    c->main, c->bd, c->lin.keys, c->lin.vals, c->head.keys, c->head.vals, c->pad, c->tr_rid.p,
                    c->tr_time.p, c->tr_phase.p,
                    c->gap_d.p, c->gap_n.p, c->other.p, c->pref, c->ld_idx, c->ld_ready, c->hw, c->stale};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
        free(bufs[j]);
    free(c->dr_terms.keys);
    free(c->dr_terms.vals);
    if (c->sp_held) {
        PyBuffer_Release(&c->sp_state);
        PyBuffer_Release(&c->sp_totals);
        PyBuffer_Release(&c->sp_counts);
        c->sp_held = 0;
    }
    kvpool_close(&c->pool);
    extents_close(&c->ext);
    hostlru_close(&c->host);
}

/* the engine's speculative decoding from its tuple (k, acceptance survival, the generator's state as 625 int64s,
totals of 3 int64s, the world's counts as 2 x N int64s, drafter) where drafter is None or (mode, layers, new
bytes, constants, Drafter.size_terms: the size terms of its first pass and of the others, and the head's extra
GEMMs); or None: no speculation */
static int open_speculation(Core *c, PyObject *spec)
{
    c->bd_cols = BD_COLS - 1;
    c->dr_mode = -1;
    if (spec == Py_None)
        return 0;
    long long k;
    PyObject *survival, *state, *totals, *counts, *drafter;
    if (!PyArg_ParseTuple(spec, "LO!OOOO", &k, &PyTuple_Type, &survival, &state, &totals, &counts, &drafter))
        return -1;
    if (k < 1 || k > SPEC_MAX_DRAFTS || PyTuple_GET_SIZE(survival) != k) {
        PyErr_SetString(PyExc_ValueError, "run_core: speculation needs 1..16 drafts and a survival for each");
        return -1;
    }
    if (read_doubles(survival, c->spec.survival, k, "the acceptance survival") < 0)
        return -1;
    if (get_buffer(state, &c->sp_state, "q", 8, SPEC_MT_WORDS + 1, "the draws' state") < 0)
        return -1;
    if (get_buffer(totals, &c->sp_totals, "q", 8, 3, "speculation totals") < 0) {
        PyBuffer_Release(&c->sp_state);
        return -1;
    }
    if (get_buffer(counts, &c->sp_counts, "q", 8, 2 * c->N, "speculation counts") < 0) {
        PyBuffer_Release(&c->sp_state);
        PyBuffer_Release(&c->sp_totals);
        return -1;
    }
    c->sp_held = 1;
    const int64_t *words = c->sp_state.buf;
    for (int j = 0; j < SPEC_MT_WORDS; j++) {
        if (words[j] < 0 || words[j] > 0xffffffffLL) {
            PyErr_SetString(PyExc_ValueError, "run_core: the draws' state holds a word outside 32 bits");
            return -1;
        }
        c->spec.mt[j] = (uint32_t)words[j];
    }
    if (words[SPEC_MT_WORDS] < 0 || words[SPEC_MT_WORDS] > SPEC_MT_WORDS) {
        PyErr_SetString(PyExc_ValueError, "run_core: the draws' position is outside the state");
        return -1;
    }
    c->spec.pos = (int)words[SPEC_MT_WORDS];
    c->spec.k = k;
    c->sp_drafted = c->sp_counts.buf;
    c->sp_accepted = c->sp_drafted + c->N;
    c->bd_cols = BD_COLS;
    if (drafter == Py_None)
        return 0;
    PyObject *consts;
    long long layers, new_bytes;
    if (!PyArg_ParseTuple(drafter, "iLLO!O", &c->dr_mode, &layers, &new_bytes, &PyTuple_Type, &consts,
                          &c->dr_terms_fn))
        return -1;
    const Py_ssize_t want = c->dr_mode ? 3 : 8;
    if ((c->dr_mode != 0 && c->dr_mode != 1) || PyTuple_GET_SIZE(consts) != want) {
        PyErr_SetString(PyExc_ValueError, "run_core: bad drafter pricing");
        return -1;
    }
    c->dr_layers = layers;
    c->dr_new_bytes = new_bytes;
    c->dr_terms.width = c->dr_mode ? 11 : 5;   /* (two passes' size terms, then the head's extra GEMMs) */
    return read_doubles(consts, c->dr_c, want, "the drafter's constants");
}

/* the draws' state and counts back to the caller's buffers */
static void close_speculation(Core *c)
{
    if (!c->sp_held)
        return;
    int64_t *words = c->sp_state.buf, *totals = c->sp_totals.buf;
    for (int j = 0; j < SPEC_MT_WORDS; j++)
        words[j] = c->spec.mt[j];
    words[SPEC_MT_WORDS] = c->spec.pos;
    totals[0] = c->spec.verifications;
    totals[1] = c->spec.drafted;
    totals[2] = c->spec.accepted;
}

/* one engine from its tuple (settings, pricing, terms, sink, chunk), over the world's requests */
static int open_engine(Core *c, World *w, Py_ssize_t index, PyObject *spec, const Core *shared)
{
    Py_ssize_t chunk;
    PyObject *cfg, *ints, *floats, *pad, *linear_fn, *head_fn, *sink, *speculation = Py_None;
    int mode;
    if (!PyArg_ParseTuple(spec, "O!(iO!O!OOO)On|O", &PyTuple_Type, &cfg, &mode, &PyTuple_Type, &ints, &PyTuple_Type,
                          &floats, &pad, &linear_fn, &head_fn, &sink, &chunk, &speculation))
        return -1;
    if (chunk < 1 || PyTuple_GET_SIZE(cfg) != CFG_SIZE || PyTuple_GET_SIZE(ints) != 10
        || PyTuple_GET_SIZE(floats) != (mode ? 20 : 14)) {
        PyErr_SetString(PyExc_ValueError, "run_core: bad sizes, settings or pricing constants");
        return -1;
    }
    int64_t cv[CFG_SIZE], iv[10];
    for (int j = 0; j < CFG_SIZE; j++) {
        cv[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(cfg, j));
        if (cv[j] == -1 && PyErr_Occurred())
            return -1;
    }
    for (int j = 0; j < 10; j++) {
        iv[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(ints, j));
        if (iv[j] == -1 && PyErr_Occurred())
            return -1;
    }
    const Py_ssize_t N = w->N;
    *c = *shared;   /* the world's per-request arrays */
    c->w = w;
    c->N = N;
    c->index = index;
    c->bs = cv[0];
    c->num_blocks = cv[1];
    c->max_seqs = cv[2];
    c->max_batched = cv[3];
    c->chunked = (int)cv[4];
    c->staging = (int)cv[5];
    c->victim_generated = (int)cv[6];
    c->max_stall = cv[7];
    c->free_blocks = cv[8] >= 0 ? cv[8] : c->num_blocks;
    c->check = (int)cv[9];
    c->swap = (int)cv[10];
    c->cpu_blocks = c->cpu_free = cv[11];
    c->priority = (int)cv[12];
    c->rr = (int)cv[13];
    c->quantum = cv[14];
    c->cache = (int)cv[15];
    c->lpf = (int)cv[16] && c->cache && !c->priority && !c->rr;
    c->lpf_window = cv[17];
    c->lpf_max_bypass = cv[18];
    c->lpf_at = -1;
    c->staticb = (int)cv[19];
    if (c->staticb && (c->cache || c->rr || c->lpf || c->swap)) {
        PyErr_SetString(PyExc_ValueError,
                        "run_core: static batching takes no prefix cache, round-robin, longest-prefix-first or swap");
        return -1;
    }
    c->contig = (int)cv[20];
    c->max_model_len = cv[21];
    if (c->contig && (c->contig > 3 || c->cache || c->swap || c->free_blocks != c->num_blocks)) {
        PyErr_SetString(PyExc_ValueError,
                        "run_core: a contiguous allocator takes no prefix cache or swap and starts unused");
        return -1;
    }
    if (c->bs < 1 || c->num_blocks < 0 || c->max_seqs < 1) {
        PyErr_SetString(PyExc_ValueError, "run_core: bad block or batch settings");
        return -1;
    }
    c->engine = mode;
    c->layers = iv[0];
    c->new_bytes = iv[1];
    c->graph_max = mode ? iv[2] : -1;
    c->n_fused = iv[3];
    c->attn_ops = iv[4];
    c->eager_ops = iv[5];
    c->dec_new_bytes = iv[6];
    c->loc_layers = iv[7];
    c->loc_span = iv[8];
    c->loc_chunked = (int)iv[9];
    c->wg = cv[23];
    c->wspan = cv[24];
    c->wchunked = (int)cv[25];
    if (c->loc_layers < 0 || c->loc_layers > c->layers || (c->loc_layers && c->loc_span < 1) || c->wg < 0
        || (c->wg && (c->wspan < 1 || !c->wfirst || c->contig || c->staticb || c->swap || c->nseq || cv[22] > 0
                      || w->dg))) {
        PyErr_SetString(PyExc_ValueError, "run_core: bad local attention, or window pages with what they do not take "
                                          "(static batching, contiguous regions, swap, samples, a host tier, pools)");
        return -1;
    }
    const Py_ssize_t nk = PyTuple_GET_SIZE(floats);
    for (Py_ssize_t j = 0; j < nk; j++) {
        c->c[j] = PyFloat_AsDouble(PyTuple_GET_ITEM(floats, j));
        if (c->c[j] == -1.0 && PyErr_Occurred())
            return -1;
    }
    c->swap_s_per_block = c->c[mode ? 11 : 10];
    c->copy_s_per_block = c->c[nk - 1];
    c->pad = NULL;
    if (c->graph_max >= 0) {   /* the padded batch of each token count up to graph_max */
        Py_buffer pb;
        if (get_buffer(pad, &pb, "q", 8, c->graph_max + 1, "graph sizes") < 0)
            return -1;
        c->pad = malloc((c->graph_max + 1) * sizeof(int64_t));
        if (c->pad)
            memcpy(c->pad, pb.buf, (c->graph_max + 1) * sizeof(int64_t));
        PyBuffer_Release(&pb);
        if (!c->pad) {
            PyErr_NoMemory();
            return -1;
        }
    }
    c->lin.width = 2;
    c->head.width = 1;
    c->linear_fn = linear_fn;
    c->head_fn = head_fn;
    c->sink = sink;
    c->chunk = chunk;
    if (open_speculation(c, speculation) < 0)
        return -1;
    if (c->nseq && (c->staticb || c->contig || c->spec.k || w->dg)) {
        PyErr_SetString(PyExc_ValueError, "run_core: parallel samples need continuous batching over a paged pool "
                                          "without speculation or disaggregation");
        return -1;
    }
    /* running, the finished of a step: at most max_num_seqs requests; a plan's entries: their sequences */
    const Py_ssize_t batch = (N < c->max_seqs ? N : (Py_ssize_t)c->max_seqs) + 1;
    int failed = 0;
    c->running = alloc_n(batch, 8, &failed);
    c->order = alloc_n(batch, 8, &failed);
    c->done = alloc_n(batch, 8, &failed);
    c->e_base = c->e_cap = batch;
    c->sib_total = 0;
    c->e_idx = alloc_n(batch, 8, &failed);
    c->e_new = alloc_n(batch, 8, &failed);
    c->e_ctx = alloc_n(batch, 8, &failed);
    c->e_draft = alloc_n(batch, 8, &failed);
    c->e_sib = c->nseq ? alloc_n(batch, 1, &failed) : NULL;
    c->swapped = alloc_n(batch, 8, &failed);
    c->tmp = alloc_n(batch, 8, &failed);
    c->idle = alloc_n(batch, 8, &failed);
    c->nidle = 0;
    c->wq = alloc_n(N + 1, 8, &failed);
    c->staged = alloc_n(N, 8, &failed);
    c->staged_t = alloc_n(N, 8, &failed);
    c->main = alloc_n(MAIN_COLS * chunk, 8, &failed);
    c->bd = alloc_n(BD_COLS * chunk, 8, &failed);
    c->stale = c->wg ? alloc_n(batch, 8, &failed) : NULL;   /* (at most the running requests are listed) */
    c->nstale = 0;
    c->stale_cap = batch;
    if (failed) {
        PyErr_NoMemory();
        return -1;
    }
    if (c->contig && extents_open(&c->ext, c->num_blocks, batch + 1) < 0)   /* (regions held <= batch) */
        return -1;
    c->tr_rid.item = 8;
    c->tr_time.item = 8;
    c->tr_phase.item = 1;
    c->gap_d.item = 8;
    c->gap_n.item = 8;
    c->other.item = 8;
    if (c->cache) {   /* a pristine pool (engine_core checks it): every block free, in id order, none cached */
        if (c->free_blocks != c->num_blocks || !c->hash_fn) {
            PyErr_SetString(PyExc_ValueError, "run_core: a prefix cache needs an unused pool and the requests' hashes");
            return -1;
        }
        c->pref = alloc_n(c->num_blocks, 8, &failed);
        if (failed) {
            PyErr_NoMemory();
            return -1;
        }
        if (kvpool_open(&c->pool, c->num_blocks) < 0)
            return -1;
    }
    if (cv[22] > 0) {   /* the cache's host tier (after the copy of ``shared``: nothing of it is shared) */
        if (!c->cache) {
            PyErr_SetString(PyExc_ValueError, "run_core: a host tier needs a prefix cache");
            return -1;
        }
        c->ld_idx = alloc_n(N, 8, &failed);
        c->ld_ready = alloc_n(N, 8, &failed);
        c->hw = alloc_n(N, 8, &failed);
        if (failed) {
            PyErr_NoMemory();
            return -1;
        }
        if (hostlru_open(&c->host, cv[22]) < 0)
            return -1;
    }
    return 0;
}

/* a pool's KV arrays per request (a disaggregated decode pool has its own; the world's counters, times and
statuses are shared) */
static int alloc_pool_arrays(Core *d, Py_ssize_t N, int windows)
{
    int failed = 0;
    if (windows) {   /* (the hybrid manager's windows) */
        d->wfirst = alloc_n(N, 8, &failed);
        d->whave = alloc_n(N, 8, &failed);
        d->wstale = alloc_n(N, 8, &failed);
        d->wupto = alloc_n(N, 8, &failed);
        d->wpg = alloc_n(N, sizeof(int64_t *), &failed);
    }
    d->tlen = alloc_n(N, 8, &failed);
    d->beyond = alloc_n(N, 8, &failed);
    d->rstart = alloc_n(N, 8, &failed);
    d->furthest = alloc_n(N, 8, &failed);
    d->cpu_held = alloc_n(N, 8, &failed);
    d->tbl = alloc_n(N, sizeof(int64_t *), &failed);
    d->own = alloc_n(N, sizeof(int64_t *), &failed);
    d->upto = alloc_n(N, 8, &failed);
    d->memo = alloc_n(N, 8, &failed);
    d->memo_at = alloc_n(N, 8, &failed);
    d->hs = alloc_n(N, 8, &failed);
    d->looked = alloc_n(N, 1, &failed);
    d->hbuf = alloc_n(N, sizeof(Py_buffer), &failed);
    if (failed) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < N; j++)
        d->hs[j] = -1;
    return 0;
}

static void free_pool_arrays(Core *d, Py_ssize_t N)
{
    if (d->tbl && d->own && d->hs)
        for (Py_ssize_t j = 0; j < N; j++)
            close_request(d, j);
    void *bufs[] = {d->tlen, d->beyond, d->rstart, d->furthest, d->cpu_held, d->tbl, d->own, d->upto, d->memo,
                    d->memo_at, d->hs, d->looked, d->hbuf, d->wfirst, d->whave, d->wstale, d->wupto,
                    d->wpg};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
        free(bufs[j]);
}

/* disaggregated prefill/decode from its tuple (prefill engines, pull, layers (0: not layer by layer), KV bytes a
token, bandwidth, latency, each request's own output, its output and acceptance in the decode pool, the decode
router route(g), its state (4 per decode engine), the decode pool's hashes_of or None, results: int64 2 x N
(decode engine, cached tokens at the prefill's end), float64 3 x N (prefill end, transfer start, transfer
seconds), int64 3 (bytes sent, done on the prefill side, in flight at the end), float64 1 (link busy seconds),
the decode router's rule (RULE_CALL: route is called) and its slack);
``shared_d`` becomes the decode engines' copy of ``shared`` with its own KV arrays */
static int open_disagg(Disagg *dg, Core *shared, Core *shared_d, PyObject *spec, Py_ssize_t N, Py_ssize_t M,
                       Py_buffer *b, int *got)
{
    Py_ssize_t mp;
    int pull;
    long long layers, kv_bytes, slack;
    double bw, latency;
    int rule;
    PyObject *objs[8], *route, *hash_d;
    if (!PyArg_ParseTuple(spec, "niLLddOOOOOOOOOOiL", &mp, &pull, &layers, &kv_bytes, &bw, &latency, &objs[0],
                          &objs[1], &objs[2], &route, &objs[3], &hash_d, &objs[4], &objs[5], &objs[6], &objs[7],
                          &rule, &slack))
        return -1;
    if (mp < 1 || mp >= M || !(bw > 0) || latency < 0 || layers < 0 || kv_bytes < 1
        || !(rule == RULE_CALL || rule == RULE_LEAST_LOAD || rule == RULE_LEAST_KV || rule == RULE_AFFINITY)) {
        PyErr_SetString(PyExc_ValueError, "run_core: bad prefill/decode pools or link");
        return -1;
    }
    const struct {
        const char *fmt, *what;
        Py_ssize_t n;
    } want[8] = {{"q", "own outputs", N}, {"q", "decode outputs", N}, {"q", "decode acceptance", N},
                 {"q", "decode state", 4 * (M - mp)}, {"q", "hand-off counters", 2 * N},
                 {"d", "hand-off times", 3 * N}, {"q", "hand-off totals", 3}, {"d", "link totals", 1}};
    for (; *got < 8; (*got)++)
        if (get_buffer(objs[*got], &b[*got], want[*got].fmt, 8, want[*got].n, want[*got].what) < 0)
            return -1;
    dg->mp = mp;
    dg->pull = pull;
    dg->layers = layers;
    dg->kv_bytes = kv_bytes;
    dg->bw = bw;
    dg->latency = latency;
    dg->out_full = b[0].buf;
    dg->route = route;
    dg->rule = rule;
    dg->slack = slack;
    dg->state = b[3].buf;
    dg->prefill_running = mp;
    int64_t *counters = b[4].buf;
    double *times = b[5].buf;
    shared->dst = counters;   /* the decode engine routed to (-1: none) */
    dg->cached = counters + N;
    dg->prefill_end = times;
    dg->tx_start = times + N;
    dg->tx_s = times + 2 * N;
    for (Py_ssize_t j = 0; j < N; j++) {
        counters[j] = -1;
        counters[N + j] = 0;
        times[j] = times[N + j] = times[2 * N + j] = NAN;
    }
    int failed = 0;
    dg->src = alloc_n(N, 8, &failed);
    dg->next_pull = alloc_n(N, 8, &failed);
    dg->next_ahead = alloc_n(N, 8, &failed);
    dg->next_link = alloc_n(N, 8, &failed);
    dg->booked = alloc_n(N, 1, &failed);
    dg->kv_received = alloc_n(N, 1, &failed);
    dg->noted = alloc_n(N, 1, &failed);
    dg->ahead_flag = alloc_n(N, 1, &failed);
    dg->in_tx = alloc_n(N, 1, &failed);
    if (failed) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < N; j++)
        dg->src[j] = -1;
    fifo_init(&dg->link_q);
    *shared_d = *shared;
    shared_d->output = b[1].buf;
    shared_d->accepted = b[2].buf;
    shared_d->hash_fn = hash_d == Py_None ? NULL : hash_d;
    return alloc_pool_arrays(shared_d, N, 0);
}

/* the hand-off's totals back to the caller */
static void close_disagg(Disagg *dg, Py_buffer *b)
{
    int64_t *ti = b[6].buf;
    ti[0] = dg->bytes_sent;
    ti[1] = dg->done_on_prefill;
    ti[2] = dg->in_flight;
    ((double *)b[7].buf)[0] = dg->busy_s;
}

static void free_disagg(Disagg *dg, Py_buffer *b, int got)
{
    void *bufs[] = {dg->src, dg->next_pull, dg->next_ahead, dg->next_link, dg->booked, dg->kv_received, dg->noted,
                    dg->ahead_flag, dg->in_tx};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
        free(bufs[j]);
    txheap_close(&dg->ev);
    while (got > 0)
        PyBuffer_Release(&b[--got]);
}

/* (error, records, totals) of one engine after the run (the totals' last: its free blocks, cached ones included) */
static PyObject *engine_result(Core *c)
{
    return Py_BuildValue("(iddLLLL)(NNNNNN)(LLLLLLLLLLLLLLLLLL)", c->err, c->err_t, c->err_d, (long long)c->err_step,
                         (long long)c->err_waiting, (long long)c->err_running, (long long)c->err_stall,
                         vec_bytes(&c->tr_rid), vec_bytes(&c->tr_time), vec_bytes(&c->tr_phase),
                         vec_bytes(&c->gap_d), vec_bytes(&c->gap_n), vec_bytes(&c->other),
                         (long long)c->num_preemptions, (long long)c->peak_used, (long long)c->peak_logical,
                         (long long)c->sum_used, (long long)c->sum_logical, (long long)c->steps, (long long)c->waits,
                         (long long)c->swapped_blocks, (long long)c->pool.evicted, (long long)c->query_tokens,
                         (long long)c->hit_tokens, (long long)c->peak_prefix, (long long)c->peak_prefix_logical,
                         (long long)c->host.stored, (long long)c->host.evicted, (long long)c->host_loaded,
                         (long long)c->host_hit_tokens, (long long)c->free_blocks);
}

PyObject *kv_run_core(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ints_obj, *arrival_obj, *dest_obj, *route, *state_obj, *progress, *counters_obj, *times_obj, *specs;
    PyObject *hash_fn, *client_spec = Py_None, *disagg_spec = Py_None;
    Py_ssize_t N, every;
    double lag;
    if (!PyArg_ParseTuple(args, "nOOOdOOOnOOO!O|OO", &N, &ints_obj, &arrival_obj, &dest_obj, &lag, &route, &state_obj,
                          &progress, &every, &counters_obj, &times_obj, &PyList_Type, &specs, &hash_fn, &client_spec,
                          &disagg_spec))
        return NULL;
    const Py_ssize_t M = PyList_GET_SIZE(specs);
    if (N < 0 || M < 1) {
        PyErr_SetString(PyExc_ValueError, "run_core: no engine");
        return NULL;
    }
    World w;
    memset(&w, 0, sizeof w);
    Core shared, shared_d;   /* the per-request arrays of the engines (shared_d: a decode pool's own KV arrays) */
    memset(&shared, 0, sizeof shared);
    memset(&shared_d, 0, sizeof shared_d);
    Disagg dg;
    memset(&dg, 0, sizeof dg);
    Py_buffer dbufs[8];
    int dgot = 0;
    Py_buffer bufs[6], pairs_buf;
    int got = 0, got_pairs = 0;
    Client client;
    memset(&client, 0, sizeof client);
    PyObject *result = NULL;
    Core *engines = calloc(M, sizeof(Core));
    if (!engines) {
        PyErr_NoMemory();
        return NULL;
    }
    struct {
        PyObject *obj;
        const char *fmt, *what;
        Py_ssize_t n;
    } want[6] = {{ints_obj, "q", "requests", 7 * N}, {arrival_obj, "d", "arrivals", N}, {dest_obj, "q", "engines", N},
                 {state_obj, "q", "replica state", 4 * M}, {counters_obj, "q", "request counters", 6 * N},
                 {times_obj, "d", "request times", 5 * N}};
    for (; got < 6; got++)
        if (get_buffer(want[got].obj, &bufs[got], want[got].fmt, 8, want[got].n, want[got].what) < 0)
            goto done;
    const int64_t *iv = bufs[0].buf;
    shared.rid = iv;
    shared.prompt = iv + N;
    shared.output = iv + 2 * N;
    shared.accepted = iv + 3 * N;
    shared.prio = iv + 4 * N;
    shared.plen_tok = iv + 5 * N;
    for (Py_ssize_t i = 0; i < N; i++)
        if (iv[6 * N + i] != 1) {   /* parallel samples */
            shared.nseq = iv + 6 * N;
            break;
        }
    shared.arrival = bufs[1].buf;
    int64_t *oi = bufs[4].buf;   /* status, computed, generated, preemptions, int-zero flags, cached tokens */
    double *of = bufs[5].buf;    /* first scheduled, first token, last token, finish, rejected at */
    shared.stat = NULL;
    int failed = 0;
    shared.turn = alloc_n(N, 8, &failed);
    shared.stat = alloc_n(N, 1, &failed);
    shared.in_pre = alloc_n(N, 1, &failed);
    if (shared.nseq) {
        shared.gk = alloc_n(N, 8, &failed);
        shared.gcom = alloc_n(N, 8, &failed);
        shared.gsib = alloc_n(N, 8, &failed);
        shared.gpriv = alloc_n(N, 1, &failed);
        shared.gtbl = alloc_n(N, sizeof(int64_t *), &failed);
    }
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    int windows = 0;   /* (whether an engine keeps window pages: cfg[23], its ``wg``) */
    for (Py_ssize_t e = 0; e < M; e++) {
        PyObject *one = PyList_GET_ITEM(specs, e), *cfg = PyTuple_Check(one) && PyTuple_GET_SIZE(one) ? PyTuple_GET_ITEM(one, 0) : NULL;
        if (!cfg || !PyTuple_Check(cfg) || PyTuple_GET_SIZE(cfg) != CFG_SIZE) {
            PyErr_SetString(PyExc_ValueError, "run_core: an engine's settings are not a tuple of CFG_SIZE");
            goto done;
        }
        const long long wg = PyLong_AsLongLong(PyTuple_GET_ITEM(cfg, 23));
        if (wg == -1 && PyErr_Occurred())
            goto done;
        windows |= wg > 0;
    }
    if (alloc_pool_arrays(&shared, N, windows) < 0)
        goto done;
    for (Py_ssize_t j = 0; j < 6 * N; j++)
        oi[j] = 0;
    for (Py_ssize_t j = 0; j < 5 * N; j++)
        of[j] = NAN;
    shared.comp = oi + N;
    shared.gen = oi + 2 * N;
    shared.npre = oi + 3 * N;
    shared.int_zero = oi + 4 * N;
    shared.ncached = oi + 5 * N;
    shared.fsched = of;
    shared.ftok = of + N;
    shared.ltok = of + 2 * N;
    shared.fin = of + 3 * N;
    shared.rej = of + 4 * N;
    shared.hash_fn = hash_fn == Py_None ? NULL : hash_fn;
    w.mr = M;
    if (disagg_spec != Py_None && open_disagg(&dg, &shared, &shared_d, disagg_spec, N, M, dbufs, &dgot) < 0)
        goto done;
    if (disagg_spec != Py_None) {
        w.dg = &dg;
        w.mr = dg.mp;
    }
    w.N = N;
    w.M = M;
    w.arrival = bufs[1].buf;
    w.dest = bufs[2].buf;
    w.route = route;
    w.hash_fn = hash_fn == Py_None ? NULL : hash_fn;
    w.prompt = shared.prompt;
    if (PyTuple_Check(route)) {   /* (rule, pairs or None, slack): the router's rule, applied here */
        PyObject *pairs_obj;
        long long slack;
        if (!PyArg_ParseTuple(route, "iOL", &w.rule, &pairs_obj, &slack))
            goto done;
        if (w.rule < RULE_LEAST_LOAD || w.rule > RULE_FOLLOW) {
            PyErr_Format(PyExc_ValueError, "run_core: no routing rule %d", w.rule);
            goto done;
        }
        w.slack = slack;
        if (w.rule == RULE_PAIR || w.rule == RULE_FOLLOW) {
            const int pair = w.rule == RULE_PAIR;
            if (get_buffer(pairs_obj, &pairs_buf, "q", 8, pair ? 2 * N : N, "router choices") < 0)
                goto done;
            got_pairs = 1;
            w.pairs = pairs_buf.buf;
            for (Py_ssize_t j = 0; j < (pair ? 2 * N : N); j++)
                if (pair ? w.pairs[j] < 0 || w.pairs[j] >= w.mr || (j % 2 && w.pairs[j - 1] >= w.pairs[j])
                         : w.pairs[j] < -1 || w.pairs[j] >= j) {
                    PyErr_SetString(PyExc_ValueError, pair ? "run_core: a router pair is out of range or not ascending"
                                                           : "run_core: a request follows no earlier request");
                    goto done;
                }
        }
    }
    if (client_spec != Py_None) {   /* (a client: ``lag`` is its input latency, send to hand-over) */
        if (client_open(&client, client_spec, N) < 0)
            goto done;
        w.client = &client;
    }
    w.state = bufs[3].buf;
    w.lag = lag;
    w.engines = engines;
    w.progress = progress;
    w.progress_every = every > 0 ? every : 1;
    if (route == Py_None)
        for (Py_ssize_t g = 0; g < N; g++)
            if (w.dest[g] < 0 || w.dest[g] >= w.mr) {
                PyErr_SetString(PyExc_ValueError, "run_core: a request's engine is out of range");
                goto done;
            }
    for (Py_ssize_t e = 0; e < M; e++) {
        const int decode = w.dg && e >= w.dg->mp;
        if (open_engine(&engines[e], &w, e, PyList_GET_ITEM(specs, e), decode ? &shared_d : &shared) < 0)
            goto done;
        engines[e].role = !w.dg ? ROLE_COLOCATED : decode ? ROLE_DECODE : ROLE_PREFILL;
        engines[e].mine = decode ? shared_d.dst : w.dest;
        engines[e].may_block = w.dg != NULL;
        fifo_init(&engines[e].ahead);
        fifo_init(&engines[e].pullq);
    }
    if (run(&w) < 0)
        goto done;
    for (Py_ssize_t e = 0; e < M; e++)
        close_speculation(&engines[e]);
    for (Py_ssize_t j = 0; j < N; j++)
        oi[j] = shared.stat[j];
    if (w.dg)
        close_disagg(&dg, dbufs);
    result = PyList_New(M);
    if (!result)
        goto done;
    for (Py_ssize_t e = 0; e < M; e++) {
        PyObject *one = engine_result(&engines[e]);
        if (!one) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, e, one);
    }
done:
    client_close(&client);
    for (Py_ssize_t e = 0; e < M; e++)
        free_engine(&engines[e]);
    free(engines);
    free(shared.turn);
    free(shared.stat);
    free(shared.in_pre);
    free(shared.gk);
    free(shared.gcom);
    free(shared.gsib);
    free(shared.gpriv);
    free_pool_arrays(&shared, N);
    free(shared.gtbl);   /* (after: closing a request frees its siblings' tables) */
    free_pool_arrays(&shared_d, N);
    free_disagg(&dg, dbufs, dgot);
    while (got > 0)
        PyBuffer_Release(&bufs[--got]);
    if (got_pairs)
        PyBuffer_Release(&pairs_buf);
    return result;
}
