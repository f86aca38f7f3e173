/* The prefix cache's host tier for the compiled core (core.c): sim/kv/host_tier.py's least-recently-used
set of block hashes, at most ``cap`` of them, in plain arrays.

    list:   head (least recent) -> n3 -> n0 -> n7 <- tail (most recent)   (a doubly linked list of nodes)
    index:  hash -> node (open addressing, linear probing, backward-shift deletion)

A node is a slot for one hash; a free node waits on ``spare``. Invariants: ``n <= cap``; the index maps
each held hash to its node, and nothing else; the list holds exactly the held nodes. */
#ifndef KVSIM_HOSTLRU_H
#define KVSIM_HOSTLRU_H

#include <stdint.h>

typedef struct {
    int64_t cap, n;
    int64_t *key;            /* node -> its hash */
    int64_t *prev, *next;    /* the list's links (-1: none); ``next`` also chains the spare nodes */
    int64_t head, tail, spare;
    int64_t *slot;           /* the index: node or -1 */
    uint64_t mask;
    int64_t stored, evicted; /* HostTier's counters of the same names */
} HostLru;

/* an empty tier of cap >= 1 hashes; -1 (MemoryError set) on failure */
int hostlru_open(HostLru *t, int64_t cap);
void hostlru_close(HostLru *t);
/* whether the tier holds h */
int hostlru_has(const HostLru *t, int64_t h);
/* HostTier.store of one hash: it becomes the most recent; beyond cap the least recent goes */
void hostlru_store(HostLru *t, int64_t h);
/* HostTier.touch of one hash: held, it becomes the most recent */
void hostlru_touch(HostLru *t, int64_t h);
/* -1 (an AssertionError set) where the list, the index and the count disagree */
int hostlru_check(const HostLru *t);

#endif
