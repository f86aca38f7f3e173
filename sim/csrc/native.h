/* kvsim's compiled loops (the extension sim._native; sim/native.py loads it, or falls back to numpy):
shared buffer helpers and the functions each file exports to module.c.

Every function reads numpy arrays through the buffer protocol (no numpy headers), checks its inputs
before it writes anything, and computes exactly what its numpy or Python twin computes: floats with the
same operations in the same order (setup.py builds with -ffp-contract=off, so no multiply and add is
fused into one rounding), integers as exact int64. */
#ifndef KVSIM_NATIVE_H
#define KVSIM_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* a one-dimensional int64 array, possibly strided (a column of a 2-D array), held while open */
typedef struct {
    Py_buffer view;
    int held;
} Ints;

int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, Py_ssize_t itemsize, Py_ssize_t n, const char *what);
int read_doubles(PyObject *tuple, double *dst, Py_ssize_t n, const char *what);
int ints_open(Ints *a, PyObject *obj, Py_ssize_t n, const char *what);
void ints_close(Ints *a);
int doubles_open(Py_buffer *v, PyObject *obj, Py_ssize_t n, const char *what);

/* numpy.maximum: NaN if either is NaN, else the larger */
static inline double np_maximum(double a, double b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    return a >= b ? a : b;
}

static inline int64_t ints_at(const Ints *a, Py_ssize_t i)
{
    return *(const int64_t *)((const char *)a->view.buf + i * a->view.strides[0]);
}

/* element i of a float64 buffer opened with doubles_open */
#define AT(v, i) (*(const double *)((const char *)(v).buf + (i) * (v).strides[0]))

/* pricing.c: a run's prices, stretches, end times and the cut before a tied arrival */
PyObject *kv_decode_prices(PyObject *self, PyObject *args);
PyObject *kv_shrinking_stretches(PyObject *self, PyObject *args);
PyObject *kv_step_ends(PyObject *self, PyObject *args);
PyObject *kv_first_tie(PyObject *self, PyObject *args);
/* requests.c: a run's and the decode lane's requests read and written back */
int requests_init(void);
PyObject *kv_batch_columns(PyObject *self, PyObject *args);
PyObject *kv_write_counters(PyObject *self, PyObject *args);
PyObject *kv_lane_columns(PyObject *self, PyObject *args);
/* blocks.c: block allocations and frees */
PyObject *kv_boundary_events(PyObject *self, PyObject *args);
PyObject *kv_grow_tables(PyObject *self, PyObject *args);
PyObject *kv_free_table(PyObject *self, PyObject *args);
PyObject *kv_lane_boundary(PyObject *self, PyObject *args);
PyObject *kv_lane_grow(PyObject *self, PyObject *args);
/* trees.c: a stored tree ensemble's prediction */
PyObject *kv_tree_predict(PyObject *self, PyObject *args);
/* hashes.c: chained block hashes */
PyObject *kv_chain_hashes(PyObject *self, PyObject *args);
/* lane.c: the decode lane's finishes */
PyObject *kv_lane_finished(PyObject *self, PyObject *args);
PyObject *kv_lane_compact(PyObject *self, PyObject *args);
/* recording.c: counters, gaps and the recorder's rows */
PyObject *kv_finish_counters(PyObject *self, PyObject *args);
PyObject *kv_step_backs(PyObject *self, PyObject *args);
PyObject *kv_put_columns(PyObject *self, PyObject *args);
PyObject *kv_put_rows(PyObject *self, PyObject *args);
/* sorting.c: weighted values that repeat, in a stable sort's order */
PyObject *kv_sort_pairs(PyObject *self, PyObject *args);
/* core.c: one engine's whole run (sim/engine_core.py) */
PyObject *kv_run_core(PyObject *self, PyObject *args);

#endif
