/* The core's types: states and phases, a growable array, the step terms' table, events, an engine (Core), the world of engines and processes, and disaggregation's state.

A fragment of core.c (a unity build: core.c includes its parts in order; none compiles alone). */
#ifndef KVSIM_CORE_TYPES_H
#define KVSIM_CORE_TYPES_H


enum { ST_WAITING = 0, ST_RUNNING = 1, ST_PREEMPTED = 2, ST_SWAPPED = 3, ST_FINISHED = 4, ST_ABORTED = 6 };
/* (5, REJECTED, is each refused request's, set by engine_core from its rejection time; ST_ABORTED: its client
gave up, workload.timeout_s, with int_zero's bit 2 set where it was running then) */
enum { PH_WAITING = 0, PH_PREFILL = 1, PH_DECODE = 2, PH_PREEMPTED = 3, PH_SWAPPED = 4, PH_IDLE = 5, PH_DONE = 6,
       PH_HOST_LOAD = 7 };
enum { MAIN_COLS = 18, BD_COLS = 8 };
enum { CFG_SIZE = 29 };   /* an engine's settings (engine_core._engine_spec) */   /* (the 8th, the draft part, where speculating) */
enum { ERR_NONE = 0, ERR_DEADLOCK = 1, ERR_DURATION = 2, ERR_LIVELOCK = 3, ERR_RANK_DEADLOCK = 4,
       ERR_GROUP_LIVELOCK = 5 };   /* (4, 5: a data-parallel group's, on its first rank; 4's err_step: the rank) */
enum { STATE_COLS = 7 };   /* a router's view of an engine: handed over, ended, blocks in use, incoming, running,
                              (the first row's) the clock's bits, and the leading blocks of the prompt being
                              routed that its prefix cache holds (ReplicaState) */
/* where a request was when its client gave up (int_zero's bits; none of them: queued) */
enum { ABORT_RUNNING = 4, ABORT_SWAPPED = 8, ABORT_LOADING = 16, ABORT_SEAT = 32, ABORT_TRANSFER = 64 };
enum { URGENT = 0, NORMAL = 1 };
enum { ROLE_COLOCATED = 0, ROLE_PREFILL = 1, ROLE_DECODE = 2 };
/* routers chosen here (sim/cluster/routers.py, Router.core_rule): least_requests; least_kv; power_of_two
over the pairs drawn ahead; prefix_affinity over a pool without prefix caches; session (each request
follows an earlier one, found ahead, or goes to the least loaded); lora_affinity (over the engines' adapter
residency) */
enum { RULE_CALL = 0, RULE_LEAST_LOAD = 1, RULE_LEAST_KV = 2, RULE_PAIR = 3, RULE_AFFINITY = 4, RULE_FOLLOW = 5,
       RULE_LORA = 6 };

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

/* a data-parallel group (sim/cluster/data_parallel.py LockstepGroup): the ranks engines[first .. first + size)
step together, one process for all of them: each rank plans on its own, every rank's tokens priced padded to
the largest rank's (``tokens``; CUDA graphs only where no rank prefills: ``prefill``), the step lasting the
slowest rank's time, the others waiting for it in their overhead; a rank with no plan runs a dummy pass (no
row). Its own counts: steps, stall, and what lockstep cost (LockstepGroup._count) */
typedef struct Group {
    Py_ssize_t first, size;
    Event ev;
    int state;            /* 0: start, 1: after a wake, 2: after a step */
    int wakes;            /* it waits for an arrival on any rank (an untriggered wake) */
    int8_t *planned;      /* per rank: a plan this step */
    int64_t tokens;       /* the largest rank's tokens this step */
    int prefill;          /* some rank prefills this step */
    int64_t steps, stall, max_stall;
    int64_t tok_sum, slots, dummy;
    double busy_s, wait_s;
} Group;

