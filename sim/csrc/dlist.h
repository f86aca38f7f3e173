/* A doubly linked list over the ids 0..n-1 of a set of arrays (``prev``, ``next``; -1: none), from ``head``
to ``tail``: the free queue of kvpool.c, the LRU order of hostlru.c. */
#ifndef KVSIM_DLIST_H
#define KVSIM_DLIST_H

#include <stdint.h>

/* k taken out of the list */
static inline void dlist_unlink(int64_t *prev, int64_t *next, int64_t *head, int64_t *tail, int64_t k)
{
    const int64_t a = prev[k], c = next[k];
    if (a >= 0)
        next[a] = c;
    else
        *head = c;
    if (c >= 0)
        prev[c] = a;
    else
        *tail = a;
}

/* k put at the tail */
static inline void dlist_append(int64_t *prev, int64_t *next, int64_t *head, int64_t *tail, int64_t k)
{
    prev[k] = *tail;
    next[k] = -1;
    if (*tail >= 0)
        next[*tail] = k;
    else
        *head = k;
    *tail = k;
}

#endif
