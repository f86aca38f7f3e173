/* Sorting weighted values that repeat: the inter-token gaps' (step duration, tokens) pairs, where a run of
a million steps holds a few tens of thousands of distinct durations (sim/metrics.py ``_stats``).

sort_pairs writes the pairs in the order numpy's stable argsort of the values gives (ascending, equal
values in their input order; -0.0 equal to 0.0): it groups equal values through a hash table, sorts the
distinct values and places each pair at its group's next free position, in input order. That is linear in
the pairs plus a sort of the distinct values, where a comparison sort of every pair is n log n. */
#include "native.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double value;
    int32_t group;
} Distinct;

static int by_value(const void *a, const void *b)
{
    const double x = ((const Distinct *)a)->value, y = ((const Distinct *)b)->value;
    return (x > y) - (x < y);
}

/* the bits of v with -0.0 as 0.0 (equal values, one key) */
static inline uint64_t key_of(double v)
{
    uint64_t bits;
    if (v == 0.0)
        v = 0.0;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

/* the open-addressing table from a value's key to its group, at most half full (grown by doubling) */
typedef struct {
    uint64_t *keys;
    int32_t *group;   /* -1: an empty slot */
    size_t cap;
    int shift;        /* the slot is the hash's top bits (Fibonacci hashing): 64 - log2(cap) */
} Groups;

static int groups_init(Groups *t, size_t cap, int shift)
{
    t->keys = malloc(cap * sizeof(uint64_t));
    t->group = malloc(cap * sizeof(int32_t));
    t->cap = cap;
    t->shift = shift;
    if (!t->keys || !t->group)
        return -1;
    for (size_t j = 0; j < cap; j++)
        t->group[j] = -1;
    return 0;
}

static inline size_t groups_slot(const Groups *t, uint64_t key)
{
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> t->shift);
    while (t->group[h] >= 0 && t->keys[h] != key)
        h = (h + 1) & (t->cap - 1);
    return h;
}

static int groups_grow(Groups *t)
{
    Groups bigger;
    if (groups_init(&bigger, t->cap * 2, t->shift - 1) < 0) {
        free(bigger.keys);
        free(bigger.group);
        return -1;
    }
    for (size_t j = 0; j < t->cap; j++)
        if (t->group[j] >= 0) {
            const size_t h = groups_slot(&bigger, t->keys[j]);
            bigger.keys[h] = t->keys[j];
            bigger.group[h] = t->group[j];
        }
    free(t->keys);
    free(t->group);
    *t = bigger;
    return 0;
}

/* the pairs' order into xs_out, ws_out; 0 where there are more than ``limit`` distinct values or a NaN
(nothing written; also where 60% of the first 65,536 are distinct), -1 on a memory error */
static int sort_pairs(const double *x, const double *w, Py_ssize_t n, Py_ssize_t limit, double *xs_out,
                      double *ws_out)
{
    Groups table;
    const int built = groups_init(&table, 4096, 52);
    int32_t *group_of = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    Distinct *distinct = malloc((size_t)limit * sizeof(Distinct));
    Py_ssize_t *next = malloc((size_t)limit * sizeof(Py_ssize_t));
    int ok = -1;
    if (built < 0 || !group_of || !distinct || !next)
        goto done;
    int32_t groups = 0;
    ok = 0;
    /* values nearly all distinct give up early: after the first 65,536, more than 60% of them distinct (a run's
       durations repeat more and more as it goes on: 27% there for 5% in all on the Azure hour's 8 replicas) */
    const Py_ssize_t probe = 65536;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (isnan(x[i]) || (i == probe && (int64_t)groups * 5 > (int64_t)probe * 3))
            goto done;
        const uint64_t key = key_of(x[i]);
        size_t h = groups_slot(&table, key);
        if (table.group[h] < 0) {
            if (groups == limit)
                goto done;
            if ((size_t)(groups + 1) * 2 > table.cap) {
                if (groups_grow(&table) < 0) {
                    ok = -1;
                    goto done;
                }
                h = groups_slot(&table, key);
            }
            table.keys[h] = key;
            table.group[h] = groups;
            distinct[groups] = (Distinct){x[i], groups};
            next[groups] = 0;
            groups++;
        }
        group_of[i] = table.group[h];
        next[table.group[h]]++;   /* (its size, for now) */
    }
    qsort(distinct, (size_t)groups, sizeof(Distinct), by_value);
    Py_ssize_t at = 0;   /* each group's first position, in value order */
    for (int32_t r = 0; r < groups; r++) {
        const int32_t g = distinct[r].group;
        const Py_ssize_t size = next[g];
        next[g] = at;
        at += size;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const Py_ssize_t p = next[group_of[i]]++;
        xs_out[p] = x[i];
        ws_out[p] = w[i];
    }
    ok = 1;
done:
    if (ok < 0)
        PyErr_NoMemory();
    free(table.keys);
    free(table.group);
    free(group_of);
    free(distinct);
    free(next);
    return ok;
}

PyObject *kv_sort_pairs(PyObject *self, PyObject *args)
{
    PyObject *x_o, *w_o, *xs_o, *ws_o;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOOOn", &x_o, &w_o, &xs_o, &ws_o, &limit))
        return NULL;
    if (limit < 1 || limit > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "sort_pairs: limit must be in 1 .. 2**31 - 1");
        return NULL;
    }
    Py_buffer xv, wv, xsv, wsv;
    if (PyObject_GetBuffer(x_o, &xv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    const Py_ssize_t n = xv.len / 8;
    if (xv.itemsize != 8 || !xv.format || xv.format[0] != 'd') {
        PyBuffer_Release(&xv);
        PyErr_SetString(PyExc_ValueError, "sort_pairs: x must be a C-contiguous float64 array");
        return NULL;
    }
    if (PyObject_GetBuffer(w_o, &wv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    if (wv.itemsize != 8 || !wv.format || wv.format[0] != 'd' || wv.len != xv.len) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&wv);
        PyErr_SetString(PyExc_ValueError, "sort_pairs: w must be a C-contiguous float64 array as long as x");
        return NULL;
    }
    if (get_buffer(xs_o, &xsv, "d", 8, n, "xs_out") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&wv);
        return NULL;
    }
    if (get_buffer(ws_o, &wsv, "d", 8, n, "ws_out") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&wv);
        PyBuffer_Release(&xsv);
        return NULL;
    }
    const int ok = sort_pairs(xv.buf, wv.buf, n, limit, xsv.buf, wsv.buf);
    PyBuffer_Release(&xv);
    PyBuffer_Release(&wv);
    PyBuffer_Release(&xsv);
    PyBuffer_Release(&wsv);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}