/* one engine: its requests (local positions 0..N-1), scheduler, KV counters, pricing and results */
typedef struct Core {
    World *w;
    Group *grp;           /* its data-parallel group (NULL: it steps on its own) */
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
    int64_t *int_zero;   /* bit 0: first scheduled, bit 1: rejected, while the clock was SimPy's int 0; bit 2:
                            aborted while running, bit 3 while swapped out, bit 4 while loading from the host tier;
                            between prefill and decode pools, bit 5 while waiting for a decode seat, bit 6 in
                            transfer (enum ABORT_*) */
    double *fsched, *ftok, *ltok, *fin, *rej;
    int64_t *dst;         /* disaggregated: the decode engine each request was routed to (-1: none) */
    /* queues: running (in rank order), waiting (a ring: preempted requests go to its front), staged */
    int64_t *running, *order, *done, *wq, *staged, *swapped, *tmp;
    double *staged_t;
    Py_ssize_t ndone;     /* the last step's finished, first ``ndone`` of ``done`` in finish order */
    Py_ssize_t nrun, wq_head, wq_len, nstaged, nswapped;
    /* client timeouts (workload.timeout_s; 0: none): the requests handed over, in that order, a ring of N + 1
    whose head's deadline (arrival + timeout) comes first, or (``dl_heap``: a decode engine, handed its
    requests as their prefills end) a binary heap by deadline, ties in hand-over order (deadlines.inc);
    ``aborted`` counts those it ended */
    double timeout;
    int64_t *dl;
    Py_ssize_t dl_head, dl_len;
    int dl_heap;
    int64_t aborted;
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
    int64_t unrecorded_preempted;   /* preempted by plans that came out empty (no row): on the next row */
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
    /* every layer local (sim/kv/sliding_only.py; ``sonly``, with ``wg`` 0): no pages, each request's table is
    cut to the window itself, its first ``nulls[i]`` entries null (their blocks freed, last first, as they left
    the window: ``drop_nulls``); the stale list as above */
    int sonly;
    int64_t *nulls;
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
    Py_buffer acc_buf, out_buf;   /* a mixed fleet's engine with an admission of its own: which requests it
                                     queues, and their outputs as it serves them */
    int acc_held;
    int sp_held;          /* the three buffers are held */
    int dr_mode;
    int64_t dr_layers, dr_new_bytes;
    double dr_c[8];
    PyObject *dr_terms_fn;
    Terms dr_terms;
    /* LoRA serving (sim/lora.py; ``lr_max`` 0: none): each request's adapter (``lr_id``, the world's: dense
    ids in the order of the adapters' own, -1 the base model); admission's and the plan's sets of adapters
    (``lr_seen[a] == lr_stamp``: in the set being made); the GPU slots' adapters, least recently used first
    (``lr_gpu``, at most ``lr_max``; ``lr_in_gpu``: whether each is there); the host cache's (``lr_host``, an
    LRU of at most max_cpu_loras ids: hostlru.h); the plan's adapters in ascending order (``lr_batch``), their
    tokens and the seconds their loads take; the loads' totals (AdapterCache's counters); the kernels' seconds
    by (tokens, adapters, graph), ``lr_fn``'s, once each */
    int64_t lr_max, lr_n;
    const int64_t *lr_id;
    double lr_disk_s, lr_copy_s;
    int64_t *lr_seen, lr_stamp;
    int64_t *lr_gpu, *lr_batch;
    Py_ssize_t lr_ngpu, lr_nbatch;
    int8_t *lr_in_gpu;
    HostLru lr_host;
    int64_t lr_tokens, lr_gpu_loads, lr_disk_loads;
    double lr_load, lr_load_s;
    Vec lr_skip;          /* admission: the requests skipped (their adapter one too many), in skip order */
    PyObject *lr_fn;
    Terms lr_terms;
    Py_buffer lr_ids_buf, lr_totals_buf;
    int lr_held;          /* the two buffers are held */
    /* pipeline stages (sim/executors/pipeline.py; ``pp`` 0: none): a request's chunk is at most ``batch_tokens``
    (one batch's budget; max_batched is the p batches in flight's); each stage kind's pricing in a Core of its
    own (``pp_kinds``, only its pricing fields and plan entries used), the kind of each of the ``pp`` stages,
    the hop's latency and seconds a token; the step's units, microbatches and their prices (scratch) */
    int64_t batch_tokens;
    int pp, pp_nkinds, pp_chunked;
    struct Core *pp_kinds;
    int64_t *pp_kind_of;
    double pp_hop_lat, pp_hop_tok;
    int64_t *pp_un, *pp_uc, *pp_ub, *pp_ord;   /* units: tokens, context, bin; the placing order */
    Py_ssize_t pp_ucap;
    double *pp_d, *pp_bd;             /* per kind and microbatch: duration, breakdown (BD_COLS - 1 parts) */
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
    Group *groups;        /* NULL, or the engines as G data-parallel groups of consecutive ranks (one process each) */
    Py_ssize_t G;
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
    /* client timeouts (workload.timeout_s; 0: none): each request's hand-over count on its decode engine (the
    deadline heaps' tie-break), and whether it waits in a decode engine's ``pullq`` (pull) */
    double timeout;
    int64_t *handed_seq, handed_next;
    int8_t *in_pullq;
} Disagg;


#endif
