/* A client with a concurrency limit for the compiled core: its spec, pauses and pending timeouts
(client.h). */
#include "client.h"

#include "native.h"

#include <stdlib.h>

int client_open(Client *cl, PyObject *spec, Py_ssize_t n)
{
    PyObject *limits, *pauses, *leads;
    memset(cl, 0, sizeof *cl);
    if (!PyArg_ParseTuple(spec, "OOdddOd", &limits, &pauses, &cl->pause_s, &cl->output_s, &cl->token_s, &leads,
                          &cl->timeout))
        return -1;
    if (cl->timeout < 0) {
        PyErr_SetString(PyExc_ValueError, "run_core: a negative client timeout");
        return -1;
    }
    if (cl->timeout > 0 && !(cl->answered = calloc(n > 0 ? (size_t)n : 1, 1))) {
        PyErr_NoMemory();
        return -1;
    }
    cl->n = n;
    if (get_buffer(limits, &cl->limit_buf, "q", 8, n, "client limits") < 0)
        return -1;
    cl->held_limit = 1;
    cl->limit = cl->limit_buf.buf;
    for (Py_ssize_t g = 0; g < n; g++)
        if (cl->limit[g] < 1) {
            PyErr_SetString(PyExc_ValueError, "run_core: a client limit below 1");
            return -1;
        }
    if (pauses != Py_None) {
        if (get_buffer(pauses, &cl->pause_buf, "d", 8, n, "client pauses") < 0)
            return -1;
        cl->held_pause = 1;
        cl->pause = cl->pause_buf.buf;
    }
    if (leads != Py_None) {   /* batches of samples: consecutive, each led by its first */
        if (get_buffer(leads, &cl->lead_buf, "q", 8, n, "client batches") < 0)
            return -1;
        cl->held_lead = 1;
        cl->lead = cl->lead_buf.buf;
        for (Py_ssize_t g = 0; g < n; g++)
            if (cl->lead[g] < 0 || cl->lead[g] > g || (g && cl->lead[g] != g && cl->lead[g] != cl->lead[g - 1])) {
                PyErr_SetString(PyExc_ValueError, "run_core: a client batch is not a run of consecutive requests");
                return -1;
            }
        cl->due = calloc(n > 0 ? (size_t)n : 1, sizeof(int64_t));
        cl->due_at = calloc(n > 0 ? (size_t)n : 1, sizeof(double));
        if (!cl->due || !cl->due_at) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

void client_close(Client *cl)
{
    free(cl->answered);
    cl->answered = NULL;
    if (cl->held_limit)
        PyBuffer_Release(&cl->limit_buf);
    if (cl->held_pause)
        PyBuffer_Release(&cl->pause_buf);
    if (cl->held_lead)
        PyBuffer_Release(&cl->lead_buf);
    free(cl->heap);
    free(cl->due);
    free(cl->due_at);
    cl->heap = NULL;
    cl->due = NULL;
    cl->due_at = NULL;
    cl->lead = NULL;
    cl->held_limit = cl->held_pause = cl->held_lead = 0;
}

double client_next_pause(Client *cl)
{
    if (!cl->pause)
        return cl->pause_s;
    return cl->paused < cl->n ? cl->pause[cl->paused++] : cl->pause_s;   /* (one answer a request: never past n) */
}

static inline int earlier(const Timeout *a, const Timeout *b)
{
    return a->t != b->t ? a->t < b->t : a->eid < b->eid;
}

int client_push(Client *cl, double t, int64_t eid, int64_t what)
{
    if (cl->len == cl->cap) {
        const Py_ssize_t cap = cl->cap ? 2 * cl->cap : 64;
        Timeout *p = realloc(cl->heap, (size_t)cap * sizeof(Timeout));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        cl->heap = p;
        cl->cap = cap;
    }
    Py_ssize_t j = cl->len++;
    const Timeout x = {t, eid, what};
    while (j > 0) {   /* sift up */
        const Py_ssize_t up = (j - 1) / 2;
        if (!earlier(&x, &cl->heap[up]))
            break;
        cl->heap[j] = cl->heap[up];
        j = up;
    }
    cl->heap[j] = x;
    return 0;
}

Timeout client_pop(Client *cl)
{
    const Timeout top = cl->heap[0];
    const Timeout x = cl->heap[--cl->len];
    Py_ssize_t j = 0;
    for (;;) {   /* sift the last one down from the root */
        Py_ssize_t k = 2 * j + 1;
        if (k >= cl->len)
            break;
        if (k + 1 < cl->len && earlier(&cl->heap[k + 1], &cl->heap[k]))
            k++;
        if (!earlier(&cl->heap[k], &x))
            break;
        cl->heap[j] = cl->heap[k];
        j = k;
    }
    if (cl->len)
        cl->heap[j] = x;
    return top;
}
