"""metrics.Columns: rows and runs read back in append order, across many flushes."""

import numpy as np

from sim.metrics import Columns


def test_rows_and_runs_read_back_in_order(monkeypatch):
    monkeypatch.setattr(Columns, "CHUNK_ROWS", 5)
    monkeypatch.setattr(Columns, "ROWS_QUEUED", 3)
    rng = np.random.default_rng(0)
    cols = Columns(3)
    expect: list[tuple] = []
    for i in range(60):
        if rng.random() < 0.5:
            row = (float(i), i, i * 2)
            cols.append(row)
            expect.append(row)
        else:
            m = int(rng.integers(1, 9))
            a = np.arange(m, dtype=np.float64) + 1000 * i
            cols.extend([a, 7, a * 3])
            expect += [(a[j], 7, a[j] * 3) for j in range(m)]
        if i % 17 == 0:   # a read in between joins the blocks flushed so far
            assert cols.column(0).tolist() == [float(r[0]) for r in expect]
    assert cols.n == len(expect)
    for c in range(3):
        assert cols.column(c).tolist() == [float(r[c]) for r in expect]


def test_empty_columns():
    assert Columns(2).column(1).tolist() == []
