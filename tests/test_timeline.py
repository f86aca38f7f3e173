"""The timeline: state intervals from the scheduler's transitions or from requests.csv, and the figure."""

import math

import pandas as pd
from test_sched_util import simulate

from sim.request import Request
from sim.timeline import intervals_from_requests, timeline


def test_intervals_from_requests_by_hand():
    req = pd.DataFrame({"req_id": [0, 1], "status": ["FINISHED", "REJECTED"], "arrival_s": [0.5, 0.0],
                        "first_scheduled_s": [1.0, math.nan], "first_token_s": [1.5, math.nan],
                        "finish_s": [4.0, 0.0]})
    iv = intervals_from_requests(req)
    assert iv.values.tolist() == [[0, "waiting", 0.5, 1.0], [0, "prefill", 1.0, 1.5], [0, "decode", 1.5, 4.0]]


def test_transitions_cover_each_request_without_gaps(tmp_path):
    reqs = [Request(i, 0.0, 4, out) for i, out in enumerate([5, 3, 8, 2, 3])]
    sch, _ = simulate(reqs, 12, 4, batching="static", max_num_seqs=4)
    tl = sch.timeline_frame()
    for _, g in tl.groupby("req_id"):
        assert g["start_s"].iloc[0] == 0.0 and g["phase"].iloc[-1] == "done"
        assert (g["start_s"].iloc[1:].to_numpy() == g["end_s"].iloc[:-1].to_numpy()).all()
    path = timeline({"static": tl, "again": tl}, tmp_path / "t.png")
    assert path.stat().st_size > 1000


def test_big_runs_are_cut_to_the_first_requests(tmp_path):
    iv = pd.DataFrame({"req_id": range(1000), "phase": "decode", "start_s": 0.0, "end_s": 1.0})
    assert timeline(iv, tmp_path / "big.png", max_requests=200).stat().st_size > 1000


def test_the_legend_names_the_phases_drawn(tmp_path, monkeypatch):
    import sim.timeline as tl

    figures = []
    monkeypatch.setattr(tl.plt, "close", figures.append)
    iv = pd.DataFrame({"req_id": [0, 0, 1, 1], "phase": ["waiting", "decode", "prefill", "kv_wait"],
                       "start_s": [0.0, 1.0, 0.0, 2.0], "end_s": [1.0, 2.0, 2.0, 2.0]})   # kv_wait: empty
    tl.timeline({"a": iv, "b": iv.assign(phase=["waiting", "decode", "prefill", "swapped"])}, tmp_path / "t.png")
    labels = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert labels == ["waiting", "prefill", "decode"]   # in PHASE_COLORS order; no empty interval's phase


def test_frontend_rows_merge_as_a_stable_sort_by_request_then_start():
    """``timeline_with_frontend`` inserts each request's frontend row where its states begin; a stable
    sort of all rows by request, then start (frontend rows first at equal times) is the reference. Random
    timelines: requests without states (refused), states at the arrival itself, equal start times."""
    import numpy as np

    from sim.runner import timeline_with_frontend
    from sim.sched.records import PHASE_NAMES, Transitions

    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 25))
        arrive = np.sort(rng.integers(0, 50, n)) / 100
        tr = Transitions()
        for r in rng.permutation(n).tolist():   # recorded in any request order, each request's in time order
            t = arrive[r] + 0.01 * int(rng.integers(0, 2))
            for k in range(int(rng.integers(0, 5))):   # (0: refused, no state)
                tr.append((r, float(t), k % len(PHASE_NAMES)))
                t += 0.01 * int(rng.integers(0, 3))
        reqs = pd.DataFrame({"req_id": np.arange(n), "arrival_s": arrive})
        got = timeline_with_frontend(tr, reqs, 0.01)
        rid = np.concatenate([np.arange(n), np.frombuffer(tr.req_id, dtype=np.int64)])
        start = np.concatenate([arrive, np.frombuffer(tr.time, dtype=np.float64)])
        order = np.lexsort((start, rid))
        names = np.array([*PHASE_NAMES, "frontend"], dtype=object)
        phase = names[np.concatenate([np.full(n, len(PHASE_NAMES)), np.frombuffer(tr.phase, dtype=np.int8)])]
        assert got["req_id"].tolist() == rid[order].tolist()
        assert got["start_s"].tolist() == start[order].tolist()
        assert got["phase"].tolist() == phase[order].tolist()
        front = got[got["phase"] == "frontend"]
        assert (front["end_s"] - front["start_s"]).round(12).eq(0.01).all()
