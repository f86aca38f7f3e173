/* sim._native: the decode run's pricing loop in C (optional; sim/native.py falls back to numpy).

shrinking_stretches(c0, rem, k) cuts a run whose requests leave as they finish into the stretches that
decode_prices takes (sim/sched/decode_run.py's _shrinking_segments, on int64 arrays). step_ends and
first_tie are the run's end times (a sequential sum) and its cut before an arrival that a step's end
would tie (DecodeRunner._before_tie). finish_counters is the block and slot accounting of a run whose
requests finish inside it (DecodeRunApplier._apply_through_finishes), all exact int64 arithmetic.
batch_columns reads a run's batch (its requests' counters and table lengths) into int64 columns.
lane_boundary finds the decode lane's requests that take a block this step.
grow_tables hands a small batch's run its blocks from the free queue's head and grows its tables.
free_table gives a finished request's blocks back to the pool's free queue (sim/kv/block_pool.py).
step_backs tells a run's inter-token gaps whether each step started where the last one ended.
boundary_events lists the block allocations of a small batch's run in the order the blocks leave the
pool (sim/sched/decode_run_apply.py). put_columns and put_rows write a run's recorded rows into the recorder's column chunk (sim/metrics.py Columns.extend).

decode_prices(out, seqs_out, sizes, lengths, bases, terms, consts) prices k = sum(lengths) all-decode
steps of a run whose batch shrinks in stretches: stretch s has sizes[s] sequences for lengths[s] steps,
and step j of it has the decode context sum bases[s] + sizes[s] * j (j counted from the run's start).
It evaluates, element by element and in the same order, the float64 formulas of
CostModelExecutor._decode_prices (sim/executors/cost_model.py), so that every value equals numpy's bit
for bit: only +, -, *, / and max on doubles, no contraction into fused multiply-adds (setup.py builds
with -ffp-contract=off), integers converted to double where numpy converts them.

out: a writable C-contiguous float64 buffer of 8 x k: rows duration, linear, attention, elementwise,
allreduce, swap, copy, overhead. seqs_out: a writable int64 buffer of k (the sequences in each step).
terms: one tuple a stretch, the executor's _size_terms of its size (engine: linear, allreduce,
elementwise, attention kernel cost, cpu; roofline: linear, allreduce).
consts: ("engine", layers, half_ctx, kv_s, qo_s, sampler_s, step_gap_s, overlap_cpu) or
("roofline", layers, flops_per_pair, attn_peak, kv_s, new_bytes, attn_bw, kernel_latency, attn_seq,
attn_pre_seq, elem_per_token, elem_fixed, overhead).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#define ROWS 8

static double np_maximum(double a, double b)
{
    /* numpy.maximum: NaN if either is NaN, else the larger */
    if (isnan(a) || isnan(b))
        return NAN;
    return a >= b ? a : b;
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, Py_ssize_t itemsize, Py_ssize_t n,
                      const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const int ints = fmt[0] == 'l' || fmt[0] == 'q';   /* an int64 is 'l' or 'q' by platform */
    if (view->itemsize != itemsize || view->format == NULL
        || (ints ? view->format[0] != 'l' && view->format[0] != 'q' : view->format[0] != fmt[0])
        || view->len < n * itemsize) {
        PyErr_Format(PyExc_ValueError, "decode_prices: %s must be a C-contiguous %s buffer of at least %zd items",
                     what, fmt[0] == 'd' ? "float64" : "int64", n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int read_doubles(PyObject *tuple, double *dst, Py_ssize_t n, const char *what)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < n) {
        PyErr_Format(PyExc_ValueError, "decode_prices: %s must be a tuple of at least %zd numbers", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        dst[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(tuple, i));
        if (dst[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *decode_prices(PyObject *self, PyObject *args)
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

typedef struct {
    int64_t last;   /* the step after a request's last (its remaining tokens, < k) */
    int64_t ctx;    /* its context at the run's start, counting its token: c0 + 1 */
} Leaving;

static int by_last(const void *a, const void *b)
{
    int64_t x = ((const Leaving *)a)->last, y = ((const Leaving *)b)->last;
    return (x > y) - (x < y);
}

static int read_int64s(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || (view->format[0] != 'q' && view->format[0] != 'l')
        || view->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "shrinking_stretches: %s must be a one-dimensional int64 array", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *shrinking_stretches(PyObject *self, PyObject *args)
{
    PyObject *c0_obj, *rem_obj;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOn", &c0_obj, &rem_obj, &k))
        return NULL;
    Py_buffer c0v, remv;
    if (read_int64s(c0_obj, &c0v, "c0") < 0)
        return NULL;
    if (read_int64s(rem_obj, &remv, "rem") < 0) {
        PyBuffer_Release(&c0v);
        return NULL;
    }
    PyObject *result = NULL, *sizes = NULL, *lengths = NULL, *bases = NULL;
    Leaving *gone = NULL;
    Py_ssize_t n = c0v.shape[0];
    if (remv.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "shrinking_stretches: c0 and rem differ in length");
        goto done;
    }
    /* (strided: a column of a 2-D array) */
    const char *c0p = (const char *)c0v.buf, *remp = (const char *)remv.buf;
    const Py_ssize_t c0s = c0v.strides[0], rems = remv.strides[0];
    gone = PyMem_Malloc((n ? n : 1) * sizeof(Leaving));
    sizes = PyList_New(0), lengths = PyList_New(0), bases = PyList_New(0);
    if (!gone || !sizes || !lengths || !bases) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t m = 0;
    int64_t size = n, base = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t c = *(const int64_t *)(c0p + i * c0s), r = *(const int64_t *)(remp + i * rems);
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
    PyBuffer_Release(&c0v);
    PyBuffer_Release(&remv);
    return result;
}

static PyObject *step_ends(PyObject *self, PyObject *args)
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

static PyObject *first_tie(PyObject *self, PyObject *args)
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

typedef struct {
    Py_buffer view;
    int held;
} Ints;

static int ints_open(Ints *a, PyObject *obj, Py_ssize_t n, const char *what)
{
    a->held = 0;
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return -1;
    a->held = 1;
    if (a->view.itemsize != 8 || !a->view.format || (a->view.format[0] != 'q' && a->view.format[0] != 'l')
        || a->view.ndim != 1 || a->view.shape[0] < n) {
        PyErr_Format(PyExc_ValueError, "sim._native: %s must be an int64 array of at least %zd items", what, n);
        return -1;
    }
    return 0;
}

static inline int64_t ints_at(const Ints *a, Py_ssize_t i)
{
    return *(const int64_t *)((const char *)a->view.buf + i * a->view.strides[0]);
}

static PyObject *finish_counters(PyObject *self, PyObject *args)
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
        if (all[i]->held)
            PyBuffer_Release(&all[i]->view);
    if (have_t)
        PyBuffer_Release(&tv);
    return result;
}

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static PyObject *boundary_events(PyObject *self, PyObject *args)
{
    PyObject *c0_o, *l0_o, *rem_o;
    Py_ssize_t k;
    long long bs;
    if (!PyArg_ParseTuple(args, "OOOnL", &c0_o, &l0_o, &rem_o, &k, &bs))
        return NULL;
    Ints c0, l0, rem;
    c0.held = l0.held = rem.held = 0;
    PyObject *result = NULL, *pos = NULL, *steps = NULL, *finals = NULL;
    int64_t *keys = NULL;
    if (ints_open(&c0, c0_o, 0, "c0") < 0 || ints_open(&l0, l0_o, 0, "l0") < 0 || ints_open(&rem, rem_o, 0, "rem") < 0)
        goto done;
    const Py_ssize_t size = c0.view.shape[0];
    if (l0.view.shape[0] != size || rem.view.shape[0] != size || bs <= 0 || k < 0) {
        PyErr_SetString(PyExc_ValueError, "boundary_events: c0, l0 and rem of one length, bs > 0, k >= 0 expected");
        goto done;
    }
    /* count the events first: request i takes a block at steps first, first + bs, ... < min(rem, k) */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        const int64_t first = ints_at(&l0, i) * bs - ints_at(&c0, i), r = ints_at(&rem, i);
        const int64_t end = r < k ? r : k;
        if (first < 0) {
            PyErr_SetString(PyExc_ValueError, "boundary_events: a table shorter than its computed tokens");
            goto done;
        }
        if (first < end)
            total += (end - first - 1) / bs + 1;
    }
    keys = PyMem_Malloc((total ? total : 1) * sizeof(int64_t));
    finals = PyList_New(0);
    if (!keys || !finals) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t e = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        const int64_t c = ints_at(&c0, i), n = ints_at(&l0, i), r = ints_at(&rem, i);
        const int64_t first = n * bs - c, end = r < k ? r : k;
        if (first >= end)
            continue;
        for (int64_t j = first; j < end; j += bs)
            keys[e++] = j * size + i;   /* (step, position) as one key: sorted as the pairs would be */
        const int64_t count = (end - first - 1) / bs + 1, last = (c + r - 1) / bs;
        if (n + count == last + 1 && (last + 1) * bs > c + r) {   /* its final block, slots to spare */
            PyObject *pair = Py_BuildValue("(Ln)", (long long)(first + (count - 1) * bs), i);
            if (!pair || PyList_Append(finals, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        }
    }
    qsort(keys, total, sizeof(int64_t), cmp_int64);
    pos = PyList_New(total);
    steps = PyList_New(total);
    if (!pos || !steps)
        goto done;
    for (Py_ssize_t x = 0; x < total; x++) {
        PyObject *p = PyLong_FromLongLong(keys[x] % size), *t = PyLong_FromLongLong(keys[x] / size);
        if (!p || !t) {
            Py_XDECREF(p);
            Py_XDECREF(t);
            goto done;
        }
        PyList_SET_ITEM(pos, x, p);
        PyList_SET_ITEM(steps, x, t);
    }
    result = PyTuple_Pack(3, pos, steps, finals);
done:
    PyMem_Free(keys);
    Py_XDECREF(pos);
    Py_XDECREF(steps);
    Py_XDECREF(finals);
    if (c0.held)
        PyBuffer_Release(&c0.view);
    if (l0.held)
        PyBuffer_Release(&l0.view);
    if (rem.held)
        PyBuffer_Release(&rem.view);
    return result;
}

static int doubles_open(Py_buffer *v, PyObject *obj, Py_ssize_t n, const char *what)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return -1;
    if (v->itemsize != 8 || !v->format || v->format[0] != 'd' || v->ndim != 1 || v->shape[0] < n) {
        PyErr_Format(PyExc_ValueError, "sim._native: %s must be a float64 array of at least %zd items", what, n);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

#define AT(v, i) (*(const double *)((const char *)(v).buf + (i) * (v).strides[0]))

static PyObject *step_backs(PyObject *self, PyObject *args)
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

static PyObject *free_table(PyObject *self, PyObject *args)
{
    PyObject *table;
    PyObject *ids_o, *at_o, *refs_o;
    Py_ssize_t t;
    if (!PyArg_ParseTuple(args, "O!OOOn", &PyList_Type, &table, &ids_o, &at_o, &refs_o, &t))
        return NULL;
    Py_buffer ids, at, refs;
    const Py_ssize_t n = PyList_GET_SIZE(table);
    if (get_buffer(ids_o, &ids, "q", 8, t + n, "ids") < 0) {
        PyErr_Clear();
        if (get_buffer(ids_o, &ids, "l", 8, t + n, "ids") < 0)
            return NULL;
    }
    if (get_buffer(at_o, &at, ids.format, 8, 0, "at") < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    if (get_buffer(refs_o, &refs, ids.format, 8, 0, "refs") < 0) {
        PyBuffer_Release(&ids);
        PyBuffer_Release(&at);
        return NULL;
    }
    int64_t *idp = (int64_t *)ids.buf, *atp = (int64_t *)at.buf, *rp = (int64_t *)refs.buf;
    const Py_ssize_t num_blocks = at.len / 8;
    PyObject *result = NULL;
    /* checked first: nothing is written unless every block is one of the pool's, held once */
    for (Py_ssize_t i = 0; i < n; i++) {
        long long b = PyLong_AsLongLong(PyList_GET_ITEM(table, i));
        if (b < 0 || b >= num_blocks || refs.len / 8 != num_blocks || rp[b] != 1) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "free_table: block %lld is not a pool block with one reference", b);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {   /* the table's tail first */
        const int64_t b = PyLong_AsLongLong(PyList_GET_ITEM(table, n - 1 - i));
        idp[t + i] = b;
        atp[b] = t + i;
        rp[b] = 0;
    }
    result = PyLong_FromSsize_t(n);
done:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&at);
    PyBuffer_Release(&refs);
    return result;
}

#define MAX_COLUMNS 64

static PyObject *put_columns(PyObject *self, PyObject *args)
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

static PyObject *put_rows(PyObject *self, PyObject *args)
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
    double *values = ok ? PyMem_Malloc((r * width ? r * width : 1) * sizeof(double)) : NULL;
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

static PyObject *s_computed, *s_generated, *s_prompt, *s_output, *s_req_id;

static int read_int(PyObject *obj, PyObject *name, long long *value)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    *value = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *batch_columns(PyObject *self, PyObject *args)
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

static PyObject *lane_boundary(PyObject *self, PyObject *args)
{
    PyObject *comp_o, *gen_o, *out_o;
    long long bs;
    if (!PyArg_ParseTuple(args, "OOOL", &comp_o, &gen_o, &out_o, &bs))
        return NULL;
    Ints comp, gen, out;
    comp.held = gen.held = out.held = 0;
    PyObject *result = NULL, *at = PyList_New(0), *computed = PyList_New(0), *finals = PyList_New(0);
    if (!at || !computed || !finals)
        goto done;
    if (ints_open(&comp, comp_o, 0, "comp") < 0 || ints_open(&gen, gen_o, 0, "gen") < 0 || ints_open(&out, out_o, 0, "out") < 0)
        goto done;
    const Py_ssize_t n = comp.view.shape[0];
    if (gen.view.shape[0] != n || out.view.shape[0] != n || bs <= 0) {
        PyErr_SetString(PyExc_ValueError, "lane_boundary: comp, gen and out of one length, bs > 0 expected");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t c = ints_at(&comp, i);
        if (c % bs)
            continue;
        PyObject *pi = PyLong_FromSsize_t(i), *pc = PyLong_FromLongLong(c);
        int bad = !pi || !pc || PyList_Append(at, pi) < 0 || PyList_Append(computed, pc) < 0
                  || (ints_at(&out, i) - ints_at(&gen, i) < bs && PyList_Append(finals, pi) < 0);
        Py_XDECREF(pi);
        Py_XDECREF(pc);
        if (bad)
            goto done;
    }
    result = PyTuple_Pack(3, at, computed, finals);
done:
    Py_XDECREF(at);
    Py_XDECREF(computed);
    Py_XDECREF(finals);
    if (comp.held)
        PyBuffer_Release(&comp.view);
    if (gen.held)
        PyBuffer_Release(&gen.view);
    if (out.held)
        PyBuffer_Release(&out.view);
    return result;
}

static PyObject *grow_tables(PyObject *self, PyObject *args)
{
    PyObject *tables, *pos, *steps, *ids_o, *refs_o, *used_o, *logical_o;
    Py_ssize_t head;
    long long used0, logical0;
    if (!PyArg_ParseTuple(args, "O!O!O!OOnOOLL", &PyList_Type, &tables, &PyList_Type, &pos, &PyList_Type, &steps,
                          &ids_o, &refs_o, &head, &used_o, &logical_o, &used0, &logical0))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(pos);
    Py_buffer ids, refs, used, logical;
    int got = 0;
    PyObject *result = NULL;
    if (get_buffer(ids_o, &ids, "l", 8, head + n, "ids") < 0)
        goto done;
    got = 1;
    if (get_buffer(refs_o, &refs, "l", 8, 0, "refs") < 0)
        goto done;
    got = 2;
    if (get_buffer(used_o, &used, "l", 8, 0, "used") < 0)
        goto done;
    got = 3;
    const Py_ssize_t k = used.len / 8;
    if (get_buffer(logical_o, &logical, "l", 8, k, "logical") < 0)
        goto done;
    got = 4;
    const int64_t *idp = (const int64_t *)ids.buf;
    int64_t *rp = (int64_t *)refs.buf, *up = (int64_t *)used.buf, *lp = (int64_t *)logical.buf;
    const Py_ssize_t num_blocks = refs.len / 8, ntables = PyList_GET_SIZE(tables);
    if (PyList_GET_SIZE(steps) != n || head < 0) {
        PyErr_SetString(PyExc_ValueError, "grow_tables: positions and steps differ in length");
        goto done;
    }
    /* checked first: nothing changes unless every event is valid (steps ascending, within the run) */
    long long prev = 0;
    for (Py_ssize_t e = 0; e < n; e++) {
        long long p = PyLong_AsLongLong(PyList_GET_ITEM(pos, e)), j = PyLong_AsLongLong(PyList_GET_ITEM(steps, e));
        const int64_t b = idp[head + e];
        if (PyErr_Occurred())
            goto done;
        if (p < 0 || p >= ntables || !PyList_Check(PyList_GET_ITEM(tables, p)) || j < prev || j >= k || b < 0
            || b >= num_blocks || rp[b] != 0) {
            PyErr_SetString(PyExc_ValueError, "grow_tables: an event outside the batch or the run, or a block in use");
            goto done;
        }
        prev = j;
    }
    Py_ssize_t e = 0;
    int64_t grown = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        for (; e < n && PyLong_AsLongLong(PyList_GET_ITEM(steps, e)) == j; e++) {
            const int64_t b = idp[head + e];
            PyObject *id = PyLong_FromLongLong(b);
            if (!id || PyList_Append(PyList_GET_ITEM(tables, PyLong_AsSsize_t(PyList_GET_ITEM(pos, e))), id) < 0) {
                Py_XDECREF(id);
                goto done;   /* (out of memory: the tables are then partly grown) */
            }
            Py_DECREF(id);
            rp[b] = 1;
            grown++;
        }
        up[j] = used0 + grown;   /* the counters after step j's allocations */
        lp[j] = logical0 + grown;
    }
    result = PyLong_FromSsize_t(n);
done:
    if (got >= 1)
        PyBuffer_Release(&ids);
    if (got >= 2)
        PyBuffer_Release(&refs);
    if (got >= 3)
        PyBuffer_Release(&used);
    if (got >= 4)
        PyBuffer_Release(&logical);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_prices", decode_prices, METH_VARARGS,
     "decode_prices(out, seqs_out, sizes, lengths, bases, terms, consts) -> k: a decode run's step prices "
     "(CostModelExecutor._decode_prices, bit for bit) into out (8 x k float64) and seqs_out (k int64)."},
    {"shrinking_stretches", shrinking_stretches, METH_VARARGS,
     "shrinking_stretches(c0, rem, k) -> (sizes, lengths, bases): sim/sched/decode_run.py's "
     "_shrinking_segments of int64 arrays (request i computes in steps j < min(rem_i, k))."},
    {"step_ends", step_ends, METH_VARARGS,
     "step_ends(ends_out, durations, now) -> first non-positive duration's index, or -1: ends_out[0] = now, "
     "ends_out[j + 1] = ends_out[j] + durations[j], summed left to right (numpy's cumsum)."},
    {"first_tie", first_tie, METH_VARARGS,
     "first_tie(ends, k, arrival_times, lo, hi) -> the least p <= k with ends[p] equal to one of "
     "arrival_times[lo:hi], or -1."},
    {"finish_counters", finish_counters, METH_VARARGS,
     "finish_counters(rows, k, used, beyond, logical, alive, held0, bs, num_blocks, m, table) -> (tokens, used "
     "sum, logical sum, used peak, logical peak): a run through finishes' per-step counters "
     "(DecodeRunApplier._apply_through_finishes); table (5 x m int64) gets the rows' used blocks, token "
     "slots, fragmented slots, slots beyond final lengths and empty slots."},
    {"boundary_events", boundary_events, METH_VARARGS,
     "boundary_events(c0, l0, rem, k, bs) -> (positions, steps, finals): sim/sched/decode_run_apply.py's "
     "boundary_events of int64 arrays, finals always collected."},
    {"step_backs", step_backs, METH_VARARGS,
     "step_backs(ends, durations) -> (ends[1] - durations[0], the steps j in 1..k-1 whose ends[j + 1] - "
     "durations[j] is not ends[j]): what a run's inter-token gaps need of its steps (DecodeRunApplier._gaps)."},
    {"free_table", free_table, METH_VARARGS,
     "free_table(table, ids, at, refs, t) -> n: a block table's blocks (a list, each holding its last "
     "reference) queued at the free queue's slots t.. tail first (ids[t + i], at[block]) and their "
     "references dropped to 0 (sim/kv/block_pool.py BlockPool.free_table)."},
    {"put_rows", put_rows, METH_VARARGS,
     "put_rows(chunk, at, rows) -> bool: chunk[:, at + j] = rows[j] for queued rows (tuples of numbers "
     "as wide as the chunk), as sim/metrics.py's Columns.extend writes them; False, nothing written, where "
     "one is not."},
    {"batch_columns", batch_columns, METH_VARARGS,
     "batch_columns(batch, tables, out) -> the fewest tokens any request has left to sample (-1: some request "
     "is not one token from its next sample; no run): out (5 x n int64) gets each request's computed, "
     "generated, prompt and output tokens and its block table's length (DecodeRunner._plan_batch)."},
    {"lane_boundary", lane_boundary, METH_VARARGS,
     "lane_boundary(comp, gen, out, bs) -> (at, computed, finals): the decode lane's requests at a block "
     "boundary (comp % bs == 0: positions and computed counts) and those among them whose next block is "
     "their table's final one with slots to spare (out - gen < bs) (sim/sched/decode_lane.py boundary)."},
    {"grow_tables", grow_tables, METH_VARARGS,
     "grow_tables(tables, pos, steps, ids, refs, head, used_out, logical_out, used0, logical0) -> n: a small "
     "batch's run takes the free queue's n head entries ids[head:head + n] in event order (steps ascending), "
     "appends each to tables[pos[e]] with one reference, and writes the used and logical block counts after "
     "each step (sim/kv/manager.py allocate_decode_events)."},
    {"put_columns", put_columns, METH_VARARGS,
     "put_columns(chunk, at, m, cols) -> bool: chunk[i, at:at + m] = cols[i] for each column (an int64 or float64 "
     "array of m, or a number; a zero is left as it is), as sim/metrics.py's Columns.extend writes them. "
     "False, with nothing written, where a column is neither."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sim._native",
                                    "kvsim's optional compiled loops (sim/native.py).", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    s_computed = PyUnicode_InternFromString("num_computed_tokens");
    s_generated = PyUnicode_InternFromString("num_generated");
    s_prompt = PyUnicode_InternFromString("prompt_len");
    s_output = PyUnicode_InternFromString("output_len");
    s_req_id = PyUnicode_InternFromString("req_id");
    if (!s_computed || !s_generated || !s_prompt || !s_output || !s_req_id)
        return NULL;
    return PyModule_Create(&module);
}
