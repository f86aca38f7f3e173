"""The compact record stores: inter-token gaps, timeline transitions, step columns handed over to the
table, and the tables and summary built from them (values worked out by hand)."""

import math
from array import array

import numpy as np
import pandas as pd
import pytest

from sim.metrics import Columns, Recorder, itl_stats, requests_frame, summarize
from sim.request import Request, RequestStatus
from sim.runner import timeline_with_frontend
from sim.sched.records import Phase, StepGaps, TokenGaps, Transitions, transition_intervals


def test_step_gaps_append_extend_and_iterate():
    g = StepGaps()
    g.append((0.5, 3))
    g.extend([(0.25, 1), (np.float64(0.125), np.int64(2))])
    g.extend((d, 4) for d in (1.0, 2.0))
    other = StepGaps()
    other.append((8.0, 1))
    g.extend(other)
    assert list(g) == [(0.5, 3), (0.25, 1), (0.125, 2), (1.0, 4), (2.0, 4), (8.0, 1)]
    assert len(g) == 6
    d, c = g.arrays()
    assert d.dtype == np.float64 and c.dtype == np.int64
    assert d.tolist() == [0.5, 0.25, 0.125, 1.0, 2.0, 8.0] and c.tolist() == [3, 1, 2, 4, 4, 1]


def test_itl_stats_weights_step_gaps_by_their_counts():
    gaps = TokenGaps()
    gaps.step_gaps.append((0.1, 3))   # three tokens 0.1 s apart
    gaps.step_gaps.append((0.2, 1))
    gaps.other_gaps.append(0.5)       # one gap across a preemption
    gaps.other_gaps.extend([0.5])
    # the gaps one by one: 0.1 0.1 0.1 0.2 0.5 0.5
    st = itl_stats(gaps.step_gaps, gaps.other_gaps)
    assert st["mean"] == pytest.approx(1.5 / 6)
    assert st["p50"] == 0.1     # the 3rd of 6
    assert st["p90"] == 0.5     # the 6th (5.4 rounds up)
    assert st["p99"] == 0.5
    # plain lists of pairs still work
    assert itl_stats([(0.1, 3), (0.2, 1)], [0.5, 0.5]) == st


def test_itl_stats_empty():
    st = itl_stats(StepGaps(), array("d"))
    assert all(math.isnan(v) for v in st.values())


def _transitions(records):
    tr = Transitions()
    for rec in records:
        tr.append(rec)
    return tr


def test_transition_intervals_sort_by_request_then_time_keeping_ties_in_order():
    tr = _transitions([(1, 0.0, Phase.WAITING), (0, 0.5, Phase.WAITING), (1, 1.0, Phase.PREFILL),
                       (0, 1.0, Phase.PREFILL), (1, 2.0, Phase.DONE), (0, 1.0, Phase.DECODE),
                       (0, 3.0, Phase.DONE)])
    assert len(tr) == 7 and list(tr)[1] == (0, 0.5, int(Phase.WAITING))
    rid, phase, start, end = transition_intervals(tr)
    assert rid.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert [Phase(p).name for p in phase] == ["WAITING", "PREFILL", "DECODE", "DONE", "WAITING", "PREFILL", "DONE"]
    assert start.tolist() == [0.5, 1.0, 1.0, 3.0, 0.0, 1.0, 2.0]
    assert end.tolist() == [1.0, 1.0, 3.0, 3.0, 1.0, 2.0, 2.0]


def test_timeline_with_frontend_puts_each_request_frontend_interval_first():
    tr = _transitions([(0, 0.25, Phase.WAITING), (1, 1.25, Phase.WAITING), (0, 2.0, Phase.PREFILL),
                       (0, 3.0, Phase.DONE), (1, 4.0, Phase.DONE)])
    reqs = pd.DataFrame({"req_id": [0, 1], "arrival_s": [0.0, 1.0]})
    tl = timeline_with_frontend(tr, reqs, 0.25)
    assert tl.columns.tolist() == ["req_id", "phase", "start_s", "end_s"]
    assert tl.values.tolist() == [[0, "frontend", 0.0, 0.25], [0, "waiting", 0.25, 2.0], [0, "prefill", 2.0, 3.0],
                                  [0, "done", 3.0, 3.0], [1, "frontend", 1.0, 1.25], [1, "waiting", 1.25, 4.0],
                                  [1, "done", 4.0, 4.0]]
    assert tl["req_id"].dtype == np.int64 and tl["start_s"].dtype == np.float64
    plain = timeline_with_frontend(tr, reqs, 0.0)
    assert plain["phase"].tolist() == ["waiting", "prefill", "done", "waiting", "done"]


