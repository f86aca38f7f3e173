/* A run's blocks (sim/sched/decode_run_apply.py, sim/kv/).

boundary_events lists a small batch's block allocations in the order the blocks leave the pool, and
grow_tables hands them over from the free queue's head into the tables. free_table gives a finished
request's blocks back to the free queue (sim/kv/block_pool.py). lane_boundary finds the decode lane's
requests that take a block this step. */
#include "native.h"

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

PyObject *kv_boundary_events(PyObject *self, PyObject *args)
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
    ints_close(&c0);
    ints_close(&l0);
    ints_close(&rem);
    return result;
}

/* The free queue's ids (at least n of them) and the pool's reference counts, both held on success (0);
neither on failure (-1). */
static int queue_buffers(PyObject *ids_o, PyObject *refs_o, Py_ssize_t n, const char *what, Py_buffer *ids,
                         Py_buffer *refs)
{
    if (get_buffer(ids_o, ids, "l", 8, n, what) < 0)
        return -1;
    if (get_buffer(refs_o, refs, "l", 8, 0, "refs") < 0) {
        PyBuffer_Release(ids);
        return -1;
    }
    return 0;
}

PyObject *kv_grow_tables(PyObject *self, PyObject *args)
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
    if (queue_buffers(ids_o, refs_o, head + n, "ids", &ids, &refs) < 0)
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

PyObject *kv_free_table(PyObject *self, PyObject *args)
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

PyObject *kv_lane_boundary(PyObject *self, PyObject *args)
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
    ints_close(&comp);
    ints_close(&gen);
    ints_close(&out);
    return result;
}

/* lane_grow(ids, comp, gen, out, tables, bs, queue_ids, refs, head, size) -> (n, finals) or None: the decode
lane's block boundaries of one step, allocated. Each lane position i whose computed count comp[i] is a
multiple of bs takes the free queue's next block (queue_ids[head], then head + 1, ...), in lane order,
appended to tables[ids[i]] with refs set to 1: what lane_boundary, then one step of grow_tables, do.
finals: the positions whose new block is their table's final one with slots to spare (out - gen < bs).
None, with nothing done, where a boundary's table is not exactly full, fewer than n blocks are queued, or a
queued block is in use: the caller's general path handles those. The queue must have no holes. */
PyObject *kv_lane_grow(PyObject *self, PyObject *args)
{
    PyObject *ids_o, *comp_o, *gen_o, *out_o, *tables, *qids_o, *refs_o;
    long long bs;
    Py_ssize_t head, size;
    if (!PyArg_ParseTuple(args, "OOOOO!LOOnn", &ids_o, &comp_o, &gen_o, &out_o, &PyDict_Type, &tables, &bs,
                          &qids_o, &refs_o, &head, &size))
        return NULL;
    Ints ids, comp, gen, out;
    ids.held = comp.held = gen.held = out.held = 0;
    Py_buffer qids, refs;
    int got = 0;
    PyObject *result = NULL, *finals = NULL, **grown = NULL;
    if (ints_open(&ids, ids_o, 0, "ids") < 0 || ints_open(&comp, comp_o, 0, "comp") < 0
        || ints_open(&gen, gen_o, 0, "gen") < 0 || ints_open(&out, out_o, 0, "out") < 0)
        goto done;
    const Py_ssize_t n = comp.view.shape[0];
    if (ids.view.shape[0] != n || gen.view.shape[0] != n || out.view.shape[0] != n || bs <= 0 || head < 0
        || size < 0) {
        PyErr_SetString(PyExc_ValueError, "lane_grow: ids, comp, gen and out of one length, bs > 0 expected");
        goto done;
    }
    if (queue_buffers(qids_o, refs_o, head + size, "queue_ids", &qids, &refs) < 0)
        goto done;
    got = 2;
    const int64_t *qp = (const int64_t *)qids.buf;
    int64_t *rp = (int64_t *)refs.buf;
    const Py_ssize_t num_blocks = refs.len / 8;
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += ints_at(&comp, i) % bs == 0;
    finals = PyList_New(0);
    grown = PyMem_Malloc((count ? count : 1) * sizeof(PyObject *));
    if (!finals || !grown) {
        PyErr_NoMemory();
        goto done;
    }
    /* checked first: nothing changes unless every boundary's table is exactly full and its block is free */
    if (count > size)
        goto nothing;
    Py_ssize_t e = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t c = ints_at(&comp, i);
        if (c % bs)
            continue;
        PyObject *key = PyLong_FromLongLong(ints_at(&ids, i));
        if (!key)
            goto done;
        PyObject *table = PyDict_GetItemWithError(tables, key);   /* borrowed */
        Py_DECREF(key);
        if (!table) {
            if (PyErr_Occurred())
                goto done;
            goto nothing;
        }
        const int64_t b = qp[head + e];
        if (!PyList_Check(table) || (int64_t)PyList_GET_SIZE(table) * bs != c || b < 0 || b >= num_blocks
            || rp[b] != 0)
            goto nothing;
        grown[e++] = table;
        if (ints_at(&out, i) - ints_at(&gen, i) < bs) {
            PyObject *pi = PyLong_FromSsize_t(i);
            if (!pi || PyList_Append(finals, pi) < 0) {
                Py_XDECREF(pi);
                goto done;
            }
            Py_DECREF(pi);
        }
    }
    for (e = 0; e < count; e++) {
        const int64_t b = qp[head + e];
        PyObject *id = PyLong_FromLongLong(b);
        if (!id || PyList_Append(grown[e], id) < 0) {
            Py_XDECREF(id);
            goto done;   /* (out of memory: the tables are then partly grown) */
        }
        Py_DECREF(id);
        rp[b] = 1;
    }
    result = Py_BuildValue("(nO)", count, finals);
    goto done;
nothing:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(grown);
    Py_XDECREF(finals);
    if (got >= 1)
        PyBuffer_Release(&qids);
    if (got >= 2)
        PyBuffer_Release(&refs);
    ints_close(&ids);
    ints_close(&comp);
    ints_close(&gen);
    ints_close(&out);
    return result;
}
