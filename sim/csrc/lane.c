/* The decode lane's finishes (sim/sched/decode_lane.py): lane_finished finds the decodes that sampled
their last token, lane_compact copies the lane's columns without them into a new array and finds the
fewest tokens the others have left. What numpy's comparison, nonzero, boolean take and minimum do, in
two calls. Given k, lane_compact also moves the kept decodes k tokens on (computed and generated + k:
a decode run's DecodeLane.advance). */
#include "native.h"

#define FEWEST_NONE ((int64_t)1 << 62)   /* DecodeLane._fewest_left of an empty lane */

PyObject *kv_lane_finished(PyObject *self, PyObject *args)
{
    PyObject *gen_o, *out_o;
    if (!PyArg_ParseTuple(args, "OO", &gen_o, &out_o))
        return NULL;
    Ints gen = {.held = 0}, out = {.held = 0};
    PyObject *at = PyList_New(0), *result = NULL;
    if (!at || ints_open(&gen, gen_o, 0, "gen") < 0 || ints_open(&out, out_o, 0, "out") < 0)
        goto done;
    const Py_ssize_t n = gen.view.shape[0];
    if (out.view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "lane_finished: gen and out of one length expected");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ints_at(&gen, i) < ints_at(&out, i))
            continue;
        PyObject *pi = PyLong_FromSsize_t(i);
        if (!pi || PyList_Append(at, pi) < 0) {
            Py_XDECREF(pi);
            goto done;
        }
        Py_DECREF(pi);
    }
    result = Py_NewRef(at);
done:
    Py_XDECREF(at);
    ints_close(&gen);
    ints_close(&out);
    return result;
}

PyObject *kv_lane_compact(PyObject *self, PyObject *args)
{
    PyObject *cols_o, *at_o, *new_o;
    long long k = 0;
    if (!PyArg_ParseTuple(args, "OO!O|L", &cols_o, &PyList_Type, &at_o, &new_o, &k))
        return NULL;
    if (k < 0) {
        PyErr_SetString(PyExc_ValueError, "lane_compact: k must be >= 0");
        return NULL;
    }
    const Py_ssize_t m = PyList_GET_SIZE(at_o);
    Py_buffer cv, nv;
    if (get_buffer(cols_o, &cv, "l", 8, 0, "cols") < 0)
        return NULL;
    if (get_buffer(new_o, &nv, "l", 8, 0, "new") < 0) {
        PyBuffer_Release(&cv);
        return NULL;
    }
    PyObject *result = NULL;
    const Py_ssize_t n = cv.len / 8 / 5, kept = n - m;
    if (cv.ndim != 2 || cv.shape[0] != 5 || nv.ndim != 2 || nv.shape[0] != 5 || nv.shape[1] != kept) {
        PyErr_SetString(PyExc_ValueError, "lane_compact: cols (5 x n) and new (5 x (n - len(at))) expected");
        goto done;
    }
    const int64_t *c = (const int64_t *)cv.buf;
    int64_t *o = (int64_t *)nv.buf;
    /* checked first: the positions ascending and inside the lane */
    Py_ssize_t prev = -1;
    for (Py_ssize_t e = 0; e < m; e++) {
        const Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(at_o, e));
        if (i == -1 && PyErr_Occurred())
            goto done;
        if (i <= prev || i >= n) {
            PyErr_SetString(PyExc_ValueError, "lane_compact: at must be ascending positions in the lane");
            goto done;
        }
        prev = i;
    }
    long long gone = 0;
    int64_t fewest = FEWEST_NONE;
    Py_ssize_t j = 0, e = 0, next = m ? PyLong_AsSsize_t(PyList_GET_ITEM(at_o, 0)) : n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == next) {   /* a finished decode: its context leaves the sum */
            gone += c[n + i];
            e++;
            next = e < m ? PyLong_AsSsize_t(PyList_GET_ITEM(at_o, e)) : n;
            continue;
        }
        for (int r = 0; r < 5; r++)
            o[r * kept + j] = c[r * n + i];
        o[kept + j] += k;       /* COMP */
        o[2 * kept + j] += k;   /* GEN */
        const int64_t left = o[3 * kept + j] - o[2 * kept + j];   /* OUT - GEN */
        if (left < fewest)
            fewest = left;
        j++;
    }
    result = Py_BuildValue("(LL)", (long long)fewest, gone);
done:
    PyBuffer_Release(&cv);
    PyBuffer_Release(&nv);
    return result;
}
