/* A decode run's pricing (sim/sched/decode_run.py, sim/executors/cost_model.py).

decode_prices(out, seqs_out, sizes, lengths, bases, terms, consts) prices k = sum(lengths) all-decode
steps of a run whose batch shrinks in stretches: stretch s has sizes[s] sequences for lengths[s] steps,
and step j of it has the decode context sum bases[s] + sizes[s] * j (j counted from the run's start).
It evaluates, element by element and in the same order, the float64 formulas of
CostModelExecutor._decode_prices, so that every value equals numpy's bit for bit.
  out: a writable C-contiguous float64 buffer of 8 x k: rows duration, linear, attention, elementwise,
  allreduce, swap, copy, overhead. seqs_out: a writable int64 buffer of k (the sequences in each step).
  terms: one tuple a stretch, the executor's _size_terms of its size (engine: linear, allreduce,
  elementwise, attention kernel cost, cpu; roofline: linear, allreduce).
  consts: ("engine", layers, half_ctx, kv_s, qo_s, sampler_s, step_gap_s, overlap_cpu) or
  ("roofline", layers, flops_per_pair, attn_peak, kv_s, new_bytes, attn_bw, kernel_latency, attn_seq,
  attn_pre_seq, elem_per_token, elem_fixed, overhead).
shrinking_stretches(c0, rem, k) cuts a run whose requests leave as they finish into those stretches
(_shrinking_segments). step_ends and first_tie: the run's end times (a sequential sum, as SimPy adds)
and its cut before an arrival that a step's end would tie (DecodeRunner._before_tie). */
#include "native.h"

#define ROWS 8

typedef struct {
    int64_t last;   /* the step after a request's last (its remaining tokens, < k) */
    int64_t ctx;    /* its context at the run's start, counting its token: c0 + 1 */
} Leaving;

static int by_last(const void *a, const void *b)
{
    int64_t x = ((const Leaving *)a)->last, y = ((const Leaving *)b)->last;
    return (x > y) - (x < y);
}

