/* The compiled core's block pool and prefix cache (kvpool.h says what it keeps). */
#include "native.h"
#include "dlist.h"
#include "kvpool.h"

#include <stdlib.h>

static uint64_t slot_of(const KvPool *p, int64_t h)
{
    return kv_mix64((uint64_t)h) & p->mask;   /* (mixed: Python's hashes of small tuples may cluster) */
}

int kvpool_open(KvPool *p, int64_t n)
{
    memset(p, 0, sizeof *p);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)(n > 0 ? n : 1))
        cap *= 2;
    const size_t m = n > 0 ? (size_t)n : 1;
    p->refs = calloc(m, sizeof(int64_t));
    p->prev = malloc(m * sizeof(int64_t));
    p->next = malloc(m * sizeof(int64_t));
    p->cached = calloc(m, 1);
    p->hash_at = calloc(m, sizeof(int64_t));
    p->keys = malloc(cap * sizeof(int64_t));
    p->vals = malloc(cap * sizeof(int64_t));
    if (!p->refs || !p->prev || !p->next || !p->cached || !p->hash_at || !p->keys || !p->vals) {
        kvpool_close(p);
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t s = 0; s < cap; s++)
        p->vals[s] = -1;
    p->mask = cap - 1;
    p->num_blocks = n;
    for (int64_t b = 0; b < n; b++) {
        p->prev[b] = b - 1;
        p->next[b] = b + 1 < n ? b + 1 : -1;
    }
    p->head = n > 0 ? 0 : -1;
    p->tail = n - 1;
    p->num_free = n;
    return 0;
}

void kvpool_close(KvPool *p)
{
    void *bufs[] = {p->refs, p->prev, p->next, p->cached, p->hash_at, p->keys, p->vals};
    for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
        free(bufs[j]);
    memset(p, 0, sizeof *p);
}

static void unlink_block(KvPool *p, int64_t b)
{
    dlist_unlink(p->prev, p->next, &p->head, &p->tail, b);
    p->num_free--;
}

/* the index's entry for h removed (backward-shift deletion: no tombstones) */
static void forget(KvPool *p, int64_t h)
{
    uint64_t i = slot_of(p, h);
    while (p->vals[i] >= 0 && p->keys[i] != h)
        i = (i + 1) & p->mask;
    if (p->vals[i] < 0)
        return;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        if (p->vals[j] < 0)
            break;
        const uint64_t home = slot_of(p, p->keys[j]);
        if (((j - home) & p->mask) >= ((j - i) & p->mask)) {   /* its home is not in (i, j]: it moves to i */
            p->keys[i] = p->keys[j];
            p->vals[i] = p->vals[j];
            i = j;
        }
    }
    p->vals[i] = -1;
}

int64_t kvpool_pop(KvPool *p)
{
    const int64_t b = p->head;
    unlink_block(p, b);
    p->refs[b] = 1;
    if (p->cached[b]) {
        if (p->cached[b] == KV_INDEXED)
            forget(p, p->hash_at[b]);
        p->cached[b] = KV_UNCACHED;
        p->evicted++;
    }
    return b;
}

void kvpool_incref(KvPool *p, int64_t b)
{
    if (p->refs[b] == 0)
        unlink_block(p, b);
    p->refs[b]++;
}

void kvpool_decref(KvPool *p, int64_t b)
{
    if (--p->refs[b] > 0)
        return;
    dlist_append(p->prev, p->next, &p->head, &p->tail, b);
    p->num_free++;
}

int64_t kvpool_find(const KvPool *p, int64_t h)
{
    uint64_t i = slot_of(p, h);
    while (p->vals[i] >= 0) {
        if (p->keys[i] == h)
            return p->vals[i];
        i = (i + 1) & p->mask;
    }
    return -1;
}

void kvpool_insert(KvPool *p, int64_t b, int64_t h)
{
    if (p->cached[b])
        return;
    uint64_t i = slot_of(p, h);
    while (p->vals[i] >= 0) {
        if (p->keys[i] == h)
            return;   /* another block holds h: b stays private */
        i = (i + 1) & p->mask;
    }
    p->keys[i] = h;
    p->vals[i] = b;
    p->cached[b] = KV_INDEXED;
    p->hash_at[b] = h;
}
