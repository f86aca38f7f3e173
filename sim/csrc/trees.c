/* trees.c: a stored tree ensemble's prediction over rows of features (sim/executors/tree_ensemble.py
TreeEnsemble.predict, bit for bit: each row walks every tree to its leaf, the leaves summed in tree order
from 0, then added to the base, as numpy sums the trees x rows matrix over its first axis). */
#include "native.h"

PyObject *kv_tree_predict(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *x_obj, *off_obj, *feat_obj, *thr_obj, *val_obj, *left_obj, *right_obj;
    Py_ssize_t rows, nf, trees, nodes;
    double base;
    if (!PyArg_ParseTuple(args, "OOnnOnOOOOOnd", &out_obj, &x_obj, &rows, &nf, &off_obj, &trees, &feat_obj,
                          &thr_obj, &val_obj, &left_obj, &right_obj, &nodes, &base))
        return NULL;
    if (rows < 0 || nf < 1 || trees < 0 || nodes < 0) {
        PyErr_SetString(PyExc_ValueError, "tree_predict: negative sizes or no features");
        return NULL;
    }
    Py_buffer out, x, off, feat, thr, val, left, right;
    Py_buffer *held[8] = {&out, &x, &off, &feat, &thr, &val, &left, &right};
    int n_held = 0;
    PyObject *objs[8] = {out_obj, x_obj, off_obj, feat_obj, thr_obj, val_obj, left_obj, right_obj};
    const char *fmts[8] = {"d", "d", "q", "q", "d", "d", "q", "q"};
    const char *names[8] = {"out", "x", "offsets", "feature", "threshold", "value", "left", "right"};
    Py_ssize_t sizes[8] = {rows, rows * nf, trees, nodes, nodes, nodes, nodes, nodes};
    for (int i = 0; i < 8; i++) {
        if (get_buffer(objs[i], held[i], fmts[i], 8, sizes[i], names[i]) < 0)
            goto fail;
        n_held++;
    }
    const int64_t *o = off.buf, *f = feat.buf, *l = left.buf, *r = right.buf;
    const double *xs = x.buf, *t = thr.buf, *v = val.buf;
    for (Py_ssize_t j = 0; j < trees; j++) {   /* every index in range before anything is written */
        if (o[j] < 0 || o[j] >= nodes)
            goto bad;
    }
    for (Py_ssize_t k = 0; k < nodes; k++) {
        if (f[k] < 0 || f[k] >= nf || l[k] < 0 || l[k] >= nodes || r[k] < 0 || r[k] >= nodes)
            goto bad;
    }
    double *dst = out.buf;   /* the running sums, tree after tree (one tree's nodes stay in cache) */
    for (Py_ssize_t i = 0; i < rows; i++)
        dst[i] = 0.0;
    for (Py_ssize_t j = 0; j < trees; j++) {
        for (Py_ssize_t i = 0; i < rows; i++) {
            const double *row = xs + i * nf;
            int64_t k = o[j];
            for (Py_ssize_t depth = 0; depth <= nodes; depth++) {   /* a leaf leads to itself both ways */
                int64_t next = row[f[k]] <= t[k] ? l[k] : r[k];
                if (next == k)
                    break;
                k = next;
            }
            dst[i] += v[k];
        }
    }
    for (Py_ssize_t i = 0; i < rows; i++)
        dst[i] = base + dst[i];
    for (int i = 0; i < n_held; i++)
        PyBuffer_Release(held[i]);
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_ValueError, "tree_predict: a tree's offset, feature or child index is out of range");
fail:
    for (int i = 0; i < n_held; i++)
        PyBuffer_Release(held[i]);
    return NULL;
}