PyObject *kv_decode_prices(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *seqs_obj, *sizes_obj, *lengths_obj, *bases_obj, *terms_obj, *consts;
    if (!PyArg_ParseTuple(args, "OOOOOOO!", &out_obj, &seqs_obj, &sizes_obj, &lengths_obj, &bases_obj, &terms_obj,
                          &PyTuple_Type, &consts))
        return NULL;
    PyObject *sizes = PySequence_Fast(sizes_obj, "decode_prices: sizes must be a sequence");
    PyObject *lengths = PySequence_Fast(lengths_obj, "decode_prices: lengths must be a sequence");
    PyObject *bases = PySequence_Fast(bases_obj, "decode_prices: bases must be a sequence");
    PyObject *terms = PySequence_Fast(terms_obj, "decode_prices: terms must be a sequence");
    Py_buffer out = {0}, sq = {0};
    int have_out = 0, have_sq = 0;
    PyObject *result = NULL;
    if (!sizes || !lengths || !bases || !terms)
        goto done;
    Py_ssize_t nseg = PySequence_Fast_GET_SIZE(sizes);
    if (PySequence_Fast_GET_SIZE(lengths) != nseg || PySequence_Fast_GET_SIZE(bases) != nseg
        || PySequence_Fast_GET_SIZE(terms) != nseg) {
        PyErr_SetString(PyExc_ValueError, "decode_prices: sizes, lengths, bases and terms differ in length");
        goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t s = 0; s < nseg; s++) {
        Py_ssize_t len = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(lengths, s));
        if (len < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "decode_prices: a negative stretch length");
            goto done;
        }
        k += len;
    }
    if (get_buffer(out_obj, &out, "d", sizeof(double), ROWS * k, "out") < 0)
        goto done;
    have_out = 1;
    if (get_buffer(seqs_obj, &sq, "q", sizeof(int64_t), k, "seqs_out") < 0) {
        /* numpy's int64 is 'l' on LP64 platforms */
        PyErr_Clear();
        if (get_buffer(seqs_obj, &sq, "l", sizeof(int64_t), k, "seqs_out") < 0)
            goto done;
    }
    have_sq = 1;
    Py_ssize_t stride = out.len / (Py_ssize_t)sizeof(double) / ROWS;   /* the buffer's row length (>= k) */
    double *o = (double *)out.buf;
    double *dur = o, *lin = o + stride, *att = o + 2 * stride, *elem = o + 3 * stride, *ar = o + 4 * stride;
    double *swp = o + 5 * stride, *cpy = o + 6 * stride, *ovh = o + 7 * stride;
    int64_t *seqs_out = (int64_t *)sq.buf;

    if (!PyTuple_Check(consts) || PyTuple_GET_SIZE(consts) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(consts, 0))) {
        PyErr_SetString(PyExc_ValueError, "decode_prices: consts must start with the mode's name");
        goto done;
    }
    int engine = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(consts, 0), "engine") == 0;
    Py_ssize_t nconst = engine ? 8 : 13;
    if (PyTuple_GET_SIZE(consts) != nconst) {
        PyErr_Format(PyExc_ValueError, "decode_prices: %zd constants expected", nconst);
        goto done;
    }
    long long layers = PyLong_AsLongLong(PyTuple_GET_ITEM(consts, 1));
    if (layers == -1 && PyErr_Occurred())
        goto done;
    double c[13];
    for (Py_ssize_t i = 2; i < nconst; i++) {
        c[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(consts, i));
        if (c[i] == -1.0 && PyErr_Occurred())
            goto done;
    }
    long long new_bytes = 0;
    if (!engine) {
        new_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(consts, 5));   /* an integer: numpy keeps seqs x it exact */
        if (new_bytes == -1 && PyErr_Occurred())
            goto done;
    }
    const double dlayers = (double)layers;

    Py_ssize_t j = 0;
    for (Py_ssize_t s = 0; s < nseg; s++) {
        long long n = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(sizes, s));
        long long base = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(bases, s));
        Py_ssize_t len = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(lengths, s));
        if (PyErr_Occurred())
            goto done;
        double t[5];
        if (read_doubles(PySequence_Fast_GET_ITEM(terms, s), t, engine ? 5 : 2, "a stretch's terms") < 0)
            goto done;
        const double dn = (double)n;
        for (Py_ssize_t e = j + len; j < e; j++) {
            const double ctx = (double)(base + n * (long long)j);   /* exact integers, then float64 */
            double attention, elementwise, comm, duration, overhead, linear;
            if (engine) {
                /* per_layer = (ctx + n * half) * kv_s + n * qo_s + k_attn; attention = layers * per_layer */
                linear = t[0], comm = t[1], elementwise = t[2];
                const double per_layer = (ctx + dn * c[2]) * c[3] + dn * c[4] + t[3];
                attention = dlayers * per_layer;
                const double parts = linear + attention + elementwise + comm;
                const double gpu = parts + c[5];
                const double busy = c[7] != 0.0 ? np_maximum(gpu, t[4]) : gpu + t[4];
                duration = busy + c[6];
                overhead = duration - parts;
            } else {
                /* per_layer = max(fpp * ctx / peak, kv_s * ctx + new_bytes * n / attn_bw) + latency */
                linear = t[0], comm = t[1];
                const double per_layer = np_maximum(c[2] * ctx / c[3],
                                                    c[4] * ctx + (double)(new_bytes * n) / c[6]) + c[7];
                attention = dlayers * (per_layer + dn * c[8] + 0.0 * c[9]);
                elementwise = dlayers * (dn * c[10] + c[11]);
                duration = linear + attention + elementwise + comm + 0.0 + 0.0 + c[12];
                overhead = 0.0 + c[12];
            }
            dur[j] = duration;
            lin[j] = 0.0 + linear;
            att[j] = attention;
            elem[j] = 0.0 + elementwise;
            ar[j] = 0.0 + comm;
            swp[j] = 0.0;
            cpy[j] = 0.0;
            ovh[j] = overhead;
            seqs_out[j] = n;
        }
    }
    result = PyLong_FromSsize_t(k);
done:
    if (have_out)
        PyBuffer_Release(&out);
    if (have_sq)
        PyBuffer_Release(&sq);
    Py_XDECREF(sizes);
    Py_XDECREF(lengths);
    Py_XDECREF(bases);
    Py_XDECREF(terms);
    return result;
}

