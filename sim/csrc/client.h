/* A client with a concurrency limit for the compiled core (core.c): sim/clients.py's ClientPool in plain
arrays. The sender itself is one of core.c's processes (it reuses the arrival process's event); here are
its counters and the timeouts it leaves pending, many at once:

    hand-over   a request sent at t reaches the engines at t + the input latency      (what >= 0: the request)
    release     a slot is free again a pause after the client has a whole response  (what = CLIENT_RELEASE)
    give-up     with a timeout, the client stops waiting for request r at t + timeout  (what = -2 - r)

Both are SimPy timeouts (priority NORMAL, a float time), held in a binary min-heap by (time, eid), the order
SimPy processes them in. A fanned-out request's samples (``lead``: each request's batch's first one) are
sent together under one slot, released once the last of their answers is in (``due``: answers still due
of the batch led there, ``due_at``: the latest so far). Invariants: ``in_flight`` = batches sent - released;
``in_transit`` = requests sent - handed over; ``pauses`` <= batches answered; a request is answered once
(``answered``, with a timeout: its response, its rejection or the client giving up, whichever comes first). */
#ifndef KVSIM_CLIENT_H
#define KVSIM_CLIENT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { CLIENT_RELEASE = -1 };

typedef struct {
    double t;
    int64_t eid;
    int64_t what;
} Timeout;

typedef struct {
    Py_buffer limit_buf, pause_buf, lead_buf;
    int held_limit, held_pause, held_lead;
    const int64_t *lead;      /* NULL: one request a send; else each request's batch's first (in send order) */
    int64_t *due;
    double *due_at;
    const int64_t *limit;     /* per request (in send order): the slots it may be sent under */
    const double *pause;      /* NULL: ``pause_s`` after each answer; else the pauses, in answer order */
    double pause_s, output_s, token_s;
    double timeout;           /* workload.timeout_s (0: none): a give-up pending for each request sent */
    int8_t *answered;         /* with a timeout, per request: answered already */
    Py_ssize_t n, paused;     /* requests; pauses taken */
    int64_t in_flight, in_transit;
    int all_sent;             /* the sender has sent every request */
    int waits_slot;           /* the sender waits for a free slot, its event not yet triggered */
    Timeout *heap;
    Py_ssize_t len, cap;
} Client;

/* read ``spec`` (limits int64[n], pauses float64[n] or None, pause_s, output_s, token_s, leads int64[n] or
None); -1 (error set) */
int client_open(Client *cl, PyObject *spec, Py_ssize_t n);
void client_close(Client *cl);
/* the pause after the next answer */
double client_next_pause(Client *cl);
/* a timeout pending from now; -1 (MemoryError set) on failure */
int client_push(Client *cl, double t, int64_t eid, int64_t what);
/* the earliest pending timeout (len > 0), taken off */
Timeout client_pop(Client *cl);

#endif
