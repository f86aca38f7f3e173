/* What a run leaves behind: its counters after finishes, its inter-token gaps' test, and the recorder's
rows (sim/sched/decode_run_apply.py, sim/metrics.py Columns). */
#include "native.h"

#define MAX_COLUMNS 64

PyObject *kv_finish_counters(PyObject *self, PyObject *args)
{
    PyObject *rows, *used_o, *beyond_o, *logical_o, *alive_o, *table_o;
    Py_ssize_t k, m;
    long long held0, bs, num_blocks;
    if (!PyArg_ParseTuple(args, "O!nOOOOLLLnO", &PyList_Type, &rows, &k, &used_o, &beyond_o, &logical_o, &alive_o,
                          &held0, &bs, &num_blocks, &m, &table_o))
        return NULL;
    Ints used, beyond, logical, alive;
    Ints *all[4] = {&used, &beyond, &logical, &alive};
    PyObject *objs[4] = {used_o, beyond_o, logical_o, alive_o};
    const char *names[4] = {"used", "beyond", "logical", "alive"};
    Py_buffer tv = {0};
    int have_t = 0;
    int64_t *freed = NULL;
    PyObject *result = NULL;
    for (int i = 0; i < 4; i++)
        all[i]->held = 0;
    for (int i = 0; i < 4; i++)
        if (ints_open(all[i], objs[i], k, names[i]) < 0)
            goto done;
    if (m < 0 || m > k) {
        PyErr_SetString(PyExc_ValueError, "finish_counters: m must be in 0..k");
        goto done;
    }
    if (get_buffer(table_o, &tv, "q", 8, 5 * m, "table") < 0) {
        PyErr_Clear();
        if (get_buffer(table_o, &tv, "l", 8, 5 * m, "table") < 0)
            goto done;
    }
    have_t = 1;
    freed = PyMem_Calloc(4 * (k ? k : 1), sizeof(int64_t));   /* per step: used, beyond, logical, held freed */
    if (!freed) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(rows); r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 5) {
            PyErr_SetString(PyExc_ValueError, "finish_counters: rows of (step, used, beyond, logical, held) expected");
            goto done;
        }
        long long j = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 0));
        if (j < 0 || j >= k) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "finish_counters: a row's step is outside the run");
            goto done;
        }
        for (int c = 0; c < 4; c++) {
            freed[4 * j + c] = PyLong_AsLongLong(PyTuple_GET_ITEM(row, c + 1));
        }
        if (PyErr_Occurred())
            goto done;
    }
    /* before step j's finishes (sums, peaks): counters less what steps < j freed; the rows (after step j's
       finishes): less what steps <= j freed */
    int64_t gone[4] = {0, 0, 0, 0}, alive_sum = 0, used_sum = 0, logical_sum = 0, used_max = 0, logical_max = 0;
    int64_t *t = (int64_t *)tv.buf;
    const Py_ssize_t stride = tv.len / 8 / 5;
    for (Py_ssize_t j = 0; j < k; j++) {
        const int64_t up = ints_at(&used, j) - gone[0], lp = ints_at(&logical, j) - gone[2];
        const int64_t a = ints_at(&alive, j);
        used_sum += up;
        logical_sum += lp;
        if (j == 0 || up > used_max)
            used_max = up;
        if (j == 0 || lp > logical_max)
            logical_max = lp;
        alive_sum += a;
        for (int c = 0; c < 4; c++)
            gone[c] += freed[4 * j + c];
        if (j < m) {
            const int64_t u = ints_at(&used, j) - gone[0], b = ints_at(&beyond, j) - gone[1];
            const int64_t ts = held0 + alive_sum - gone[3];
            t[j] = u;
            t[stride + j] = ts;
            t[2 * stride + j] = u * bs - ts - b;
            t[3 * stride + j] = b;
            t[4 * stride + j] = (num_blocks - u) * bs;
        }
    }
    result = Py_BuildValue("(LLLLL)", (long long)alive_sum, (long long)used_sum, (long long)logical_sum,
                           (long long)used_max, (long long)logical_max);
done:
    PyMem_Free(freed);
    for (int i = 0; i < 4; i++)
        ints_close(all[i]);
    if (have_t)
        PyBuffer_Release(&tv);
    return result;
}

PyObject *kv_step_backs(PyObject *self, PyObject *args)
{
    PyObject *ends_o, *d_o;
    if (!PyArg_ParseTuple(args, "OO", &ends_o, &d_o))
        return NULL;
    Py_buffer dv, ev;
    if (doubles_open(&dv, d_o, 1, "durations") < 0)
        return NULL;
    const Py_ssize_t k = dv.shape[0];
    if (doubles_open(&ev, ends_o, k + 1, "ends") < 0) {
        PyBuffer_Release(&dv);
        return NULL;
    }
    Py_ssize_t irregular = 0;
    for (Py_ssize_t j = 1; j < k; j++)
        if (!(AT(ev, j + 1) - AT(dv, j) == AT(ev, j)))   /* update's step start, now - duration, is not the last end */
            irregular++;
    const double back0 = AT(ev, 1) - AT(dv, 0);
    PyBuffer_Release(&dv);
    PyBuffer_Release(&ev);
    return Py_BuildValue("(dn)", back0, irregular);
}

