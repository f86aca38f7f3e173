"""Tables written in parts side by side (sim.output.write_tables) are byte for byte what one pass of
pyarrow's writers gives, and leave no part files behind."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import sim.output as output


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    x = rng.random(n) * 1e3
    x[::17] = np.nan   # empty fields
    return pd.DataFrame({"step": np.arange(n), "t": np.cumsum(rng.random(n)), "x": x,
                         "who": [f"r{i % 11}, \"q\"" if i % 5 == 0 else f"r{i}" for i in range(n)]})


@pytest.mark.parametrize("rows", [0, 1, 999, 1000, 1001, 4003])
def test_csv_in_parts_equals_one_pass(tmp_path, monkeypatch, rows):
    monkeypatch.setattr(output, "CSV_PART_ROWS", 1000)
    monkeypatch.setattr(output.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    df = _frame(rows)
    one = tmp_path / "one.csv"
    pacsv.write_csv(pa.Table.from_pandas(df, preserve_index=False), one)
    out = output.write_tables(df, [tmp_path / "steps.csv", tmp_path / "steps.parquet"])
    assert out == [tmp_path / "steps.csv", tmp_path / "steps.parquet"]
    assert (tmp_path / "steps.csv").read_bytes() == one.read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), df)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.csv", "steps.csv", "steps.parquet"]
    if rows:
        back = pd.read_csv(tmp_path / "steps.csv", keep_default_na=False, na_values=[""])
        assert back.step.tolist() == list(range(rows))


def test_a_failing_part_leaves_no_part_files(tmp_path, monkeypatch):
    monkeypatch.setattr(output, "CSV_PART_ROWS", 100)
    monkeypatch.setattr(output.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    real = output._write_csv

    def fail_second(table, path, header):
        if not header:
            real(table, path, header)   # the part file exists, then the write fails
            raise OSError("disk full")
        real(table, path, header)

    monkeypatch.setattr(output, "_write_csv", fail_second)
    with pytest.raises(OSError, match="disk full"):
        output.write_tables(_frame(500), [tmp_path / "steps.csv"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