def test_columns_read_casts_and_releases(monkeypatch):
    monkeypatch.setattr(Columns, "CHUNK_ROWS", 4)
    monkeypatch.setattr(Columns, "ROWS_QUEUED", 3)
    cols = Columns(2)
    for i in range(10):
        cols.append((i * 0.5, i * 3))
    cols.extend([np.array([100.5, 101.5]), 7])
    a, b = cols.read([np.float64, np.int64])
    assert a.tolist() == [i * 0.5 for i in range(10)] + [100.5, 101.5]
    assert b.dtype == np.int64 and b.tolist() == [i * 3 for i in range(10)] + [7, 7]
    a2, b2 = cols.read([np.float64, np.int64], release=True)   # the same rows, then gone
    assert a2.tolist() == a.tolist() and b2.tolist() == b.tolist()
    assert cols.n == 12
    with pytest.raises(RuntimeError):
        cols.read([np.float64, np.int64])
    with pytest.raises(RuntimeError):
        cols.column(0)


def test_steps_frame_release_gives_the_recorded_rows():
    rec = Recorder(num_gpu_blocks=10, capacity_slots=160)
    rec.record_run(np.array([0.0, 1.0, 3.0]), np.array([1.0, 2.0, 0.5]), batch_size=2, num_decode_tokens=2,
                   num_running=2, num_waiting=1, num_swapped=0, kv_blocks_used=np.array([4, 5, 5]),
                   slots=(40, 10, 6, 0, 104), breakdown={"linear": np.array([0.5, 1.0, 0.25])})
    st = rec.steps_frame(release=True)
    assert st["step"].tolist() == [0, 1, 2]
    assert st["end_s"].tolist() == [1.0, 3.0, 3.5]
    assert st["kv_blocks_used"].dtype == np.int64 and st["kv_blocks_used"].tolist() == [4, 5, 5]
    assert st["kv_usage"].tolist() == [0.4, 0.5, 0.5]
    assert st["batch_size"].tolist() == [2, 2, 2] and st["num_prefill_tokens"].tolist() == [0, 0, 0]
    assert st["slots_free"].tolist() == [104] * 3
    assert st["time_linear_s"].tolist() == [0.5, 1.0, 0.25]
    assert rec.num_steps == 3


def _req(i, arrival, status, first_sched=math.nan, first_tok=math.nan, finish=math.nan, out=4):
    r = Request(req_id=i, arrival_s=arrival, prompt_len=8, output_len=out)
    r.status = status
    r.first_scheduled_s, r.first_token_s, r.finish_s = first_sched, first_tok, finish
    return r


def test_requests_frame_dtypes_and_summary_over_finished_only():
    reqs = [_req(0, 0.0, RequestStatus.FINISHED, 0.5, 1.0, 4.0),
            _req(1, 1.0, RequestStatus.REJECTED, finish=1.0),
            _req(2, 2.0, RequestStatus.FINISHED, 2.0, 2.5, 5.5)]
    reqs[1].reject_reason = "too long"
    df = requests_frame(reqs)
    assert df["req_id"].dtype == np.int64 and df["arrival_s"].dtype == np.float64
    assert df["status"].tolist() == ["FINISHED", "REJECTED", "FINISHED"]
    assert df["reject_reason"].tolist() == ["", "too long", ""]
    rec = Recorder(num_gpu_blocks=10, capacity_slots=160)
    rec.record_run(np.array([0.0, 1.0]), np.array([1.0, 3.0]), batch_size=1, num_decode_tokens=1, num_running=1,
                   num_waiting=0, num_swapped=0, kv_blocks_used=np.array([2, 4]), slots=(16, 0, 0, 0, 144),
                   breakdown={})
    gaps = TokenGaps()
    gaps.step_gaps.append((1.0, 2))

    class Sched:
        num_truncated = num_preemptions = swapped_blocks = 0

    Sched.gaps = gaps
    s = summarize(df, rec.steps_frame(release=True), Sched, capacity_slots=160, wall_time_s=0.0)
    assert s["num_finished"] == 2 and s["num_rejected"] == 1
    assert s["ttft_s"]["mean"] == pytest.approx((1.0 + 0.5) / 2)   # the rejected request left out
    assert s["queue_wait_max_s"] == 0.5          # request 0 waited 0.5 s, request 2 none
    assert s["queue_wait_p99_s"] == pytest.approx(0.5 - 0.01 * 0.5)
    assert s["makespan_s"] == 5.5
    assert s["kv_usage_mean"] == pytest.approx((0.2 * 1 + 0.4 * 3) / 4)
    assert s["memory_breakdown"]["token_states"] == pytest.approx(16 / 160)
    assert s["memory_breakdown"]["free"] == pytest.approx(144 / 160)
