/* First-fit allocation of runs of blocks over a linear space, for the compiled core's contiguous allocators
(core.c): what sim/kv/contiguous.py's ExtentAllocator keeps, in plain arrays.

    blocks:  0 ....... 7 | 8 ..... 11 | 12 .... 15 | 16 ........... 23 | 24 .. 31
             region      |   free     | region     |  region           |  free
    free extents: (8, 4), (24, 8), sorted by start; a run given back merges with free neighbours.

Invariants: the free extents are sorted by start, disjoint and never adjacent (merged), and add up to
``num_free``; ``largest`` is the longest of them, or -1 while stale. */
#ifndef KVSIM_EXTENTS_H
#define KVSIM_EXTENTS_H

#include <Python.h>
#include <stdint.h>

typedef struct {
    int64_t *start, *len;   /* the free extents, ``n`` of them, room for ``cap`` */
    Py_ssize_t n, cap;
    int64_t num_free, largest;
} Extents;

/* the space of ``num_blocks`` blocks all free, with room for ``cap`` extents (the most runs held, plus
one); -1 (MemoryError set) on failure */
int extents_open(Extents *e, int64_t num_blocks, Py_ssize_t cap);
void extents_close(Extents *e);
/* ExtentAllocator.allocate: the lowest start of ``n`` free blocks in a row (taken), or -1 */
int64_t extents_take(Extents *e, int64_t n);
/* ExtentAllocator.free: blocks start .. start + n - 1 back, merged with free neighbours; -1 (an
AssertionError set) where the run overlaps a free one or the room for extents is spent */
int extents_give(Extents *e, int64_t start, int64_t n);
/* ExtentAllocator.largest_free */
int64_t extents_largest(Extents *e);

#endif
