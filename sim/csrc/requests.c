/* Requests' counters (sim/sched/decode_run.py, decode_run_apply.py, continuous.py): batch_columns reads
them and the table lengths into int64 columns as a run is planned; write_counters writes back those of
the requests that did not finish when it is applied; decode_prefix schedules a step's decodes one by one
as ContinuousScheduler.schedule's fast path does, and update_prefix advances them after the step as
SchedulerBase.update does. Attributes are read and set by name, as Python would. */
#include "native.h"

static PyObject *s_computed, *s_generated, *s_prompt, *s_output, *s_req_id, *s_last_token, *s_status;
static PyObject *s_new_tokens, *s_first_token;

int requests_init(void)
{
    s_computed = PyUnicode_InternFromString("num_computed_tokens");
    s_generated = PyUnicode_InternFromString("num_generated");
    s_prompt = PyUnicode_InternFromString("prompt_len");
    s_output = PyUnicode_InternFromString("output_len");
    s_req_id = PyUnicode_InternFromString("req_id");
    s_last_token = PyUnicode_InternFromString("last_token_s");
    s_status = PyUnicode_InternFromString("status");
    s_new_tokens = PyUnicode_InternFromString("num_new_tokens");
    s_first_token = PyUnicode_InternFromString("first_token_s");
    return s_computed && s_generated && s_prompt && s_output && s_req_id && s_last_token && s_status
                   && s_new_tokens && s_first_token ? 0 : -1;
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
        if (read_int(req, s_computed, &c) < 0 || read_int(req, s_generated, &g) < 0 || read_int(req, s_prompt, &p) < 0
            || read_int(req, s_output, &out) < 0 || read_int(req, s_req_id, &id) < 0)
            goto done;
        PyObject *key = PyLong_FromLongLong(id);
        if (!key)
            goto done;
        PyObject *table = PyDict_GetItemWithError(tables, key);   /* borrowed */
        Py_DECREF(key);
        if (!table) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "batch_columns: request %lld has no block table", id);
            goto done;
        }
        const Py_ssize_t len = PyObject_Length(table);
        if (len < 0)
            goto done;
        o[i] = c;
        o[row + i] = g;
        o[2 * row + i] = p;
        o[3 * row + i] = out;
        o[4 * row + i] = len;
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

PyObject *kv_decode_prefix(PyObject *self, PyObject *args)
{
    PyObject *order, *running, *tables, *allocate, *make, *scheduled, *batch;
    Py_ssize_t start;
    long long budget, bs;
    if (!PyArg_ParseTuple(args, "O!nLLOO!OOO!O!", &PyList_Type, &order, &start, &budget, &bs, &running, &PyDict_Type,
                          &tables, &allocate, &make, &PyList_Type, &scheduled, &PyList_Type, &batch))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(order);
    Py_ssize_t idx = start;
    long long added = 0;
    int failed = 0;   /* stopped at a request whose block it could not allocate (tried once: not again) */
    if (bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "decode_prefix: bs > 0 expected");
        return NULL;
    }
    for (; idx < n; idx++) {
        PyObject *req = PyList_GET_ITEM(order, idx);
        PyObject *status = PyObject_GetAttr(req, s_status);
        if (!status)
            return NULL;
        int other = PyObject_RichCompareBool(status, running, Py_NE);
        Py_DECREF(status);
        if (other < 0)
            return NULL;
        if (other)
            continue;   /* preempted earlier in this step */
        long long computed, prompt, generated, id;
        if (read_int(req, s_computed, &computed) < 0 || read_int(req, s_prompt, &prompt) < 0
            || read_int(req, s_generated, &generated) < 0)
            return NULL;
        if (prompt + generated - computed != 1 || budget <= 0 || !generated)
            break;   /* not a decode the fast path takes: the caller's general path */
        if (computed % bs == 0) {   /* its next slot starts a block: allocate it, or leave it to the caller */
            PyObject *ok = PyObject_CallFunction(allocate, "Oi", req, 1);
            if (!ok)
                return NULL;
            int got = PyObject_IsTrue(ok);
            Py_DECREF(ok);
            if (got < 0)
                return NULL;
            if (!got) {
                failed = 1;
                break;
            }
        }
        if (read_int(req, s_req_id, &id) < 0)
            return NULL;
        PyObject *key = PyLong_FromLongLong(id);
        if (!key)
            return NULL;
        PyObject *table = PyDict_GetItemWithError(tables, key);   /* borrowed */
        if (!table) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, key);
            Py_DECREF(key);
            return NULL;
        }
        PyObject *entry = PyObject_CallFunction(make, "OiLO", key, 1, computed, table);
        Py_DECREF(key);
        if (!entry)
            return NULL;
        int bad = PyList_Append(scheduled, entry) < 0 || PyList_Append(batch, req) < 0;
        Py_DECREF(entry);
        if (bad)
            return NULL;
        added++;
        budget--;
    }
    return Py_BuildValue("(nLLO)", idx, added, budget, failed ? Py_True : Py_False);
}

