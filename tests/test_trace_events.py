"""--trace-events: Chrome trace-event JSON of a run, checked by an independent format checker."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from trace_format import check_trace

from sim.cli import main
from sim.trace_events import trace_events

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "scenarios" / "seed_four_requests.yaml")


def _steps(starts, durs, prefill, decode, usage) -> pd.DataFrame:
    n = len(starts)
    return pd.DataFrame({
        "step": range(n), "start_s": starts, "duration_s": durs, "batch_size": [2] * n,
        "num_prefill_tokens": prefill, "num_decode_tokens": decode, "kv_usage": usage,
        "slots_token_states": [10] * n, "slots_reserved": [2] * n, "slots_internal_frag": [1] * n,
        "slots_external_frag": [0] * n, "slots_free": [3] * n, "time_linear_s": [0.001] * n,
    })


def _of(trace: dict, ph: str, **match) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in match.items())]


def test_steps_become_slices_and_counters_in_microseconds():
    steps = _steps([0.0, 0.5, 1.0], [0.5, 0.25, 0.1], [100, 0, 0], [0, 2, 2], [0.1, 0.2, 0.3])
    intervals = pd.DataFrame({"req_id": [0, 0, 1], "phase": ["waiting", "decode", "prefill"],
                              "start_s": [0.0, 0.2, 0.5], "end_s": [0.2, 0.75, 1.1]})
    trace = trace_events(steps, intervals)
    assert check_trace(trace) == []
    slices = _of(trace, "X", cat="step")
    assert [(e["ts"], e["dur"]) for e in slices] == [(0.0, 500000.0), (500000.0, 250000.0), (1000000.0, 100000.0)]
    assert [e["args"]["prefill_tokens"] for e in slices] == [100, 0, 0]
    assert slices[0]["args"]["linear_ms"] == pytest.approx(1.0)
    usage = _of(trace, "C", name="KV usage (%)")
    assert [e["args"]["used"] for e in usage] == pytest.approx([10, 20, 30])
    mem = _of(trace, "C", name="KV memory (slots)")[0]["args"]
    assert mem == {"token states": 10, "reserved": 2, "internal fragmentation": 1,
                   "external fragmentation": 0, "free": 3}
    req = _of(trace, "X", cat="request")
    assert [(e["tid"], e["name"], e["ts"], e["dur"]) for e in req] == [
        (1, "waiting", 0.0, 200000.0), (1, "decode", 200000.0, 550000.0), (2, "prefill", 500000.0, 600000.0)]
    names = {e["args"]["name"] for e in _of(trace, "M", name="thread_name")}
    assert names == {"steps", "req 0", "req 1"}


def test_long_runs_merge_consecutive_steps_and_limit_requests():
    steps = _steps([0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 3.0], [10, 20, 30, 40], [1, 1, 1, 1],
                   [0.0, 0.5, 0.5, 1.0])
    intervals = pd.DataFrame({"req_id": [5, 3, 9], "phase": ["decode"] * 3, "start_s": [0.0] * 3,
                              "end_s": [1.0] * 3})
    trace = trace_events(steps, intervals, request_limit=2, max_step_slices=2)
    assert check_trace(trace) == []
    slices = _of(trace, "X", cat="step")
    assert [e["name"] for e in slices] == ["steps 0-1", "steps 2-3"]
    assert [(e["ts"], e["dur"]) for e in slices] == [(0.0, 2e6), (2e6, 4e6)]
    assert [e["args"]["prefill_tokens"] for e in slices] == [30, 70]
    assert [e["args"]["steps"] for e in slices] == [2, 2]
    assert [e["args"]["batch_size_mean"] for e in slices] == [2.0, 2.0]
    # duration-weighted means: (0*1 + 0.5*1)/2 and (0.5*1 + 1.0*3)/4
    assert [e["args"]["used"] for e in _of(trace, "C", name="KV usage (%)")] == pytest.approx([25.0, 87.5])
    assert sorted(e["tid"] for e in _of(trace, "X", cat="request")) == [4, 6]  # req 3 and 5, not 9
    assert trace["otherData"]["requests_shown"] == 2 and trace["otherData"]["requests"] == 3


def test_one_engine_track_per_replica_and_any_phase_name():
    steps = pd.concat([_steps([0.0, 1.0], [1.0, 1.0], [4, 0], [0, 1], [0.1, 0.1]).assign(replica=0),
                       _steps([0.5], [2.0], [8], [0], [0.2]).assign(replica=1)], ignore_index=True)
    intervals = pd.DataFrame({"req_id": [0, 0], "phase": ["prefill", "transferring"], "start_s": [0.0, 1.0],
                              "end_s": [1.0, 1.5]})
    trace = trace_events(steps, intervals)
    assert check_trace(trace) == []  # replica 1's step overlaps replica 0's in time, on its own track
    names = {e["pid"]: e["args"]["name"] for e in _of(trace, "M", name="process_name")}
    assert [names[p] for p in (1, 2)] == ["engine (replica 0)", "engine (replica 1)"]
    assert [len(_of(trace, "X", cat="step", pid=p)) for p in (1, 2)] == [2, 1]
    assert [e["name"] for e in _of(trace, "X", cat="request")] == ["prefill", "transferring"]


def test_checker_catches_overlaps_and_missing_fields():
    bad = {"traceEvents": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10},
        {"ph": "X", "name": "c", "pid": 1, "tid": 2, "ts": 0, "dur": -1},
        {"ph": "C", "name": "c", "pid": 1, "ts": 0, "args": {"x": "high"}},
    ]}
    errs = check_trace(bad)
    assert len(errs) == 3 and any("overlaps" in e for e in errs)
    nested = {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                              {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": 3}]}
    assert check_trace(nested) == []


def test_run_writes_a_valid_trace_matching_the_csvs(tmp_path):
    out, trace_path = tmp_path / "out", tmp_path / "t" / "trace.json"
    rc = main(["run", SEED, "--out", str(out), "--no-plots", "--trace-events", str(trace_path),
               "--trace-events-limit", "5"])
    assert rc == 0
    trace = json.loads(trace_path.read_text())
    assert check_trace(trace) == []
    steps, reqs = pd.read_csv(out / "steps.csv"), pd.read_csv(out / "requests.csv")
    slices = _of(trace, "X", cat="step")
    assert len(slices) == len(steps)
    assert sum(e["dur"] for e in slices) == pytest.approx(steps["duration_s"].sum() * 1e6)
    assert sum(e["args"]["decode_tokens"] for e in slices) == steps["num_decode_tokens"].sum()
    req = _of(trace, "X", cat="request")
    assert sorted({e["tid"] - 1 for e in req}) == [0, 1, 2, 3, 4]
    for rid in range(5):
        mine = [e for e in req if e["tid"] == rid + 1]
        row = reqs.set_index("req_id").loc[rid]
        assert min(e["ts"] for e in mine) == pytest.approx(row["arrival_s"] * 1e6, abs=1e-3)
        assert max(e["ts"] + e["dur"] for e in mine) == pytest.approx(row["finish_s"] * 1e6, abs=1e-3)


def test_compare_writes_one_trace_per_run(tmp_path):
    rc = main(["compare", SEED, "--vary", "scheduler.batching=static,continuous", "--no-plots",
               "--trace-events", str(tmp_path / "cmp.json")])
    assert rc == 0
    for label in ("static", "continuous"):
        trace = json.loads((tmp_path / f"cmp.batching-{label}.json").read_text())
        assert check_trace(trace) == []
        assert _of(trace, "X", cat="request")


@pytest.mark.parametrize("args", [["--trace-events-limit", "-1"], ["--trace-events", "{tmp}"],
                                  ["--trace-events", "{tmp}/f/x.json"]])
def test_bad_trace_arguments_exit_2_and_write_nothing(tmp_path, capsys, args):
    (tmp_path / "f").write_text("a file, not a folder")
    argv = ["run", SEED, "--out", str(tmp_path / "out"), *[a.format(tmp=tmp_path) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --trace-events")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_sweep_writes_one_trace_per_run(tmp_path):
    base = {"name": "tiny", "model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 4, "num_gpu_blocks": 40}, "output": {"plots": False},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 8, "output_len": 3},
                                      {"arrival": 0.0, "prompt_len": 12, "output_len": 2}]}}
    (tmp_path / "base.yaml").write_text(json.dumps(base))
    (tmp_path / "sweep.yaml").write_text(json.dumps({"base": "base.yaml", "out": "res",
                                                     "grid": {"kv_cache.block_size": [4, 8]}}))
    rc = main(["sweep", str(tmp_path / "sweep.yaml"), "--workers", "1", "--quiet",
               "--trace-events", str(tmp_path / "traces")])
    assert rc == 0
    ids = pd.read_csv(tmp_path / "res" / "results.csv")["task_id"].astype(str).tolist()
    assert sorted(p.stem for p in (tmp_path / "traces").glob("*.json")) == sorted(ids)
    for task in ids:
        trace = json.loads((tmp_path / "traces" / f"{task}.json").read_text())
        assert check_trace(trace) == []
        # 8 + 12 prompt tokens, 3 + 2 outputs: every request's first token comes with its prefill
        assert sum(e["args"]["prefill_tokens"] for e in _of(trace, "X", cat="step")) == 20
        assert sum(e["args"]["decode_tokens"] for e in _of(trace, "X", cat="step")) == 3
