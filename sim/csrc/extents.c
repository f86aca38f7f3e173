/* First-fit extents over a linear block space (extents.h). */
#include "extents.h"

#include <stdlib.h>
#include <string.h>

int extents_open(Extents *e, int64_t num_blocks, Py_ssize_t cap)
{
    memset(e, 0, sizeof *e);
    e->cap = cap > 1 ? cap : 1;
    e->start = malloc(e->cap * sizeof(int64_t));
    e->len = malloc(e->cap * sizeof(int64_t));
    if (!e->start || !e->len) {
        extents_close(e);
        PyErr_NoMemory();
        return -1;
    }
    if (num_blocks > 0) {
        e->start[0] = 0;
        e->len[0] = num_blocks;
        e->n = 1;
    }
    e->num_free = e->largest = num_blocks > 0 ? num_blocks : 0;
    return 0;
}

void extents_close(Extents *e)
{
    free(e->start);
    free(e->len);
    e->start = e->len = NULL;
    e->n = 0;
}

/* drop extent j (``remove``) or open a slot at j, shifting those after it */
static void shift(Extents *e, Py_ssize_t j, int remove)
{
    const size_t tail = (size_t)(e->n - j - (remove ? 1 : 0)) * sizeof(int64_t);
    if (remove) {
        memmove(e->start + j, e->start + j + 1, tail);
        memmove(e->len + j, e->len + j + 1, tail);
        e->n--;
    } else {
        memmove(e->start + j + 1, e->start + j, tail);
        memmove(e->len + j + 1, e->len + j, tail);
        e->n++;
    }
}

int64_t extents_take(Extents *e, int64_t n)
{
    for (Py_ssize_t j = 0; j < e->n; j++) {
        if (e->len[j] < n)
            continue;
        const int64_t at = e->start[j];
        if (e->len[j] == n) {
            shift(e, j, 1);
        } else {
            e->start[j] += n;
            e->len[j] -= n;
        }
        e->num_free -= n;
        e->largest = -1;
        return at;
    }
    return -1;
}

int extents_give(Extents *e, int64_t start, int64_t n)
{
    Py_ssize_t j = 0;   /* the first free extent after the run */
    while (j < e->n && e->start[j] < start)
        j++;
    if ((j < e->n && start + n > e->start[j]) || (j > 0 && e->start[j - 1] + e->len[j - 1] > start)) {
        PyErr_Format(PyExc_AssertionError, "extents: freeing blocks %lld..%lld overlaps a free extent",
                     (long long)start, (long long)(start + n - 1));
        return -1;
    }
    const int right = j < e->n && start + n == e->start[j];
    const int left = j > 0 && e->start[j - 1] + e->len[j - 1] == start;
    if (left && right) {
        e->len[j - 1] += n + e->len[j];
        shift(e, j, 1);
    } else if (left) {
        e->len[j - 1] += n;
    } else if (right) {
        e->start[j] = start;
        e->len[j] += n;
    } else {
        if (e->n == e->cap) {
            PyErr_SetString(PyExc_AssertionError, "extents: more free extents than runs held allow");
            return -1;
        }
        shift(e, j, 0);
        e->start[j] = start;
        e->len[j] = n;
    }
    e->num_free += n;
    e->largest = -1;
    return 0;
}

int64_t extents_largest(Extents *e)
{
    if (e->largest < 0) {
        e->largest = 0;
        for (Py_ssize_t j = 0; j < e->n; j++)
            if (e->len[j] > e->largest)
                e->largest = e->len[j];
    }
    return e->largest;
}
