/* Chained block hashes of a run of blocks from one content source (sim/workload/tokens.py block_hashes):
the hashes of the same tuples, Python's bit for bit (made the interpreter's way without building the
tuples where that agrees with the interpreter, else by the interpreter itself). */
#include "native.h"

#include <string.h>

/* hash((parent, key)) for key a new reference (stolen); -1 with an exception set on failure */
static Py_hash_t chain_one(Py_hash_t parent, PyObject *key)
{
    if (key == NULL)
        return -1;
    PyObject *h = PyLong_FromSsize_t(parent);
    if (h == NULL) {
        Py_DECREF(key);
        return -1;
    }
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) {
        Py_DECREF(h);
        Py_DECREF(key);
        return -1;
    }
    PyTuple_SET_ITEM(pair, 0, h);
    PyTuple_SET_ITEM(pair, 1, key);
    Py_hash_t out = PyObject_Hash(pair);
    Py_DECREF(pair);
    return out;
}

/* a new tuple of n items, each a new reference (stolen; NULL items: NULL returned, the rest released) */
static PyObject *pack(int n, PyObject *x0, PyObject *x1, PyObject *x2, PyObject *x3)
{
    PyObject *items[4] = {x0, x1, x2, x3};
    PyObject *t = NULL;
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && items[i] != NULL;
    if (ok)
        t = PyTuple_New(n);
    for (int i = 0; i < n; i++) {
        if (t != NULL)
            PyTuple_SET_ITEM(t, i, items[i]);
        else
            Py_XDECREF(items[i]);
    }
    return t;
}

/* the key of the block starting at token s: (tag, chunks[s // c], s % c) with chunks, else (tag, a, s)
or, with b given, (tag, a, b, s); tag, a and b are held by the caller */
static PyObject *block_key(PyObject *tag, PyObject *a, PyObject *b, long long s, PyObject *chunks, long long c)
{
    Py_INCREF(tag);
    if (chunks != Py_None)
        return pack(3, tag, PySequence_GetItem(chunks, (Py_ssize_t)(s / c)), PyLong_FromLongLong(s % c), NULL);
    Py_INCREF(a);
    if (b == Py_None)
        return pack(3, tag, a, PyLong_FromLongLong(s), NULL);
    Py_INCREF(b);
    return pack(4, tag, a, b, PyLong_FromLongLong(s));
}

/* The interpreter's hash of an int in int64 (hash(x) = x mod 2**61 - 1, the sign kept, -1 -> -2) and of
a tuple of hashed items (CPython's xxHash-based tuplehash, 3.8 on), computed without building the
objects. ``fast_ok`` says whether they agree with the interpreter on probe values (checked once): where
they would not (another interpreter), every hash is made by the interpreter instead. */
static Py_hash_t int_hash(int64_t v)
{
    uint64_t x = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    x %= 0x1FFFFFFFFFFFFFFFULL;
    const Py_hash_t r = v < 0 ? -(Py_hash_t)x : (Py_hash_t)x;
    return r == -1 ? -2 : r;
}

