"""The compiled loops (sim/csrc, the extension sim._native) against independent references: the decode
run's prices against ``execute`` of each step's own plan, priced one step at a time in Python, bit for
bit; the block and recording functions against counts by hand and numpy's own operations; and whole
runs with the compiled loops turned off (sim/native.py's fallback) against on."""

from __future__ import annotations

import copy
import importlib
import random
from pathlib import Path

import numpy as np
import pytest
from result_compare import assert_same, assert_same_outcome, outcome
from test_multi_step import STRESS

import sim.executors.cost_model as cost_model
import sim.sched.continuous as continuous
import sim.sched.decode_run as decode_run
from sim.executors.cost_model import BREAKDOWN_PARTS, make_cost_model_executor
from sim.fuzz import draw_scenario
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import ExecutorConfig, scenario_from_dict
from sim.sched.decode_run import _shrinking_segments
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
needs_native = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")

CASES = [  # (model, hardware, tensor_parallel, calibration)
    ("llama-2-7b", "h100-80gb", 1, None),          # the engine-level calibration
    ("llama-2-70b", "h100-80gb", 4, None),         # custom all-reduce terms
    ("llama-2-13b", "a100-80gb", 1, None),
    ("llama-2-7b", "h100-80gb", 1, "roofline"),    # the plain per-operator roofline
    ("llama-2-70b", "a100-80gb", 2, "roofline"),
]


