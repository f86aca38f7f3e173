"""The per-step table written while the run goes (sim/step_stream.py): the same files as writing the finished
table afterwards, and nothing left behind when the run fails or the table comes out otherwise."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import sim.step_stream as step_stream
from sim import run_scenario, scenario_from_dict
from sim.cli import main as kvsim_main
from sim.metrics import Columns, Recorder
from sim.output import write_tables
from sim.sched.plan import StepPlan, StepResult
from sim.step_stream import StepTableStream

SCENARIO = {
    "name": "stream", "seed": 3, "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 96},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 40.0},
                               "prompt_len": {"dist": "uniform", "min": 4, "max": 60},
                               "output_len": {"dist": "uniform", "min": 1, "max": 80}}},
}


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of 16 rows, single rows queued by 4, Parquet row groups of 48: a short run streams many
    chunks and row groups."""
    monkeypatch.setattr(Columns, "CHUNK_ROWS", 16)
    monkeypatch.setattr(Columns, "ROWS_QUEUED", 4)
    monkeypatch.setattr(step_stream, "PARQUET_ROW_GROUP", 48)


@pytest.mark.parametrize("multi_step", [True, False])
def test_streamed_files_equal_the_finished_table(tmp_path, small_chunks, multi_step):
    data = {**SCENARIO, "scheduler": {"multi_step": multi_step}}
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert kvsim_main(["run", str(path), "--out", str(out)]) == 0
    # the reference: the same scenario run without a stream, its table written after the run
    steps = run_scenario(scenario_from_dict(data, base_dir=tmp_path)).steps
    assert len(steps) > 10 * 16   # many chunks, a decode run across chunk boundaries
    ref = tmp_path / "ref"
    ref.mkdir()
    write_tables(steps, [ref / "steps.csv", ref / "steps.parquet"])
    assert (out / "steps.csv").read_bytes() == (ref / "steps.csv").read_bytes()
    assert pq.read_table(out / "steps.parquet").equals(pq.read_table(ref / "steps.parquet"))
    # written in row groups of 48 (streamed), not as the one group of a table written afterwards
    assert pq.ParquetFile(out / "steps.parquet").metadata.num_row_groups == -(-len(steps) // 48)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "ref", "scn.yaml"]   # no staging debris


def test_run_failing_after_chunks_were_streamed_leaves_nothing(tmp_path, small_chunks, monkeypatch):
    import sim.runner

    real = sim.runner.make_executor

    class Failing:
        def __init__(self, inner) -> None:
            self.inner, self.n = inner, 0

        def execute(self, plan):
            self.n += 1
            if self.n == 200:   # past several 16-row chunks
                raise RuntimeError("injected")
            return self.inner.execute(plan)

    monkeypatch.setattr(sim.runner, "make_executor", lambda *a, **k: Failing(real(*a, **k)))
    puts = []
    monkeypatch.setattr(StepTableStream, "put", lambda self, names, cols, real_put=StepTableStream.put:
                        (puts.append(len(cols[0])), real_put(self, names, cols)))
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "scheduler": {"multi_step": False}}))
    with pytest.raises(RuntimeError, match="injected"):
        kvsim_main(["run", str(path), "--out", str(tmp_path / "out")])
    assert len(puts) >= 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scn.yaml"]


def _record(rec: Recorder, sched, breakdown: dict[str, float]) -> None:
    rec.record_step(float(rec.num_steps), StepPlan(scheduled=[]), StepResult(0.5, breakdown), sched)


class _Sched:
    """What ``Recorder.record_step`` reads of a scheduler (an idle engine)."""

    class stats:
        num_prefill_tokens = num_decode_tokens = num_preempted = 0

    class manager:
        num_blocks = 10

        @staticmethod
        def num_free_blocks() -> int:
            return 10

        @staticmethod
        def memory_slots() -> tuple:
            return (0, 0, 0, 0, 40)

    running: list = []

    @staticmethod
    def num_waiting() -> int:
        return 0

    @staticmethod
    def num_swapped() -> int:
        return 0


@pytest.mark.parametrize("late", [5, 20])
def test_a_breakdown_that_starts_late(tmp_path, small_chunks, late):
    # the table carries the breakdown columns only when every step has them; here the first ``late`` steps
    # have none. Started before the first chunk was handed over (5), the stream carries them and is not
    # the table: its files go. Started after it (20: the first chunk went at row 20), it is the table.
    stream = StepTableStream(tmp_path / "s.csv", tmp_path / "s.parquet")
    rec = Recorder(num_gpu_blocks=10, capacity_slots=40)
    rec.stream_to(stream, block_bytes=64)
    for i in range(70):
        _record(rec, _Sched, {} if i < late else {"linear": 0.25})
    rec.finish_stream()
    table = rec.steps_frame()
    table["kv_bytes_used"] = table["kv_blocks_used"] * 64
    assert "time_linear_s" not in table.columns
    kept = stream.close(list(table.columns), len(table))
    assert kept == (late == 20)
    if kept:
        write_tables(table, [tmp_path / "ref.csv"])
        assert (tmp_path / "s.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()
    else:
        assert not (tmp_path / "s.csv").exists() and not (tmp_path / "s.parquet").exists()


def test_a_recorder_streams_whole_chunks_while_recording(tmp_path, small_chunks):
    stream = StepTableStream(tmp_path / "s.csv", tmp_path / "s.parquet")
    rec = Recorder(num_gpu_blocks=10, capacity_slots=40)
    rec.stream_to(stream, block_bytes=64)
    for _ in range(50):
        _record(rec, _Sched, {"linear": 0.25})
    # 48 rows written (queued by 4), so three chunks filled; a chunk is handed over when the next one
    # starts: two of them now, the rest at the end
    assert stream.rows == 32
    rec.finish_stream()
    table = rec.steps_frame()
    table["kv_bytes_used"] = table["kv_blocks_used"] * 64
    assert stream.close(list(table.columns), 50)
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert len(lines) == 51 and lines[0].split(",")[:2] == ['"step"', '"start_s"']
    assert [int(line.split(",")[0]) for line in lines[1:]] == list(range(50))
    assert Path(tmp_path / "s.parquet").exists()


def test_a_stream_that_is_not_the_table_is_written_again(tmp_path, small_chunks, monkeypatch):
    monkeypatch.setattr(StepTableStream, "matches", lambda self, names, rows: False)
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    assert kvsim_main(["run", str(path), "--out", str(out)]) == 0
    steps = run_scenario(scenario_from_dict(SCENARIO, base_dir=tmp_path)).steps
    write_tables(steps, [tmp_path / "ref.csv"])
    assert (out / "steps.csv").read_bytes() == (tmp_path / "ref.csv").read_bytes()
    assert pq.ParquetFile(out / "steps.parquet").metadata.num_row_groups == 1   # written after the run
