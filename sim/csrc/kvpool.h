/* A block pool with a prefix cache, for the compiled core (core.c) where block identity matters: what
sim/kv/block_pool.py (ref counts, the free queue) and sim/kv/prefix_cache.py (hash -> block) keep, in
plain arrays.

    free queue:  head -> 2 -> 5 -> 4 -> 7 <- tail    (a doubly linked list over block ids)
    pop takes the head (a cached block there is evicted: its hash forgotten); a block whose last
    reference goes joins the tail; a hit on a free cached block takes it out from where it is.

A cached block is KV_INDEXED (the index maps its hash to it) or KV_OWN (the caller finds it by other
means: core.c's blocks of one request's own content); the pool forgets either kind when it pops it.

Invariants: a block is in the queue exactly when its ref count is 0; ``cached[b] == KV_INDEXED`` exactly
when the index maps ``hash_at[b]`` to b; the index holds at most one entry a block (so it never fills past
half). */
#ifndef KVSIM_KVPOOL_H
#define KVSIM_KVPOOL_H

#include <stdint.h>

enum { KV_UNCACHED = 0, KV_INDEXED = 1, KV_OWN = 2 };

/* splitmix64's finaliser: a bijection of 64-bit values that spreads neighbouring ones */
static inline uint64_t kv_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

typedef struct {
    int64_t num_blocks;
    int64_t *refs;
    int64_t *prev, *next;   /* the free queue's links (-1: none) */
    int64_t head, tail, num_free;
    int8_t *cached;
    int64_t *hash_at;
    int64_t *keys, *vals;   /* the index: open addressing, linear probing; vals -1 where empty */
    uint64_t mask;
    int64_t evicted;        /* cached blocks whose hash was forgotten when taken from the head */
} KvPool;

/* a pool of n blocks, all free in id order; -1 (MemoryError set) on failure */
int kvpool_open(KvPool *p, int64_t n);
void kvpool_close(KvPool *p);
/* the free queue's head, with ref count 1 (its cached hash evicted); the caller checked num_free > 0 */
int64_t kvpool_pop(KvPool *p);
/* one more reference to b (a hit): a free block leaves the queue */
void kvpool_incref(KvPool *p, int64_t b);
/* one reference less: at 0, b joins the queue's tail */
void kvpool_decref(KvPool *p, int64_t b);
/* the block cached under h, or -1 */
int64_t kvpool_find(const KvPool *p, int64_t h);
/* PrefixCache.insert: b becomes findable under h (KV_INDEXED), unless b is cached already or h is another
block's */
void kvpool_insert(KvPool *p, int64_t b, int64_t h);

#endif