def executor(model: str, hardware: str, tp: int, calibration: str | None):
    spec = HardwareSpec.from_name(hardware).model_dump() | {"tensor_parallel": tp}
    scn = scenario_from_dict({"model": model, "hardware": spec,
                              "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]}})
    config = ExecutorConfig(calibration=calibration) if calibration else scn.executor
    return make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=config,
                                    scheduler=scn.scheduler)


def one_step(exe, n: int, ctx_sum: int):
    """``execute`` of an all-decode plan of ``n`` sequences whose contexts (each counting the token it
    computes) sum to ``ctx_sum``: the reference price of one step."""
    base, extra = divmod(ctx_sum - n, n)   # contexts before the step: spread, the first ``extra`` one more
    scheduled = [ScheduledRequest(i, 1, base + (i < extra), []) for i in range(n)]
    return exe.execute(StepPlan(scheduled=scheduled))


def random_stretches(rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    """A shrinking batch: sizes falling stretch by stretch, each for a few steps, with context sums that
    keep every context positive."""
    size = rng.choice([1, 3, 8, 31, 64, 256])
    sizes, lengths, bases = [], [], []
    while size > 0 and len(sizes) < 5:
        sizes.append(size)
        lengths.append(rng.randint(1, 40))
        bases.append(size * rng.randint(2, 6000))
        size -= rng.randint(1, size)
    return sizes, lengths, bases


@needs_native
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-tp{c[2]}-{c[3] or 'engine'}")
def test_compiled_prices_equal_single_step_prices(case):
    exe = executor(*case)
    assert (exe.engine is None) == (case[3] == "roofline")
    rng = random.Random(f"native:{case}")
    for _ in range(40):
        sizes, lengths, bases = random_stretches(rng)
        run, seqs = exe.execute_decode_stretches(sizes, lengths, bases)
        assert list(run.breakdown) == list(BREAKDOWN_PARTS)
        j = 0
        for n, length, base in zip(sizes, lengths, bases):
            for _ in range(length):
                ref = one_step(exe, n, base + n * j)
                assert seqs[j] == n
                assert run.durations[j] == ref.duration_s, (sizes, lengths, bases, j)
                for part, value in ref.breakdown.items():
                    assert run.breakdown[part][j] == value, (part, j)
                j += 1
        assert j == len(run.durations) == sum(lengths)


@needs_native
def test_compiled_and_numpy_prices_are_the_same_bits(monkeypatch):
    """Against the numpy formulas of ``execute_decode_profile`` (the fallback), compared as raw bits."""
    exe = executor("llama-3.1-8b", "h100-80gb", 1, None)
    rng = random.Random(7)
    cases = [random_stretches(rng) for _ in range(60)]
    compiled = [exe.execute_decode_stretches(*c) for c in cases]
    monkeypatch.setattr(cost_model, "native", None)
    for c, (run, seqs) in zip(cases, compiled):
        ref, ref_seqs = exe.execute_decode_stretches(*c)
        assert np.array_equal(seqs, ref_seqs)
        assert run.durations.tobytes() == np.asarray(ref.durations, dtype=np.float64).tobytes()
        for part in BREAKDOWN_PARTS:
            assert run.breakdown[part].tobytes() == np.asarray(ref.breakdown[part], dtype=np.float64).tobytes()


@needs_native
def test_bad_buffers_are_refused():
    exe = executor("llama-2-7b", "h100-80gb", 1, None)
    terms = [exe._size_terms(4)]
    with pytest.raises(ValueError, match="out must be"):
        native.decode_prices(np.empty((8, 2)), np.empty(5, dtype=np.int64), [4], [5], [40], terms,
                             exe._native_consts)
    with pytest.raises(ValueError, match="seqs_out"):
        native.decode_prices(np.empty((8, 5)), np.empty(5, dtype=np.float64), [4], [5], [40], terms,
                             exe._native_consts)
    with pytest.raises(ValueError, match="differ in length"):
        native.decode_prices(np.empty((8, 5)), np.empty(5, dtype=np.int64), [4, 3], [5], [40], terms,
                             exe._native_consts)


NATIVE_USERS = ["sim.engine_core", "sim.executors.cost_model", "sim.executors.tree_ensemble", "sim.kv.block_pool",
                "sim.kv.free_queue", "sim.metrics", "sim.sched.continuous", "sim.sched.decode_lane",
                "sim.sched.decode_run", "sim.sched.decode_run_apply", "sim.workload.tokens"]


def native_off(monkeypatch) -> None:
    """Every module that uses the compiled loops sees them as not built (the numpy and Python paths)."""
    for name in NATIVE_USERS:
        monkeypatch.setattr(importlib.import_module(name), "native", None)


def test_every_module_using_the_compiled_loops_is_switched_off_by_the_tests():
    users = sorted(str(p.relative_to(ROOT)).removesuffix(".py").replace("/", ".")
                   for p in (ROOT / "sim").rglob("*.py") if "from sim.native import native" in p.read_text())
    assert users == sorted(NATIVE_USERS)


def _on_and_off(monkeypatch, run):
    on = outcome(run)
    native_off(monkeypatch)
    off = outcome(run)
    monkeypatch.undo()
    return on, off


@needs_native
@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "no-lanes"])
def test_stress_and_fuzz_cases_are_the_same_with_the_compiled_loops_off(lanes, monkeypatch):
    """The multi-step stress scenarios (with lanes) and 30 fuzzer cases (others for each mode), with runs
    from one step and either lanes for any batch or none, so that every compiled function is reached,
    every KV invariant checked after every step: the compiled loops on against off, bit for bit."""
    cases = [(name, copy.deepcopy(d), name != "long_decodes") for name, d in STRESS.items()] if lanes else []
    cases += [(f"fuzz {i}", draw_scenario(random.Random(f"native:{lanes}:{i}"), i), True) for i in range(30)]
    for name, data, check in cases:
        data["output"] = {"plots": False}
        monkeypatch.setattr(decode_run, "MIN_RUN_STEPS", 1)
        monkeypatch.setattr(decode_run, "MIN_RUN_STEPS_LARGE", 1)
        monkeypatch.setattr(continuous, "LANE_MIN_BATCH", 1)
        monkeypatch.setattr(continuous.ContinuousScheduler, "use_lane", lanes)
        on, off = _on_and_off(monkeypatch, lambda d=data, c=check: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<t>"), check_integrity=c))
        assert_same_outcome(on, off, name)


SCENARIOS = [
    {"model": "llama-3.1-8b", "hardware": "h100-80gb", "seed": 3,
     "scheduler": {"max_num_seqs": 64, "chunked_prefill": True, "max_num_batched_tokens": 2048},
     "workload": {"synthetic": {"num_requests": 300, "arrival": {"rate": 20.0},
                                "prompt_len": {"dist": "uniform", "min": 50, "max": 1500},
                                "output_len": {"dist": "uniform", "min": 5, "max": 400}}}},
    {"model": "llama-2-13b", "hardware": "a100-80gb", "seed": 5, "executor": {"calibration": "roofline"},
     "kv_cache": {"block_size": 16, "num_gpu_blocks": 900},
     "scheduler": {"max_num_seqs": 48},
     "workload": {"synthetic": {"num_requests": 200, "arrival": {"rate": 8.0},
                                "prompt_len": {"dist": "uniform", "min": 20, "max": 900},
                                "output_len": {"dist": "uniform", "min": 5, "max": 600}}}},
]


@pytest.mark.parametrize("data", SCENARIOS, ids=["engine-calibration", "roofline-preempting"])
def test_runs_are_the_same_with_the_compiled_loop_off(data, monkeypatch):
    on = run_scenario(scenario_from_dict(data), check_integrity=True)
    monkeypatch.setattr(cost_model, "native", None)
    off = run_scenario(scenario_from_dict(data), check_integrity=True)
    assert on.profile["decode_runs"] > 0
    assert_same(on, off)


@needs_native
def test_compiled_stretches_are_the_shrinking_batch_counted_by_hand():
    """``shrinking_stretches`` against a count made step by step: step j holds the requests with
    rem > j, whose contexts (c0 + 1 each) sum to the stretch's base; and against the Python cut."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        n, k = int(rng.integers(1, 80)), int(rng.integers(1, 120))
        c0 = rng.integers(1, 5000, n).astype(np.int64)
        rem = rng.integers(1, 2 * k + 1, n).astype(np.int64)
        rem[rng.integers(n)] = k + int(rng.integers(0, 3))   # somebody takes part in every step
        sizes, lengths, bases = native.shrinking_stretches(c0, rem, k)
        assert (sizes, lengths, bases) == _shrinking_segments(c0.tolist(), rem.tolist(), k)
        assert sum(lengths) == k and all(x > 0 for x in lengths)
        j = 0
        for size, length, base in zip(sizes, lengths, bases):
            for _ in range(length):
                here = rem > j
                assert size == int(here.sum()) and base == int((c0[here] + 1).sum())
                j += 1
        cols = np.stack([c0, rem])   # columns of a 2-D array (strided), as the planner holds them
        assert native.shrinking_stretches(cols.T[:, 0], cols.T[:, 1], k) == (sizes, lengths, bases)


@needs_native
def test_compiled_step_ends_are_a_left_to_right_sum():
    rng = np.random.default_rng(5)
    for _ in range(200):
        k = int(rng.integers(1, 300))
        d = rng.uniform(1e-4, 3e-2, k)
        now = float(rng.uniform(0, 5000))
        ends = np.empty(k + 1)
        assert native.step_ends(ends, d, now) == -1
        t, ref = now, [now]
        for x in d.tolist():   # as SimPy adds a step's duration to the clock
            t += x
            ref.append(t)
        assert ends.tolist() == ref
        bad = int(rng.integers(0, k))
        d[bad] = rng.choice([0.0, -1e-3, np.nan])
        d[bad:][rng.random(k - bad) < 0.2] = 0.0   # (later bad ones do not count)
        assert native.step_ends(np.empty(k + 1), d, now) == bad


@needs_native
def test_compiled_first_tie_finds_the_earliest_end_equal_to_an_arrival():
    rng = np.random.default_rng(8)
    for _ in range(300):
        k = int(rng.integers(1, 60))
        ends = np.concatenate(([0.0], rng.uniform(1e-3, 2e-2, k))).cumsum()
        times = np.sort(np.concatenate((rng.uniform(0, ends[k] * 1.2, int(rng.integers(0, 8))),
                                        rng.choice(ends, int(rng.integers(0, 3))))))
        top = int(np.searchsorted(times, ends[k], side="right"))   # the caller's bound: times <= ends[k]
        lo, hi = sorted(int(x) for x in rng.integers(0, top + 1, 2))
        ties = [p for p in range(k + 1) if ends[p] in times[lo:hi].tolist()]   # every end against every time
        assert native.first_tie(ends, k, times, lo, hi) == (min(ties) if ties else -1)


@needs_native
def test_compiled_finish_counters_follow_the_steps_one_by_one():
    """A run's counters after its finishes, against a walk over its steps: before step j's finishes the
    counters less what earlier steps freed (sums and peaks), after them (the rows) less what steps up to
    j freed; token slots grow by the step's sequences."""
    rng = np.random.default_rng(2)
    bs, num_blocks = 16, 5000
    for _ in range(200):
        k = int(rng.integers(1, 80))
        used = 1000 + rng.integers(0, 3, k).cumsum()
        beyond = 10 + rng.integers(0, 2, k).cumsum()
        logical = used + 7
        alive = np.sort(rng.integers(1, 40, k))[::-1].copy()
        steps = sorted(set(rng.integers(0, k, int(rng.integers(0, 6))).tolist()))
        rows = [(j, int(rng.integers(1, 9)), int(rng.integers(0, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 300)))
                for j in steps]
        held0, m = int(rng.integers(0, 9000)), k - 1
        table = np.empty((5, m), dtype=np.int64)
        got = native.finish_counters(rows, k, used, beyond, logical, alive, held0, bs, num_blocks, m, table)
        freed = {j: r[1:] for j, *_ in rows for r in rows if r[0] == j}
        gone = [0, 0, 0, 0]
        sums = [0, 0, 0]
        peaks = [None, None]
        tokens = held0
        for j in range(k):
            used_pre, logical_pre = int(used[j]) - gone[0], int(logical[j]) - gone[2]
            sums = [sums[0] + int(alive[j]), sums[1] + used_pre, sums[2] + logical_pre]
            peaks = [used_pre if peaks[0] is None else max(peaks[0], used_pre),
                     logical_pre if peaks[1] is None else max(peaks[1], logical_pre)]
            gone = [g + f for g, f in zip(gone, freed.get(j, (0, 0, 0, 0)))]
            tokens += int(alive[j])
            if j < m:
                u, b, ts = int(used[j]) - gone[0], int(beyond[j]) - gone[1], tokens - gone[3]
                assert table[:, j].tolist() == [u, ts, u * bs - ts - b, b, (num_blocks - u) * bs]
        assert got == (*sums, *peaks)


@needs_native
def test_compiled_put_columns_writes_what_numpy_would():
    """``put_columns`` against numpy's assignments column by column (as Columns.extend falls back to):
    int64 and float64 arrays (strided too), numbers, numpy scalars; a zero leaves the chunk as it is."""
    rng = np.random.default_rng(4)
    for _ in range(100):
        width, rows = int(rng.integers(1, 20)), 64
        m = int(rng.integers(0, 20))
        at = int(rng.integers(0, rows - m + 1))
        cols = []
        for _ in range(int(rng.integers(1, width + 1))):
            pick = int(rng.integers(0, 7))
            cols.append([rng.uniform(-1e6, 1e6, m), rng.integers(-2**40, 2**40, m),
                         np.stack([rng.integers(0, 9, m)] * 2, axis=1)[:, 1],   # strided
                         0, 0.0, int(rng.integers(1, 99)), np.float64(rng.uniform(0.5, 2))][pick])
        mine = np.full((width, rows), 7.25)   # (a value that shows any write)
        ref = mine.copy()
        assert native.put_columns(mine, at, m, cols)
        view = ref[:, at:at + m]
        for i, c in enumerate(cols):
            if isinstance(c, np.ndarray) or c:
                view[i] = c
        assert mine.tobytes() == ref.tobytes()


@needs_native
def test_compiled_put_columns_refuses_what_it_cannot_copy():
    chunk = np.zeros((4, 16))
    for bad in ([np.ones(3, dtype=np.float32)], [np.ones(3, dtype=bool)], [np.ones(4)], ["x"],
                [np.ones((3, 1))], [np.ones(3)] * 5):
        assert not native.put_columns(chunk, 2, 3, bad)
    assert not chunk.any()
    assert not native.put_columns(chunk, 14, 3, [np.ones(3)])   # past the chunk's end
    assert not chunk.any()


@needs_native
def test_compiled_step_backs_find_the_steps_that_start_elsewhere():
    """A step is regular when its end less its duration is the previous end exactly (float): checked
    step by step in Python floats."""
    rng = np.random.default_rng(9)
    for _ in range(200):
        k = int(rng.integers(1, 50))
        d = rng.uniform(1e-3, 3e-2, k)
        ends = np.empty(k + 1)
        native.step_ends(ends, d, float(rng.uniform(0, 1e4)))
        if rng.random() < 0.5:   # some ends moved by a few units in the last place
            moved = rng.integers(1, k + 1, int(rng.integers(1, 4)))
            ends[moved] = np.nextafter(ends[moved], np.inf)
        e, dl = ends.tolist(), d.tolist()
        irregular = sum(1 for j in range(1, k) if e[j + 1] - dl[j] != e[j])
        assert native.step_backs(ends, d) == (e[1] - dl[0], irregular)


@needs_native
def test_a_freed_table_joins_the_free_queue_tail_first(monkeypatch):
    """``BlockPool.free_table`` (compiled) leaves the pool as the numpy path does: the same queue order,
    counts and invariants, over allocations and frees that wrap the queue's array."""
    from sim.kv import block_pool
    from sim.kv.block_pool import BlockPool

    def replay(pool: BlockPool, seed: int) -> list:
        rng = random.Random(seed)
        tables: list[list[int]] = []
        seen = []
        for _ in range(400):
            if tables and (rng.random() < 0.5 or pool.num_free < 8):
                pool.free_table(tables.pop(rng.randrange(len(tables))))
            else:
                tables.append(pool.allocate(rng.randint(1, 8)))
            pool.check_integrity()
            seen.append((pool.num_free, pool.free_order()[:5], pool.free_order()[-5:]))
        return [seen, pool.free_order(), pool.ref_counts]

    compiled = replay(BlockPool(40), 1)
    monkeypatch.setattr(block_pool, "native", None)
    assert compiled == replay(BlockPool(40), 1)
    with pytest.raises(ValueError, match="one reference"):   # (a block not held once is refused whole)
        native.free_table([1, 2], np.zeros(80, dtype=np.int64), np.zeros(40, dtype=np.int64),
                          np.zeros(40, dtype=np.int64), 0)


@needs_native
def test_compiled_put_rows_writes_what_numpy_would():
    """Queued rows (tuples of Python and numpy numbers) into a column-major chunk, as numpy's
    ``chunk[:, at] = row``; a row that is not all numbers, or too many, writes nothing."""
    rng = np.random.default_rng(12)
    for _ in range(100):
        width, r = int(rng.integers(1, 26)), int(rng.integers(0, 4))
        at = int(rng.integers(0, 30 - r))
        rows = [tuple(rng.choice([int(rng.integers(-9, 2**40)), float(rng.uniform(-1, 1)), np.float64(2.5),
                                  np.int64(7), 0, True]) for _ in range(width)) for _ in range(r)]
        mine, ref = np.full((width, 30), 3.5), np.full((width, 30), 3.5)
        assert native.put_rows(mine, at, rows)
        for j, row in enumerate(rows):
            ref[:, at + j] = row
        assert mine.tobytes() == ref.tobytes()
    chunk = np.zeros((3, 8))
    assert not native.put_rows(chunk, 0, [(1, 2, 3), (1, "x", 3)])
    assert not native.put_rows(chunk, 0, [(1, 2)])
    assert not native.put_rows(chunk, 7, [(1, 2, 3), (4, 5, 6)])
    assert not chunk.any()


@needs_native
def test_grown_tables_take_the_queue_head_in_event_order(monkeypatch):
    """``BlockPool.grow_tables`` (compiled): block e of the free queue's head goes to table pos[e], and
    the used and logical counts after each step are counted by hand; the pool ends as the manager's
    Python allocation leaves it."""
    from sim.kv import block_pool
    from sim.kv.block_pool import BlockPool

    rng = random.Random(3)
    for _ in range(60):
        def setup() -> tuple[BlockPool, list[list[int]]]:
            pool = BlockPool(64)
            tables = [pool.allocate(2) for _ in range(5)]
            pool.free_table(tables.pop(1))   # (the queue's order is no longer the ids')
            return pool, tables

        k = rng.randint(1, 12)
        events = sorted((rng.randrange(k), rng.randrange(4)) for _ in range(rng.randint(1, 20)))
        steps, pos = [j for j, _ in events], [p for _, p in events]
        pool, tables = setup()
        head = pool.free_order()[:len(pos)]
        used, logical = pool.grow_tables(tables, pos, steps, k, 100, 200)
        expect_tables = [list(t) for t in setup()[1]]
        for p, b in zip(pos, head):
            expect_tables[p].append(b)
        assert tables == expect_tables
        assert used.tolist() == [100 + sum(1 for j in steps if j <= s) for s in range(k)]
        assert logical.tolist() == [200 + sum(1 for j in steps if j <= s) for s in range(k)]
        pool.check_integrity()
        monkeypatch.setattr(block_pool, "native", None)
        ref_pool, ref_tables = setup()
        assert ref_pool.grow_tables(ref_tables, pos, steps, k, 100, 200) is None   # (the caller allocates)
        for p, b in zip(pos, ref_pool.allocate(len(pos))):
            ref_tables[p].append(b)
        assert (ref_tables, ref_pool.free_order(), ref_pool.ref_counts) == (tables, pool.free_order(), pool.ref_counts)
        monkeypatch.undo()


@needs_native
def test_compiled_lane_boundary_finds_full_tables_and_final_blocks():
    """The decode lane's requests at a block boundary (computed a multiple of the block size) and those
    whose next block is their last with slots to spare (fewer than a block of tokens to go), by hand."""
    rng = np.random.default_rng(13)
    for _ in range(200):
        n, bs = int(rng.integers(0, 120)), int(rng.choice([1, 4, 16]))
        cols = np.stack([rng.integers(1, 400, n), rng.integers(1, 60, n), rng.integers(60, 200, n)])
        comp, gen, out = cols   # (rows of one array, as the lane holds them)
        at = [i for i in range(n) if comp[i] % bs == 0]
        finals = [i for i in at if out[i] - gen[i] < bs]
        assert native.lane_boundary(comp, gen, out, bs) == (at, [int(comp[i]) for i in at], finals)


@needs_native
def test_compiled_lane_grow_takes_the_queue_head_into_the_full_tables():
    """``FreeQueue.pop_to_lane`` (compiled lane_grow): each lane position at a block boundary, in lane order,
    takes the next block of the queue's head into its table, by hand; None and nothing changed where a
    boundary's table is not exactly full or the queue is short."""
    from sim.kv.block_pool import BlockPool

    rng = np.random.default_rng(17)
    for case in range(150):
        n, bs = int(rng.integers(0, 40)), int(rng.choice([1, 4, 16]))
        pool = BlockPool(int(rng.integers(1, 400)))
        ids = rng.permutation(1000)[:n] + 7
        comp = rng.integers(1, 120, n)
        if n and case % 3 == 0:
            comp[: n // 2] = (comp[: n // 2] // bs + 1) * bs   # more boundaries
        gen, out = rng.integers(1, 60, n), rng.integers(60, 200, n)
        tables = {int(r): [int(b) for b in rng.integers(0, 10**6, -(-int(c) // bs))] for r, c in zip(ids, comp)}
        if n and case % 5 == 0:   # one boundary's table one block longer: not exactly full
            i = int(rng.integers(0, n))
            if comp[i] % bs == 0:
                tables[int(ids[i])].append(5)
        cols = np.stack([ids, comp, gen, out])
        at = [i for i in range(n) if comp[i] % bs == 0]
        full = all(len(tables[int(ids[i])]) * bs == comp[i] for i in at)
        before = ({r: list(t) for r, t in tables.items()}, pool.free_order(), pool.ref_counts)
        head, free = pool.free_order()[:len(at)], pool.num_free
        got = pool._queue.pop_to_lane(*cols, tables, bs, pool.refs)
        if not full or len(at) > free:
            assert got is None
            assert ({r: list(t) for r, t in tables.items()}, pool.free_order(), pool.ref_counts) == before
            continue
        assert got == (len(at), [i for i in at if out[i] - gen[i] < bs])
        expect = before[0]
        for i, b in zip(at, head):
            expect[int(ids[i])].append(b)
        assert tables == expect
        assert pool.free_order() == before[1][len(at):]
        assert [b for b in range(pool.num_blocks) if pool.ref_counts[b]] == sorted(head)


@needs_native
def test_compiled_batch_columns_read_the_requests_as_the_planner_does():
    """A run's batch read into columns (computed, generated, prompt, output, table length), the fewest
    tokens left to sample, and -1 where a request is not one token from its next sample."""
    from sim.request import Request

    rng = random.Random(14)
    for _ in range(100):
        batch, tables = [], {}
        for i in range(rng.randint(1, 40)):
            prompt, gen = rng.randint(1, 900), rng.randint(1, 200)
            req = Request(req_id=1000 + i, arrival_s=0.0, prompt_len=prompt, output_len=gen + rng.randint(1, 99))
            req.num_generated, req.num_computed_tokens = gen, prompt + gen - 1
            batch.append(req)
            tables[req.req_id] = list(range(rng.randint(1, 80)))
        cols = np.empty((5, len(batch)), dtype=np.int64)
        least = native.batch_columns(batch, tables, cols)
        assert cols.T.tolist() == [[r.num_computed_tokens, r.num_generated, r.prompt_len, r.output_len,
                                    len(tables[r.req_id])] for r in batch]
        assert least == min(r.output_len - r.num_generated for r in batch)
        odd = rng.choice(batch)
        odd.num_computed_tokens -= rng.choice([1, 5])   # (a prefill chunk still to compute)
        assert native.batch_columns(batch, tables, cols) == -1
    with pytest.raises(KeyError):
        native.batch_columns(batch, {}, cols)


@needs_native
def test_compiled_lane_columns_read_the_decodes_as_the_lane_holds_them(monkeypatch):
    """The decode lane built from ``running`` (requests in their prefill left out): each decode's req_id,
    computed, generated and output tokens and its rank, its last token time; None where a decode is not one
    token from its next sample. The same lane with the compiled loops off."""
    import sim.sched.decode_lane as decode_lane
    from sim.request import Request

    rng = random.Random(15)
    for _ in range(100):
        running, prefilling, ranks = [], set(), {}
        for i in range(rng.randint(1, 40)):
            prompt, gen = rng.randint(1, 900), rng.randint(1, 200)
            req = Request(req_id=2000 + 3 * i, arrival_s=0.0, prompt_len=prompt, output_len=gen + rng.randint(1, 99))
            req.num_generated, req.num_computed_tokens = gen, prompt + gen - 1
            req.last_token_s = rng.choice([0.5, rng.random()])
            if rng.random() < 0.2:   # in its prefill: a chunk computed, nothing sampled
                req.num_generated, req.num_computed_tokens = 0, rng.randint(0, prompt - 1)
                prefilling.add(req.req_id)
            running.append(req)
            ranks[req.req_id] = 7 * i + 1
        decodes = [r for r in running if r.req_id not in prefilling]
        expect = [[r.req_id, r.num_computed_tokens, r.num_generated, r.output_len, ranks[r.req_id]] for r in decodes]
        lanes = []
        for compiled in (native, None):
            monkeypatch.setattr(decode_lane, "native", compiled)
            lane = decode_lane.DecodeLane.build(running, prefilling, ranks)
            assert lane.cols.T.tolist() == expect
            assert lane.last_times().tolist() == [r.last_token_s for r in decodes]
            assert [id(r) for r in lane.prefills] == [id(r) for r in running if r.req_id in prefilling]
            assert lane.left == (min(r.output_len - r.num_generated for r in decodes) if decodes else 1 << 62)
            assert lane.comp_sum == sum(r.num_computed_tokens for r in decodes)
            lanes.append(lane)
        if decodes:
            odd = rng.choice(decodes)
            odd.num_computed_tokens -= rng.choice([1, 5])   # (a prefill chunk still to compute)
            for compiled in (native, None):
                monkeypatch.setattr(decode_lane, "native", compiled)
                assert decode_lane.DecodeLane.build(running, prefilling, ranks) is None
    req = Request(req_id=1, arrival_s=0.0, prompt_len=10, output_len=5)
    req.num_generated, req.num_computed_tokens = 2, 11
    with pytest.raises(KeyError):   # (a decode without a rank)
        native.lane_columns([req], {}, np.empty((5, 1), dtype=np.int64), np.empty(1))


@needs_native
def test_compiled_lane_finish_drops_the_finished_columns():
    """The decode lane's finished positions (generated reached output) and its columns without them, the
    fewest tokens the others have left and the contexts that leave: against numpy's comparison and boolean
    take, and a lane of one finishing decode worked by hand."""
    rng = np.random.default_rng(16)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        cols = np.empty((5, n), dtype=np.int64)
        cols[0] = rng.permutation(1000)[:n]                # ids
        cols[2] = rng.integers(1, 300, n)                  # generated
        cols[3] = cols[2] + rng.integers(0, 3, n)          # output: 0 left where equal
        cols[1] = cols[2] + rng.integers(5, 900, n)        # computed
        cols[4] = np.sort(rng.permutation(5000)[:n])       # ranks
        at = native.lane_finished(cols[2], cols[3])
        assert at == (cols[2] >= cols[3]).nonzero()[0].tolist()
        if not at:
            continue
        keep = cols[2] < cols[3]
        new = np.empty((5, n - len(at)), dtype=np.int64)
        left, gone = native.lane_compact(cols, at, new)
        assert new.tolist() == cols[:, keep].tolist()
        assert gone == int(cols[1][~keep].sum())
        assert left == (int((cols[3] - cols[2])[keep].min()) if keep.any() else 1 << 62)
    cols = np.array([[7, 8, 9], [110, 205, 64], [11, 6, 5], [20, 6, 9], [0, 1, 2]], dtype=np.int64)
    assert native.lane_finished(cols[2], cols[3]) == [1]     # 6 of 6 sampled
    new = np.empty((5, 2), dtype=np.int64)
    assert native.lane_compact(cols, [1], new) == (4, 205)   # left: min(20 - 11, 9 - 5)
    assert new.tolist() == [[7, 9], [110, 64], [11, 5], [20, 9], [0, 2]]
    with pytest.raises(ValueError):   # positions out of order: nothing written
        native.lane_compact(cols, [2, 1], np.empty((5, 1), dtype=np.int64))



@needs_native
def test_compiled_lane_advance_moves_the_kept_decodes_k_on():
    """A decode run's advance (``lane_compact`` with k): the kept columns with computed and generated k
    on, the fewest tokens left after the run, the contexts that leave; against numpy (the boolean take
    plus k x [0, 1, 1, 0, 0] of the numpy path) and a lane worked by hand."""
    rng = np.random.default_rng(17)
    step = np.array([[0], [1], [1], [0], [0]], dtype=np.int64)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        k = int(rng.integers(1, 200))
        cols = np.empty((5, n), dtype=np.int64)
        cols[0] = rng.permutation(1000)[:n]
        cols[2] = rng.integers(1, 300, n)
        cols[3] = cols[2] + rng.integers(1, 2 * k, n)     # some finish within the k steps
        cols[1] = cols[2] + rng.integers(5, 900, n)
        cols[4] = np.sort(rng.permutation(5000)[:n])
        keep = cols[3] - cols[2] > k
        at = (~keep).nonzero()[0].tolist()
        new = np.empty((5, int(keep.sum())), dtype=np.int64)
        left, gone = native.lane_compact(cols, at, new, k)
        moved = cols[:, keep] + k * step
        assert new.tolist() == moved.tolist()
        assert gone == int(cols[1][~keep].sum())
        assert left == (int((moved[3] - moved[2]).min()) if keep.any() else 1 << 62)
    cols = np.array([[7, 8, 9], [110, 205, 64], [11, 6, 5], [20, 8, 9], [0, 1, 2]], dtype=np.int64)
    new = np.empty((5, 2), dtype=np.int64)   # 3 steps: request 8 (2 left) finishes, 7 and 9 go 3 tokens on
    assert native.lane_compact(cols, [1], new, 3) == (1, 205)   # left: min(20 - 14, 9 - 8)
    assert new.tolist() == [[7, 9], [113, 67], [14, 8], [20, 9], [0, 2]]


@needs_native
def test_compiled_write_counters_move_the_survivors_k_steps_on():
    from sim.request import Request

    batch = [Request(req_id=i, arrival_s=0.0, prompt_len=10 + i, output_len=50) for i in range(6)]
    for r in batch:
        r.num_computed_tokens, r.num_generated, r.last_token_s = -1, -1, -1.0
    c0, g0 = [20, 21, 22, 23, 24, 25], [5, 4, 3, 2, 1, 9]
    rem = np.array([7, 3, 8, 9, 7, 4], dtype=np.int64)   # k = 7: those with 7 or fewer finished in the run
    native.write_counters(batch, c0, g0, rem, 7, 12.5)
    assert [(r.num_computed_tokens, r.num_generated, r.last_token_s) for r in batch] == [
        (-1, -1, -1.0), (-1, -1, -1.0), (29, 10, 12.5), (30, 9, 12.5), (-1, -1, -1.0), (-1, -1, -1.0)]


@needs_native
def test_compiled_sort_pairs_is_numpys_stable_order():
    """Repeated values, -0.0 beside 0.0 (equal: input order) and ties of different weights come out in
    np.argsort(kind="stable")'s order; a NaN or too many distinct values leave the outputs untouched."""
    rng = np.random.default_rng(7)
    x = rng.choice(np.array([3.5, 0.0, -0.0, 1e-3, 7.25, 2.0**-30, 1e300]), size=20_000)
    w = rng.integers(1, 50, size=x.size).astype(np.float64)
    order = np.argsort(x, kind="stable")
    xs, ws = np.full(x.size, 9.0), np.full(x.size, 9.0)
    assert native.sort_pairs(x, w, xs, ws, 16)
    assert np.array_equal(xs.view(np.int64), x[order].view(np.int64))   # (bits: the zeros' signs too)
    assert np.array_equal(ws, w[order])
    by_hand = np.array([-0.0, 0.0, 1.0, 1.0, 2.0])   # 1.0 twice: input order, weights 30 then 10
    xs, ws = np.empty(5), np.empty(5)
    assert native.sort_pairs(np.array([1.0, -0.0, 2.0, 1.0, 0.0]), np.array([30.0, 1, 2, 10, 4]), xs, ws, 5)
    assert np.array_equal(xs.view(np.int64), by_hand.view(np.int64)) and list(ws) == [1, 4, 30, 10, 2]
    many = rng.random(5_000)
    xs, ws = np.full(5_000, 9.0), np.full(5_000, 9.0)
    assert not native.sort_pairs(many, many, xs, ws, 4_999) and (xs == 9.0).all() and (ws == 9.0).all()
    assert native.sort_pairs(many, many, xs, ws, 5_000) and np.array_equal(xs, np.sort(many))
    spread = rng.random(70_000)   # nearly all distinct: given up after the first 65,536 whatever the limit
    out = np.full(70_000, 9.0)
    assert not native.sort_pairs(spread, spread, out, out.copy(), 70_000) and (out == 9.0).all()
    nan = np.array([1.0, np.nan, 0.5])
    out = np.full(3, 9.0)
    assert not native.sort_pairs(nan, nan, out, out.copy(), 3) and (out == 9.0).all()


@needs_native
def test_weighted_stats_are_the_same_with_the_compiled_sort_off(monkeypatch):
    """``_stats`` over a run's gaps (repeated durations) gives the same bits through either sort."""
    import sim.metrics as metrics

    rng = np.random.default_rng(3)
    x = rng.choice(rng.random(700) * 0.05, size=50_000)
    w = rng.integers(1, 64, size=x.size).astype(np.float64)
    on = metrics._stats(x, w)
    monkeypatch.setattr(metrics, "native", None)
    assert metrics._stats(x, w) == on