PyObject *kv_shrinking_stretches(PyObject *self, PyObject *args)
{
    PyObject *c0_obj, *rem_obj;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOn", &c0_obj, &rem_obj, &k))
        return NULL;
    Ints c0v, remv;
    c0v.held = remv.held = 0;
    PyObject *result = NULL, *sizes = NULL, *lengths = NULL, *bases = NULL;
    Leaving *gone = NULL;
    if (ints_open(&c0v, c0_obj, 0, "c0") < 0 || ints_open(&remv, rem_obj, 0, "rem") < 0)
        goto done;
    Py_ssize_t n = c0v.view.shape[0];
    if (remv.view.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "shrinking_stretches: c0 and rem differ in length");
        goto done;
    }
    gone = PyMem_Malloc((n ? n : 1) * sizeof(Leaving));
    sizes = PyList_New(0), lengths = PyList_New(0), bases = PyList_New(0);
    if (!gone || !sizes || !lengths || !bases) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = 0;
    int64_t size = n, base = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t c = ints_at(&c0v, i), r = ints_at(&remv, i);
        base += c;
        if (r < k) {
            gone[m].last = r;
            gone[m].ctx = c + 1;
            m++;
        }
    }
    qsort(gone, m, sizeof(Leaving), by_last);
    int64_t prev = 0;
    for (Py_ssize_t i = 0; i <= m; i++) {
        int64_t end = i < m ? gone[i].last : k;
        if (i == 0 || i == m || end != gone[i - 1].last) {   /* (the first to leave at its step opens it) */
            PyObject *a = PyLong_FromLongLong(size), *b = PyLong_FromLongLong(end - prev);
            PyObject *c = PyLong_FromLongLong(base);
            int bad = !a || !b || !c || PyList_Append(sizes, a) < 0 || PyList_Append(lengths, b) < 0
                      || PyList_Append(bases, c) < 0;
            Py_XDECREF(a);
            Py_XDECREF(b);
            Py_XDECREF(c);
            if (bad)
                goto done;
            prev = end;
        }
        if (i < m) {
            size -= 1;
            base -= gone[i].ctx;
        }
    }
    result = PyTuple_Pack(3, sizes, lengths, bases);
done:
    PyMem_Free(gone);
    Py_XDECREF(sizes);
    Py_XDECREF(lengths);
    Py_XDECREF(bases);
    ints_close(&c0v);
    ints_close(&remv);
    return result;
}

PyObject *kv_step_ends(PyObject *self, PyObject *args)
{
    PyObject *ends_obj, *d_obj;
    double now;
    if (!PyArg_ParseTuple(args, "OOd", &ends_obj, &d_obj, &now))
        return NULL;
    Py_buffer ev, dv;
    if (PyObject_GetBuffer(d_obj, &dv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (dv.itemsize != 8 || dv.format == NULL || dv.format[0] != 'd') {
        PyErr_SetString(PyExc_ValueError, "step_ends: durations must be a C-contiguous float64 array");
        PyBuffer_Release(&dv);
        return NULL;
    }
    Py_ssize_t k = dv.len / 8;
    if (get_buffer(ends_obj, &ev, "d", sizeof(double), k + 1, "ends") < 0) {
        PyBuffer_Release(&dv);
        return NULL;
    }
    const double *d = (const double *)dv.buf;
    double *e = (double *)ev.buf;
    Py_ssize_t bad = -1;
    double t = now;
    e[0] = t;
    for (Py_ssize_t j = 0; j < k; j++) {
        if (bad < 0 && !(d[j] > 0.0))   /* (NaN too) */
            bad = j;
        t = t + d[j];
        e[j + 1] = t;
    }
    PyBuffer_Release(&dv);
    PyBuffer_Release(&ev);
    return PyLong_FromSsize_t(bad);
}

PyObject *kv_first_tie(PyObject *self, PyObject *args)
{
    PyObject *ends_obj, *at_obj;
    Py_ssize_t k, lo, hi;
    if (!PyArg_ParseTuple(args, "OnOnn", &ends_obj, &k, &at_obj, &lo, &hi))
        return NULL;
    Py_buffer ev, av;
    if (PyObject_GetBuffer(ends_obj, &ev, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(at_obj, &av, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&ev);
        return NULL;
    }
    Py_ssize_t result = -1;
    if (ev.itemsize != 8 || av.itemsize != 8 || !ev.format || !av.format || ev.format[0] != 'd'
        || av.format[0] != 'd' || ev.len / 8 < k + 1 || lo < 0 || hi > av.len / 8 || lo > hi) {
        PyErr_SetString(PyExc_ValueError, "first_tie: ends (k + 1 float64) and arrival times (float64) expected");
        PyBuffer_Release(&ev);
        PyBuffer_Release(&av);
        return NULL;
    }
    const double *e = (const double *)ev.buf, *at = (const double *)av.buf;
    for (Py_ssize_t i = lo; i < hi; i++) {
        /* the first of ends[0..k] not below at[i] (numpy's searchsorted, side left) */
        Py_ssize_t a = 0, b = k + 1;
        while (a < b) {
            Py_ssize_t mid = a + (b - a) / 2;
            if (e[mid] < at[i])
                a = mid + 1;
            else
                b = mid;
        }
        if (a <= k && e[a] == at[i] && (result < 0 || a < result))
            result = a;
    }
    PyBuffer_Release(&ev);
    PyBuffer_Release(&av);
    return PyLong_FromSsize_t(result);
}