static Py_hash_t tuple_hash(const Py_hash_t *lanes, int n)
{
    const uint64_t p1 = 11400714785074694791ULL, p2 = 14029467366897019727ULL, p5 = 2870177450012600261ULL;
    uint64_t acc = p5;
    for (int i = 0; i < n; i++) {
        acc += (uint64_t)lanes[i] * p2;
        acc = (acc << 31) | (acc >> 33);
        acc *= p1;
    }
    acc += (uint64_t)n ^ (p5 ^ 3527539UL);
    return acc == (uint64_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

static int fast_state;   /* 0: not checked yet, 1: the fast hashes agree, -1: they do not */

static int fast_ok(void)
{
    if (fast_state)
        return fast_state > 0;
    const int64_t probes[] = {0, 1, -1, -2, 7, 511, (int64_t)1 << 61, ((int64_t)1 << 61) - 1, -((int64_t)1 << 62),
                              INT64_MAX, INT64_MIN, 0x5EED, -4611686018427387905LL, 8070450532247928831LL};
    fast_state = 1;
    for (size_t j = 0; j < sizeof probes / sizeof probes[0] && fast_state > 0; j++) {
        PyObject *x = PyLong_FromLongLong(probes[j]);
        PyObject *t = x ? Py_BuildValue("(O(iOO))", x, 3, x, x) : NULL;
        const Py_hash_t hx = x ? PyObject_Hash(x) : -1, ht = t ? PyObject_Hash(t) : -1;
        Py_XDECREF(x);
        Py_XDECREF(t);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            fast_state = -1;
            break;
        }
        const Py_hash_t inner[3] = {3, int_hash(probes[j]), int_hash(probes[j])};
        const Py_hash_t outer[2] = {int_hash(probes[j]), tuple_hash(inner, 3)};
        if (hx != int_hash(probes[j]) || ht != tuple_hash(outer, 2))
            fast_state = -1;
    }
    return fast_state > 0;
}

PyObject *kv_chain_hashes(PyObject *self, PyObject *args)
{
    Py_ssize_t parent, count;
    long long start, step, c;
    PyObject *tag, *a, *b, *chunks, *into = Py_None;
    if (!PyArg_ParseTuple(args, "nOOOLLnOL|O", &parent, &tag, &a, &b, &start, &step, &count, &chunks, &c, &into))
        return NULL;
    if (chunks != Py_None && (!PySequence_Check(chunks) || c <= 0)) {
        PyErr_SetString(PyExc_ValueError, "chain_hashes: chunks must be a sequence and c positive");
        return NULL;
    }
    Py_buffer view;   /* ``into``: an int64 array of count, written instead of a list made */
    int64_t *dst = NULL;
    if (into != Py_None) {
        if (PyObject_GetBuffer(into, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return NULL;
        if (view.itemsize != 8 || !view.format || (strcmp(view.format, "q") && strcmp(view.format, "l"))
            || view.len != count * 8) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "chain_hashes: into must be a writable int64 array of count");
            return NULL;
        }
        dst = view.buf;
    }
    PyObject *out = dst ? PyList_New(0) : PyList_New(count);
    if (out == NULL) {
        if (dst)
            PyBuffer_Release(&view);
        return NULL;
    }
    Py_hash_t h = (Py_hash_t)parent;
    /* the key's items that do not change along the run, hashed once (the fast path) */
    const int fast = count > 1 && fast_ok() && PyLong_Check(tag) && PyLong_Check(a) && (b == Py_None || PyLong_Check(b));
    Py_hash_t lanes[4] = {0, 0, 0, 0};
    if (fast) {
        lanes[0] = PyObject_Hash(tag);
        lanes[1] = PyObject_Hash(a);
        lanes[2] = b == Py_None ? 0 : PyObject_Hash(b);
        if (PyErr_Occurred())
            goto fail;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        const long long s = start + j * step;
        if (fast && chunks == Py_None) {   /* (tag, a, s) or (tag, a, b, s) */
            const int n = b == Py_None ? 3 : 4;
            lanes[n - 1] = int_hash(s);
            const Py_hash_t pair[2] = {int_hash(h), tuple_hash(lanes, n)};
            h = tuple_hash(pair, 2);
        } else if (fast) {   /* (tag, chunks[s // c], s % c): the chunk id hashed by the interpreter */
            PyObject *chunk = PySequence_GetItem(chunks, (Py_ssize_t)(s / c));
            const Py_hash_t hc = chunk ? PyObject_Hash(chunk) : -1;
            Py_XDECREF(chunk);
            if (hc == -1 && PyErr_Occurred())
                goto fail;
            const Py_hash_t key[3] = {lanes[0], hc, int_hash(s % c)};
            const Py_hash_t pair[2] = {int_hash(h), tuple_hash(key, 3)};
            h = tuple_hash(pair, 2);
        } else {
            h = chain_one(h, block_key(tag, a, b, s, chunks, c));
        }
        if (h == -1 && PyErr_Occurred())
            goto fail;
        if (dst) {
            dst[j] = h;
            continue;
        }
        PyObject *v = PyLong_FromSsize_t(h);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(out, j, v);
    }
    if (dst) {   /* the last hash (the parent where count is 0) */
        PyBuffer_Release(&view);
        Py_DECREF(out);
        return PyLong_FromSsize_t(h);
    }
    return out;
fail:
    if (dst)
        PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}
