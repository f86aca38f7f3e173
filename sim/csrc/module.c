/* The extension module sim._native: its method table (the functions live in pricing.c, requests.c,
blocks.c, lane.c, recording.c, sorting.c and core.c; sim/native.py loads the module, or None where it was not built). */
#include "native.h"

static PyMethodDef methods[] = {
    {"decode_prices", kv_decode_prices, METH_VARARGS,
     "decode_prices(out, seqs_out, sizes, lengths, bases, terms, consts) -> k: a decode run's step prices "
     "(CostModelExecutor._decode_prices, bit for bit) into out (8 x k float64) and seqs_out (k int64)."},
    {"shrinking_stretches", kv_shrinking_stretches, METH_VARARGS,
     "shrinking_stretches(c0, rem, k) -> (sizes, lengths, bases): sim/sched/decode_run.py's "
     "_shrinking_segments of int64 arrays (request i computes in steps j < min(rem_i, k))."},
    {"step_ends", kv_step_ends, METH_VARARGS,
     "step_ends(ends_out, durations, now) -> first non-positive duration's index, or -1: ends_out[0] = now, "
     "ends_out[j + 1] = ends_out[j] + durations[j], summed left to right (numpy's cumsum)."},
    {"first_tie", kv_first_tie, METH_VARARGS,
     "first_tie(ends, k, arrival_times, lo, hi) -> the least p <= k with ends[p] equal to one of "
     "arrival_times[lo:hi], or -1."},
    {"finish_counters", kv_finish_counters, METH_VARARGS,
     "finish_counters(rows, k, used, beyond, logical, alive, held0, bs, num_blocks, m, table) -> (tokens, used "
     "sum, logical sum, used peak, logical peak): a run through finishes' per-step counters "
     "(DecodeRunApplier._apply_through_finishes); table (5 x m int64) gets the rows' used blocks, token "
     "slots, fragmented slots, slots beyond final lengths and empty slots."},
    {"boundary_events", kv_boundary_events, METH_VARARGS,
     "boundary_events(c0, l0, rem, k, bs) -> (positions, steps, finals): sim/sched/decode_run_apply.py's "
     "boundary_events of int64 arrays, finals always collected."},
    {"step_backs", kv_step_backs, METH_VARARGS,
     "step_backs(ends, durations) -> (ends[1] - durations[0], the steps j in 1..k-1 whose ends[j + 1] - "
     "durations[j] is not ends[j]): what a run's inter-token gaps need of its steps (DecodeRunApplier._gaps)."},
    {"free_table", kv_free_table, METH_VARARGS,
     "free_table(table, ids, at, refs, t) -> n: a block table's blocks (a list, each holding its last "
     "reference) queued at the free queue's slots t.. tail first (ids[t + i], at[block]) and their "
     "references dropped to 0 (sim/kv/block_pool.py BlockPool.free_table)."},
    {"put_rows", kv_put_rows, METH_VARARGS,
     "put_rows(chunk, at, rows) -> bool: chunk[:, at + j] = rows[j] for queued rows (tuples of numbers "
     "as wide as the chunk), as sim/metrics.py's Columns.extend writes them; False, nothing written, where "
     "one is not."},
    {"batch_columns", kv_batch_columns, METH_VARARGS,
     "batch_columns(batch, tables, out) -> the fewest tokens any request has left to sample (-1: some request "
     "is not one token from its next sample; no run): out (5 x n int64) gets each request's computed, "
     "generated, prompt and output tokens and its block table's length (DecodeRunner._plan_batch)."},
    {"write_counters", kv_write_counters, METH_VARARGS,
     "write_counters(batch, c0, g0, rem, k, end): each request of a run that did not finish in its k steps "
     "(rem > k) gets num_computed_tokens c0 + k, num_generated g0 + k and last_token_s end "
     "(DecodeRunApplier.write_back)."},
    {"lane_columns", kv_lane_columns, METH_VARARGS,
     "lane_columns(reqs, ranks, cols, last) -> bool: the decode lane's columns (5 x n int64: req_id, computed, "
     "generated, output tokens, ranks[req_id]) and last token times (n float64) of reqs; False, as far as "
     "written, where a request is not one token from its next sample (sim/sched/decode_lane.py build)."},
    {"lane_finished", kv_lane_finished, METH_VARARGS,
     "lane_finished(gen, out) -> [i, ...]: the decode lane's positions whose generated count reached its output "
     "length (gen >= out), ascending (sim/sched/decode_lane.py finished)."},
    {"lane_compact", kv_lane_compact, METH_VARARGS,
     "lane_compact(cols, at, new, k=0) -> (left, gone): new (5 x (n - len(at)) int64) gets the lane's columns "
     "cols (5 x n) but those at the ascending positions at, computed and generated k on; left is the fewest "
     "out - gen among those kept, after the k (1 << 62 when none), gone the computed counts at at summed "
     "(before the k) (sim/sched/decode_lane.py drop and advance)."},
    {"lane_boundary", kv_lane_boundary, METH_VARARGS,
     "lane_boundary(comp, gen, out, bs) -> (at, computed, finals): the decode lane's requests at a block "
     "boundary (comp % bs == 0: positions and computed counts) and those among them whose next block is "
     "their table's final one with slots to spare (out - gen < bs) (sim/sched/decode_lane.py boundary)."},
    {"lane_grow", kv_lane_grow, METH_VARARGS,
     "lane_grow(ids, comp, gen, out, tables, bs, queue_ids, refs, head, size) -> (n, finals) or None: the decode "
     "lane's block boundaries of one step taken from the free queue's head into their tables (None: nothing "
     "done, the general path applies)"},
    {"grow_tables", kv_grow_tables, METH_VARARGS,
     "grow_tables(tables, pos, steps, ids, refs, head, used_out, logical_out, used0, logical0) -> n: a small "
     "batch's run takes the free queue's n head entries ids[head:head + n] in event order (steps ascending), "
     "appends each to tables[pos[e]] with one reference, and writes the used and logical block counts after "
     "each step (sim/kv/manager.py allocate_decode_events)."},
    {"put_columns", kv_put_columns, METH_VARARGS,
     "put_columns(chunk, at, m, cols) -> bool: chunk[i, at:at + m] = cols[i] for each column (an int64 or float64 "
     "array of m, or a number; a zero is left as it is), as sim/metrics.py's Columns.extend writes them. "
     "False, with nothing written, where a column is neither."},
    {"chain_hashes", kv_chain_hashes, METH_VARARGS,
     "chain_hashes(parent, tag, a, b, start, step, count, chunks, c[, into]) -> [h, ...]: count chained hashes "
     "(with into, an int64 array of count: written there, the last returned), "
     "h = hash((previous h, key)) from parent, the key of block j (first token s = start + j * step) being "
     "(tag, chunks[s // c], s % c) where chunks is a sequence, else (tag, a, s), or (tag, a, b, s) where b is not "
     "None (sim/workload/tokens.py block_hashes)."},
    {"sort_pairs", kv_sort_pairs, METH_VARARGS,
     "sort_pairs(x, w, xs_out, ws_out, limit) -> bool: xs_out, ws_out get x and w (float64) in the order of "
     "np.argsort(x, kind=\"stable\"); False, nothing written, where x holds a NaN or more than limit distinct "
     "values, or where 60% of its first 65,536 are distinct (sorting.c)."},
    {"run_core", kv_run_core, METH_VARARGS,
     "run_core(n, requests, arrivals, dest, lag, route, state, progress, every, counters, times, specs) -> "
     "[(error, records, totals), ...]: the whole run of one engine or of a colocated pool behind one arrival "
     "process; route is None (dest chosen ahead), route(g) -> engine, or (rule, pairs, slack) for a router "
     "applied here (sim/engine_core.py prepares the arguments and reads the results)."},
    {"tree_predict", kv_tree_predict, METH_VARARGS,
     "tree_predict(out, x, rows, n_features, offsets, trees, feature, threshold, value, left, right, nodes, base): "
     "out[i] = base + the sum over trees, in order, of the leaf row i of x (rows x n_features float64) reaches "
     "(sim/executors/tree_ensemble.py TreeEnsemble.predict, bit for bit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sim._native",
                                    "kvsim's optional compiled loops (sim/native.py).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    if (requests_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