static int set_int(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (!v)
        return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

PyObject *kv_update_prefix(PyObject *self, PyObject *args)
{
    PyObject *batch, *entries, *prefilling, *other_append, *done;
    Py_ssize_t start;
    double now, step_start;
    if (!PyArg_ParseTuple(args, "O!O!nddO!OO!", &PyList_Type, &batch, &PyList_Type, &entries, &start, &now, &step_start,
                          &PySet_Type, &prefilling, &other_append, &PyList_Type, &done))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(batch) < PyList_GET_SIZE(entries) ? PyList_GET_SIZE(batch)
                                                                           : PyList_GET_SIZE(entries);
    long long computed = 0, sampled = 0, regular = 0;
    Py_ssize_t idx = start;
    PyObject *now_obj = PyFloat_FromDouble(now);
    if (!now_obj)
        return NULL;
    PyObject *result = NULL;
    for (; idx < n; idx++) {
        PyObject *req = PyList_GET_ITEM(batch, idx), *entry = PyList_GET_ITEM(entries, idx);
        if (req == Py_None)
            break;   /* a forked request's other sequence: the caller's loop */
        long long id, k, c, p, g, out;
        if (read_int(req, s_req_id, &id) < 0)
            goto done;
        if (PySet_GET_SIZE(prefilling)) {
            PyObject *key = PyLong_FromLongLong(id);
            int first = key ? PySet_Contains(prefilling, key) : -1;
            Py_XDECREF(key);
            if (first < 0)
                goto done;
            if (first)
                break;   /* in its prefill: it may sample its first token (marks, the lane): the caller's */
        }
        if (read_int(entry, s_new_tokens, &k) < 0 || read_int(req, s_computed, &c) < 0
            || read_int(req, s_prompt, &p) < 0 || read_int(req, s_generated, &g) < 0 || read_int(req, s_output, &out) < 0)
            goto done;
        c += k;
        if (set_int(req, s_computed, c) < 0)
            goto done;
        computed += k;
        if (c < p + g)
            continue;   /* a prefill chunk: no token sampled yet */
        g += 1;
        if (set_int(req, s_generated, g) < 0)
            goto done;
        sampled++;
        if (g == 1) {
            if (PyObject_SetAttr(req, s_first_token, now_obj) < 0)
                goto done;
        } else {
            PyObject *last = PyObject_GetAttr(req, s_last_token);
            if (!last)
                goto done;
            double t = PyFloat_AsDouble(last);
            Py_DECREF(last);
            if (t == -1.0 && PyErr_Occurred())
                goto done;
            if (t == step_start) {
                regular++;
            } else {
                PyObject *gap = PyFloat_FromDouble(now - t), *r = gap ? PyObject_CallOneArg(other_append, gap) : NULL;
                Py_XDECREF(gap);
                if (!r)
                    goto done;
                Py_DECREF(r);
            }
        }
        if (PyObject_SetAttr(req, s_last_token, now_obj) < 0)
            goto done;
        if (g >= out && PyList_Append(done, req) < 0)
            goto done;
    }
    result = Py_BuildValue("(nLLL)", idx, computed, sampled, regular);
done:
    Py_DECREF(now_obj);
    return result;
}
