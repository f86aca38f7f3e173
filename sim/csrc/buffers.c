/* Buffer helpers shared by the compiled loops (native.h). */
#include "native.h"

int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, Py_ssize_t itemsize, Py_ssize_t n,
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

int read_doubles(PyObject *tuple, double *dst, Py_ssize_t n, const char *what)
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

int ints_open(Ints *a, PyObject *obj, Py_ssize_t n, const char *what)
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

void ints_close(Ints *a)
{
    if (a->held)
        PyBuffer_Release(&a->view);
    a->held = 0;
}

int doubles_open(Py_buffer *v, PyObject *obj, Py_ssize_t n, const char *what)
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