PyObject *kv_put_columns(PyObject *self, PyObject *args)
{
    PyObject *chunk_obj, *cols;
    Py_ssize_t at, m;
    if (!PyArg_ParseTuple(args, "OnnO", &chunk_obj, &at, &m, &cols))
        return NULL;
    PyObject *seq = PySequence_Fast(cols, "put_columns: cols must be a sequence");
    if (!seq)
        return NULL;
    Py_buffer cv;
    if (PyObject_GetBuffer(chunk_obj, &cv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    Py_buffer views[MAX_COLUMNS];
    double values[MAX_COLUMNS];
    char kind[MAX_COLUMNS];   /* 'a' an array, 's' a scalar to write, '0' a zero (already there) */
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    int ok = cv.ndim == 2 && cv.itemsize == 8 && cv.format && cv.format[0] == 'd' && ncols <= cv.shape[0]
             && ncols <= MAX_COLUMNS && at >= 0 && m >= 0 && at + m <= cv.shape[1];
    /* first every column is checked (nothing is written unless all can be: the caller falls back) */
    for (Py_ssize_t i = 0; ok && i < ncols; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(seq, i);
        if (PyObject_CheckBuffer(c)) {
            if (PyObject_GetBuffer(c, &views[held], PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
                PyErr_Clear();
                ok = 0;
                break;
            }
            Py_buffer *v = &views[held++];
            char f = v->format ? v->format[0] : 0;
            if (v->itemsize != 8 || (f != 'd' && f != 'q' && f != 'l') || v->ndim > 1
                || (v->ndim == 1 && v->shape[0] != m)) {
                ok = 0;
                break;
            }
            if (v->ndim == 1) {
                kind[i] = 'a';
                continue;
            }
            double x = f == 'd' ? *(double *)v->buf : (double)*(int64_t *)v->buf;   /* a numpy scalar */
            values[i] = x;
            kind[i] = x != 0.0 || isnan(x) ? 's' : '0';
            PyBuffer_Release(v);
            held--;
            continue;
        }
        double x = PyFloat_AsDouble(c);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        values[i] = x;
        kind[i] = x != 0.0 || isnan(x) ? 's' : '0';   /* (a Python 0 or 0.0 is falsy: left as it is) */
    }
    if (ok) {
        const Py_ssize_t row = cv.shape[1];
        Py_ssize_t h = 0;
        for (Py_ssize_t i = 0; i < ncols; i++) {
            double *dst = (double *)cv.buf + i * row + at;
            if (kind[i] == 'a') {
                Py_buffer *v = &views[h++];
                const char *src = (const char *)v->buf;
                const Py_ssize_t st = v->strides[0];
                if (v->format[0] == 'd')
                    for (Py_ssize_t j = 0; j < m; j++)
                        dst[j] = *(const double *)(src + j * st);
                else
                    for (Py_ssize_t j = 0; j < m; j++)
                        dst[j] = (double)*(const int64_t *)(src + j * st);
            } else if (kind[i] == 's') {
                for (Py_ssize_t j = 0; j < m; j++)
                    dst[j] = values[i];
            }
        }
    }
    result = PyBool_FromLong(ok);
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyBuffer_Release(&cv);
    Py_DECREF(seq);
    return result;
}

PyObject *kv_put_rows(PyObject *self, PyObject *args)
{
    PyObject *chunk_obj, *rows;
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "OnO!", &chunk_obj, &at, &PyList_Type, &rows))
        return NULL;
    Py_buffer cv;
    if (PyObject_GetBuffer(chunk_obj, &cv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    const Py_ssize_t r = PyList_GET_SIZE(rows);
    int ok = cv.ndim == 2 && cv.itemsize == 8 && cv.format && cv.format[0] == 'd' && at >= 0
             && at + r <= cv.shape[1];
    const Py_ssize_t width = ok ? cv.shape[0] : 0;
    const Py_ssize_t count = r * width > 0 ? r * width : 1;
    double *values = ok ? PyMem_Malloc(count * sizeof(double)) : NULL;
    if (ok && !values) {
        PyBuffer_Release(&cv);
        return PyErr_NoMemory();
    }
    /* every value converted first (as float() would): nothing is written unless all are numbers */
    for (Py_ssize_t j = 0; ok && j < r; j++) {
        PyObject *row = PyList_GET_ITEM(rows, j);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != width) {
            ok = 0;
            break;
        }
        for (Py_ssize_t i = 0; i < width; i++) {
            double x = PyFloat_AsDouble(PyTuple_GET_ITEM(row, i));
            if (x == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                ok = 0;
                break;
            }
            values[j * width + i] = x;
        }
    }
    if (ok) {
        const Py_ssize_t len = cv.shape[1];
        double *base = (double *)cv.buf;
        for (Py_ssize_t i = 0; i < width; i++)
            for (Py_ssize_t j = 0; j < r; j++)
                base[i * len + at + j] = values[j * width + i];
    }
    PyMem_Free(values);
    PyBuffer_Release(&cv);
    return PyBool_FromLong(ok);
}
