/* The compiled core's host tier (hostlru.h says what it keeps). */
#include "native.h"
#include "dlist.h"
#include "hostlru.h"
#include "kvpool.h"   /* kv_mix64 */

#include <stdlib.h>

static uint64_t home_of(const HostLru *t, int64_t h) { return kv_mix64((uint64_t)h) & t->mask; }

int hostlru_open(HostLru *t, int64_t cap)
{
    memset(t, 0, sizeof *t);
    uint64_t size = 16;
    while (size < 2 * (uint64_t)cap)
        size *= 2;
    t->key = malloc((size_t)cap * sizeof(int64_t));
    t->prev = malloc((size_t)cap * sizeof(int64_t));
    t->next = malloc((size_t)cap * sizeof(int64_t));
    t->slot = malloc(size * sizeof(int64_t));
    if (!t->key || !t->prev || !t->next || !t->slot) {
        hostlru_close(t);
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t s = 0; s < size; s++)
        t->slot[s] = -1;
    for (int64_t k = 0; k < cap; k++)
        t->next[k] = k + 1 < cap ? k + 1 : -1;
    t->cap = cap;
    t->mask = size - 1;
    t->head = t->tail = -1;
    t->spare = 0;
    return 0;
}

void hostlru_close(HostLru *t)
{
    free(t->key);
    free(t->prev);
    free(t->next);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

/* the index slot holding h, or the empty slot where it would go */
static uint64_t find_slot(const HostLru *t, int64_t h)
{
    uint64_t i = home_of(t, h);
    while (t->slot[i] >= 0 && t->key[t->slot[i]] != h)
        i = (i + 1) & t->mask;
    return i;
}

int hostlru_has(const HostLru *t, int64_t h) { return t->slot[find_slot(t, h)] >= 0; }

/* the index's slot i emptied (backward-shift deletion: no tombstones) */
static void clear_slot(HostLru *t, uint64_t i)
{
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->slot[j] < 0)
            break;
        const uint64_t home = home_of(t, t->key[t->slot[j]]);
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {   /* its home is not in (i, j]: it moves to i */
            t->slot[i] = t->slot[j];
            i = j;
        }
    }
    t->slot[i] = -1;
}

void hostlru_touch(HostLru *t, int64_t h)
{
    const int64_t k = t->slot[find_slot(t, h)];
    if (k >= 0 && k != t->tail) {
        dlist_unlink(t->prev, t->next, &t->head, &t->tail, k);
        dlist_append(t->prev, t->next, &t->head, &t->tail, k);
    }
}

void hostlru_store(HostLru *t, int64_t h)
{
    uint64_t i = find_slot(t, h);
    if (t->slot[i] >= 0) {
        const int64_t k = t->slot[i];
        if (k != t->tail) {
            dlist_unlink(t->prev, t->next, &t->head, &t->tail, k);
            dlist_append(t->prev, t->next, &t->head, &t->tail, k);
        }
        return;
    }
    if (t->n == t->cap) {   /* full: the least recent goes (before the insert; Python drops it after: the same) */
        const int64_t old = t->head;
        dlist_unlink(t->prev, t->next, &t->head, &t->tail, old);
        clear_slot(t, find_slot(t, t->key[old]));
        t->next[old] = t->spare;
        t->spare = old;
        t->n--;
        t->evicted++;
        i = find_slot(t, h);   /* (the deletion may have shifted the probe run h's slot was in) */
    }
    const int64_t k = t->spare;
    t->spare = t->next[k];
    t->key[k] = h;
    t->slot[i] = k;
    dlist_append(t->prev, t->next, &t->head, &t->tail, k);
    t->n++;
    t->stored++;
}

int hostlru_check(const HostLru *t)
{
    int64_t seen = 0;
    for (int64_t k = t->head, before = -1; k >= 0; before = k, k = t->next[k]) {
        if (t->prev[k] != before || t->slot[find_slot(t, t->key[k])] != k || ++seen > t->cap) {
            PyErr_Format(PyExc_AssertionError, "host tier: node %lld is misplaced", (long long)k);
            return -1;
        }
    }
    int64_t indexed = 0;
    for (uint64_t s = 0; s <= t->mask; s++)
        indexed += t->slot[s] >= 0;
    if (seen != t->n || indexed != t->n || t->n > t->cap) {
        PyErr_Format(PyExc_AssertionError, "host tier: %lld held, %lld listed, %lld indexed, capacity %lld",
                     (long long)t->n, (long long)seen, (long long)indexed, (long long)t->cap);
        return -1;
    }
    return 0;
}
