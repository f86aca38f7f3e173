/* The KV transfers' pending events (handoff.h): a binary min-heap by SimPy's order. */
#include "handoff.h"

#include <stdlib.h>

static int earlier(const TxEvent *a, const TxEvent *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->prio != b->prio)
        return a->prio < b->prio;
    return a->eid < b->eid;
}

int txheap_push(TxHeap *h, TxEvent e)
{
    if (h->len == h->cap) {
        const Py_ssize_t cap = h->cap ? 2 * h->cap : 256;
        TxEvent *p = realloc(h->heap, (size_t)cap * sizeof(TxEvent));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        h->heap = p;
        h->cap = cap;
    }
    Py_ssize_t j = h->len++;
    while (j > 0 && earlier(&e, &h->heap[(j - 1) / 2])) {
        h->heap[j] = h->heap[(j - 1) / 2];
        j = (j - 1) / 2;
    }
    h->heap[j] = e;
    return 0;
}

TxEvent txheap_pop(TxHeap *h)
{
    const TxEvent top = h->heap[0], last = h->heap[--h->len];
    Py_ssize_t j = 0;
    for (;;) {
        Py_ssize_t k = 2 * j + 1;
        if (k >= h->len)
            break;
        if (k + 1 < h->len && earlier(&h->heap[k + 1], &h->heap[k]))
            k++;
        if (!earlier(&h->heap[k], &last))
            break;
        h->heap[j] = h->heap[k];
        j = k;
    }
    if (h->len)
        h->heap[j] = last;
    return top;
}

void txheap_close(TxHeap *h)
{
    free(h->heap);
    h->heap = NULL;
    h->len = h->cap = 0;
}
