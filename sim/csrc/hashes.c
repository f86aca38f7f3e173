/* Chained block hashes of a run of blocks from one content source (sim/workload/tokens.py block_hashes):
the same tuples hashed by the interpreter's own hash, so the values are Python's, bit for bit. */
#include "native.h"

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

PyObject *kv_chain_hashes(PyObject *self, PyObject *args)
{
    Py_ssize_t parent, count;
    long long start, step, c;
    PyObject *tag, *a, *b, *chunks;
    if (!PyArg_ParseTuple(args, "nOOOLLnOL", &parent, &tag, &a, &b, &start, &step, &count, &chunks, &c))
        return NULL;
    if (chunks != Py_None && (!PySequence_Check(chunks) || c <= 0)) {
        PyErr_SetString(PyExc_ValueError, "chain_hashes: chunks must be a sequence and c positive");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    Py_hash_t h = (Py_hash_t)parent;
    for (Py_ssize_t j = 0; j < count; j++) {
        h = chain_one(h, block_key(tag, a, b, start + j * step, chunks, c));
        if (h == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *v = PyLong_FromSsize_t(h);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, v);
    }
    return out;
}
