/* A run's requests (sim/sched/decode_run.py, decode_run_apply.py): batch_columns reads their counters
and table lengths into int64 columns as a run is planned; write_counters writes the counters of those
that did not finish back when it is applied. The decode lane's (sim/sched/decode_lane.py): lane_columns
reads them into the lane's arrays as it is built. Attributes are read and set by name, as Python would. */
#include "native.h"

static PyObject *s_computed, *s_generated, *s_prompt, *s_output, *s_req_id, *s_last_token;

int requests_init(void)
{
    s_computed = PyUnicode_InternFromString("num_computed_tokens");
    s_generated = PyUnicode_InternFromString("num_generated");
    s_prompt = PyUnicode_InternFromString("prompt_len");
    s_output = PyUnicode_InternFromString("output_len");
    s_req_id = PyUnicode_InternFromString("req_id");
    s_last_token = PyUnicode_InternFromString("last_token_s");
    return s_computed && s_generated && s_prompt && s_output && s_req_id && s_last_token ? 0 : -1;
}

static int read_int(PyObject *obj, PyObject *name, long long *value)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    *value = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

/* a request's computed, generated, prompt and output tokens and its req_id */
static int read_counters(PyObject *req, long long *c, long long *g, long long *p, long long *out, long long *id)
{
    return read_int(req, s_computed, c) < 0 || read_int(req, s_generated, g) < 0 || read_int(req, s_prompt, p) < 0
           || read_int(req, s_output, out) < 0 || read_int(req, s_req_id, id) < 0 ? -1 : 0;
}

/* column i of a 5 x row int64 table o (row-major: one row per field) */
static inline void put5(int64_t *o, Py_ssize_t row, Py_ssize_t i, long long a, long long b, long long c, long long d,
                        long long e)
{
    o[i] = a;
    o[row + i] = b;
    o[2 * row + i] = c;
    o[3 * row + i] = d;
    o[4 * row + i] = e;
}

/* d[id] (borrowed), or NULL with KeyError "<fn>: request <id> has no <what>" (or d's own error) */
static PyObject *item_of(PyObject *d, long long id, const char *fn, const char *what)
{
    PyObject *key = PyLong_FromLongLong(id);
    if (!key)
        return NULL;
    PyObject *item = PyDict_GetItemWithError(d, key);
    Py_DECREF(key);
    if (!item && !PyErr_Occurred())
        PyErr_Format(PyExc_KeyError, "%s: request %lld has no %s", fn, id, what);
    return item;
}

PyObject *kv_batch_columns(PyObject *self, PyObject *args)
{
    PyObject *batch, *tables, *out_o;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &batch, &PyDict_Type, &tables, &out_o))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(batch);
    Py_buffer ov;
    if (get_buffer(out_o, &ov, "l", 8, 5 * n, "out") < 0)
        return NULL;
    int64_t *o = (int64_t *)ov.buf;
    const Py_ssize_t row = ov.len / 8 / 5;
    long long least = -1;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *req = PyList_GET_ITEM(batch, i);
        long long c, g, p, out, id;
        if (read_counters(req, &c, &g, &p, &out, &id) < 0)
            goto done;
        PyObject *table = item_of(tables, id, "batch_columns", "block table");   /* borrowed */
        if (!table)
            goto done;
        const Py_ssize_t len = PyObject_Length(table);
        if (len < 0)
            goto done;
        put5(o, row, i, c, g, p, out, len);
        if (g <= 0 || p + g - c != 1) {   /* not one token from its next sample: no run */
            result = PyLong_FromLong(-1);
            goto done;
        }
        if (least < 0 || out - g < least)
            least = out - g;
    }
    result = PyLong_FromLongLong(least);
done:
    PyBuffer_Release(&ov);
    return result;
}


PyObject *kv_write_counters(PyObject *self, PyObject *args)
{
    PyObject *batch, *c0, *g0, *rem_o, *end;
    long long k;
    if (!PyArg_ParseTuple(args, "O!O!O!OLO!", &PyList_Type, &batch, &PyList_Type, &c0, &PyList_Type, &g0, &rem_o, &k,
                          &PyFloat_Type, &end))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(batch);
    Ints rem;
    if (ints_open(&rem, rem_o, n, "rem") < 0) {
        ints_close(&rem);
        return NULL;
    }
    PyObject *result = NULL;
    if (PyList_GET_SIZE(c0) != n || PyList_GET_SIZE(g0) != n) {
        PyErr_SetString(PyExc_ValueError, "write_counters: batch, c0 and g0 differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ints_at(&rem, i) <= k)   /* finished in the run: written as it finished */
            continue;
        PyObject *req = PyList_GET_ITEM(batch, i);
        long long c = PyLong_AsLongLong(PyList_GET_ITEM(c0, i)), g = PyLong_AsLongLong(PyList_GET_ITEM(g0, i));
        if (PyErr_Occurred())
            goto done;
        PyObject *cv = PyLong_FromLongLong(c + k), *gv = PyLong_FromLongLong(g + k);
        int bad = !cv || !gv || PyObject_SetAttr(req, s_computed, cv) < 0 || PyObject_SetAttr(req, s_generated, gv) < 0
                  || PyObject_SetAttr(req, s_last_token, end) < 0;
        Py_XDECREF(cv);
        Py_XDECREF(gv);
        if (bad)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    ints_close(&rem);
    return result;
}


PyObject *kv_lane_columns(PyObject *self, PyObject *args)
{
    PyObject *reqs, *ranks, *cols_o, *last_o;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyList_Type, &reqs, &PyDict_Type, &ranks, &cols_o, &last_o))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(reqs);
    Py_buffer cv, lv;
    if (get_buffer(cols_o, &cv, "l", 8, 5 * n, "cols") < 0)
        return NULL;
    if (get_buffer(last_o, &lv, "d", 8, n, "last") < 0) {
        PyBuffer_Release(&cv);
        return NULL;
    }
    int64_t *o = (int64_t *)cv.buf;
    double *last = (double *)lv.buf;
    const Py_ssize_t row = cv.len / 8 / 5;
    PyObject *result = NULL;
    if (row != n) {
        PyErr_SetString(PyExc_ValueError, "lane_columns: cols must be 5 x len(reqs)");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *req = PyList_GET_ITEM(reqs, i);
        long long c, g, p, out, id, rank;
        if (read_counters(req, &c, &g, &p, &out, &id) < 0)
            goto done;
        if (g <= 0 || p + g - c != 1) {   /* not one token from its next sample: no lane */
            result = Py_NewRef(Py_False);
            goto done;
        }
        PyObject *r = item_of(ranks, id, "lane_columns", "rank");   /* borrowed */
        if (!r)
            goto done;
        rank = PyLong_AsLongLong(r);
        if (rank == -1 && PyErr_Occurred())
            goto done;
        PyObject *t = PyObject_GetAttr(req, s_last_token);
        if (!t)
            goto done;
        last[i] = PyFloat_AsDouble(t);
        Py_DECREF(t);
        if (last[i] == -1.0 && PyErr_Occurred())
            goto done;
        put5(o, row, i, id, c, g, out, rank);
    }
    result = Py_NewRef(Py_True);
done:
    PyBuffer_Release(&cv);
    PyBuffer_Release(&lv);
    return result;
}
