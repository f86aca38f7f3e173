/* Disaggregated prefill/decode for the compiled core (core.c): sim/cluster/disagg.py's hand-off and
sim/cluster/link.py's link in plain arrays. Each request crosses the link at most once, so a transfer is
known by its request g; its process leaves one event pending at a time, held in a binary min-heap by
SimPy's order (time, priority, eid):

    TX_START    the process begins (URGENT, as SimPy starts a process): it asks for the link
    TX_GRANT    its request for the link is granted: the wire time begins
    TX_WIRE     the bytes have left: the link is released (a TX_RELEASE event), then the latency, or landed
    TX_RELEASE  the link's release is processed: the next transfer waiting for it is granted
    TX_LAND     the latency is over: the KV has landed
    TX_GIVE_UP  pull, with client timeouts: the deadline of a request routed to a decode engine; if it still
                waits there for its blocks, it is aborted (not a transfer's: a timer set as it is routed)

The link (a SimPy resource of capacity 1) grants in request order: ``queue`` (a FIFO of requests through
``next``) holds those waiting, ``busy`` whether one holds it. Invariants: at most one transfer holds the
link; a transfer is in the queue, holds the link, or has released it. */
#ifndef KVSIM_HANDOFF_H
#define KVSIM_HANDOFF_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { TX_START = 0, TX_GRANT = 1, TX_WIRE = 2, TX_RELEASE = 3, TX_LAND = 4, TX_GIVE_UP = 5 };

typedef struct {
    double t;
    int prio;
    int64_t eid;
    int64_t g;      /* the request (TX_RELEASE: -1) */
    int kind;
} TxEvent;

typedef struct {
    TxEvent *heap;
    Py_ssize_t len, cap;
} TxHeap;

/* a FIFO of requests linked through ``next`` (shared by the lists of one kind: a request is in one at most) */
typedef struct {
    int64_t head, tail, len;
} Fifo;

/* a pending event; -1 (MemoryError set) on failure */
int txheap_push(TxHeap *h, TxEvent e);
/* the earliest (len > 0), taken off */
TxEvent txheap_pop(TxHeap *h);
void txheap_close(TxHeap *h);

static inline void fifo_init(Fifo *q) { q->head = q->tail = -1; q->len = 0; }

static inline void fifo_push(Fifo *q, int64_t *next, int64_t g)
{
    next[g] = -1;
    if (q->tail >= 0)
        next[q->tail] = g;
    else
        q->head = g;
    q->tail = g;
    q->len++;
}

static inline int64_t fifo_pop(Fifo *q, const int64_t *next)
{
    const int64_t g = q->head;
    q->head = next[g];
    if (q->head < 0)
        q->tail = -1;
    q->len--;
    return g;
}

/* g taken out of the FIFO wherever it is (the others keep their order); whether it was there */
static inline int fifo_remove(Fifo *q, int64_t *next, int64_t g)
{
    int64_t before = -1, at = q->head;
    while (at >= 0 && at != g) {
        before = at;
        at = next[at];
    }
    if (at < 0)
        return 0;
    if (before < 0)
        q->head = next[g];
    else
        next[before] = next[g];
    if (q->tail == g)
        q->tail = before;
    q->len--;
    return 1;
}

#endif
