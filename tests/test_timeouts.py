"""Client timeouts (``workload.timeout_s``): a request not finished that long after its arrival is aborted at
the engine's next step, queued or running, and its blocks are freed.

References: a run without the timeout (before the first abort both runs are the same step for step, so the
abort falls at its first step starting at or after the deadline), hand arithmetic, and numpy's percentile.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pandas as pd
import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_engine_core import _into_core, _static

from sim import engine_core
from sim.cluster.capacity import SLO
from sim.fuzz import draw_scenario
from sim.goodput import slo_report
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

BASE = {
    "name": "timeouts", "seed": 0, "model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
    "frontend": {"enabled": False},
    "kv_cache": {"block_size": 16, "num_gpu_blocks": 64},
    "scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": 512},
    # r0 runs first (one seat), r1 queues behind it, r2 arrives later
    "workload": {"requests": [{"arrival": 0.0, "prompt_len": 100, "output_len": 40},
                              {"arrival": 0.0, "prompt_len": 60, "output_len": 200},
                              {"arrival": 0.05, "prompt_len": 30, "output_len": 5}]},
}


def _run(timeout: float | None, **changes):
    data = copy.deepcopy(BASE)
    if timeout is not None:
        data["workload"]["timeout_s"] = timeout
    for key, value in changes.items():
        data[key] = value
    return run_scenario(scenario_from_dict(data), check_integrity=True)


def test_a_timeout_that_never_fires_changes_nothing(monkeypatch):
    """Aborts are checked at each step's start (the SimPy loop then steps one step at a time): with a
    deadline nobody reaches, the tables are those of the run without one, in the loop and in the core."""
    plain = _run(None)
    for timed in off_and_on(monkeypatch, engine_core, "enabled", lambda: _run(1e6)):
        pd.testing.assert_frame_equal(plain.requests, timed.requests, check_exact=True)
        pd.testing.assert_frame_equal(plain.steps, timed.steps, check_exact=True)
        assert timed.summary["num_aborted"] == 0 and "num_aborted" not in plain.summary


@pytest.mark.skipif(native is None, reason="sim._native is not built")
@pytest.mark.parametrize("case", range(6))
def test_the_core_aborts_as_the_loop_does(monkeypatch, case):
    """Fuzz cases the core covers, each with a client timeout short enough to abort queued, running, swapped
    and loading requests (every policy, preemption by recompute or by swap, prefix caches and their host
    tiers, static batching, async scheduling, clusters): the same tables."""
    ran = aborted = 0
    for i in range(8 * case, 8 * case + 8):
        rng = random.Random(f"timeouts-core:{i}")
        data = _into_core(draw_scenario(rng, i))
        work = data["workload"]
        if i % 2:   # (a client with a concurrency limit half the time: it gives up at the deadline itself)
            work["max_concurrency"] = rng.choice([1, 2, 4])
        if i % 4 == 2:   # (swaps of their own a quarter of the time; host tiers as drawn)
            data["scheduler"]["preemption"] = "swap"
            data["kv_cache"]["swap_space_gb"] = 0.01
        elif i % 8 == 4:   # (static batching an eighth of the time)
            data = _static(data)
            work = data["workload"]
        work["timeout_s"] = rng.choice([0.0002, 0.001, 0.005])
        if i % 3 == 0:
            data["cluster"] = {"replicas": rng.randint(2, 3), "router": {"policy": rng.choice(
                ["round_robin", "least_requests", "least_kv", "power_of_two"])}}
        loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        assert_same_outcome(loop, core, f"case {i}")
        if not isinstance(core, str):
            ran += bool(core.profile.get("compiled_core"))
            aborted += core.summary.get("num_aborted", 0) > 0
    assert ran >= 5 and aborted >= 2, (ran, aborted)


def test_aborts_fall_at_the_first_step_after_the_deadline():
    plain = _run(None)
    reqs = plain.requests.set_index("req_id")
    starts = plain.steps["start_s"].to_numpy()
    # a timeout after r0 has finished but long before r1 could: r1 is running then, r2 queued behind it
    f0, f1 = float(reqs.loc[0, "finish_s"]), float(reqs.loc[1, "finish_s"])
    timeout = f0 + 0.3 * (f1 - f0)
    timed = _run(timeout)
    out = timed.requests.set_index("req_id")
    assert out.loc[0, "status"] == "FINISHED" and out.loc[1, "status"] == "ABORTED"
    abort = starts[starts >= timeout].min()   # r1's deadline (arrival 0): the same steps as the plain run till then
    assert out.loc[1, "finish_s"] == abort
    assert out.loc[1, "reject_reason"].startswith(f"client timeout after {timeout:g} s (running, ")
    assert math.isnan(out.loc[1, "e2e_s"]) and not math.isnan(out.loc[1, "first_token_s"])   # (tokens out, no E2E)
    # r1's tokens out at its abort: one a step from its first (r1 alone in the batch after r0 finished)
    sampled = int(out.loc[1, "reject_reason"].split(", ")[1].split()[0])
    first = float(reqs.loc[1, "first_token_s"])
    ends = plain.steps["start_s"] + plain.steps["duration_s"]
    assert sampled == int(((ends >= first) & (ends <= abort)).sum()) > 0
    # r2 (one seat) waits for r1's seat: it starts at r1's abort, as it would have at r1's finish
    assert out.loc[2, "first_scheduled_s"] == abort
    assert timed.summary["num_aborted"] == 1


def test_a_beam_search_is_aborted_whole_with_every_beams_blocks():
    """Three beams of one request (their tables forked from the prompt's): aborted at the first step from its
    deadline on, as a single sequence is, every beam's blocks freed (the run checks none is left)."""
    data = copy.deepcopy(BASE)
    data["workload"] = {"requests": [{"arrival": 0.0, "prompt_len": 100, "output_len": 40, "beam_width": 3}]}
    plain = run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True)
    first, finish = float(plain.requests["first_token_s"][0]), float(plain.requests["finish_s"][0])
    timeout = first + 0.5 * (finish - first)
    data["workload"]["timeout_s"] = timeout
    timed = run_scenario(scenario_from_dict(data), check_integrity=True)
    row = timed.requests.iloc[0]
    starts, ends = plain.steps["start_s"].to_numpy(), plain.steps["end_s"].to_numpy()
    abort = starts[starts >= timeout].min()
    assert row["status"] == "ABORTED" and row["finish_s"] == abort
    assert row["reject_reason"] == (f"client timeout after {timeout:g} s (running, "
                                    f"{int((ends <= abort).sum())} tokens out)")   # one token a step from the first
    assert timed.summary["num_aborted"] == 1


def test_a_swapped_out_request_is_aborted_and_its_cpu_blocks_freed(monkeypatch):
    """Twelve GPU blocks for two growing requests, preemption by swap: r1 is swapped out while r0 runs. A
    deadline inside r1's time on the CPU aborts it at the first step from then on, as the run without the
    timeout steps until then, and its CPU blocks are freed (the swap space's check counts them); r0, sent
    with it, is aborted at the same step, running."""
    data = copy.deepcopy(BASE)
    data["kv_cache"] = {"block_size": 16, "num_gpu_blocks": 12, "swap_space_gb": 1}
    data["scheduler"] = {"max_num_seqs": 2, "max_num_batched_tokens": 512, "preemption": "swap"}
    data["workload"] = {"requests": [{"arrival": 0.0, "prompt_len": 60, "output_len": 100}] * 2}
    plain = run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True)
    assert plain.profile["compiled_core"] == (native is not None)   # (swaps with timeouts in the core: 2026-12-06)
    tl = plain.timeline
    out_at, back_at = tl.loc[(tl["req_id"] == 1) & (tl["phase"] == "swapped"), ["start_s", "end_s"]].iloc[0]
    timeout = (out_at + back_at) / 2
    data["workload"]["timeout_s"] = timeout
    loop, timed = off_and_on(monkeypatch, engine_core, "enabled",
                             lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, timed)
    starts = plain.steps["start_s"].to_numpy()
    abort = starts[starts >= timeout].min()
    r0, r1 = timed.requests.iloc[0], timed.requests.iloc[1]
    assert r1["status"] == "ABORTED" and r1["finish_s"] == abort < back_at
    assert r1["reject_reason"].startswith(f"client timeout after {timeout:g} s (swapped, ")
    # r0's deadline is the same one: it is aborted at the same step, while running
    assert r0["status"] == "ABORTED" and r0["reject_reason"].startswith(f"client timeout after {timeout:g} s (running, ")
    assert timed.summary["num_aborted"] == 2 and timed.summary["swapped_blocks"] > 0


def test_a_request_still_queued_is_aborted_and_the_rest_run_on():
    """Timeout shorter than r0's service: r0 itself is aborted while running, and r1, r2 behind it."""
    timed = _run(0.001)
    assert list(timed.requests["status"]) == ["ABORTED"] * 3
    assert timed.summary["num_finished"] == 0 and timed.summary["num_aborted"] == 3


def test_slo_figures_count_aborted_requests_beyond_every_bound():
    reqs = pd.DataFrame({"status": ["FINISHED"] * 9 + ["ABORTED"], "ttft_s": [0.1 * i for i in range(1, 10)] + [np.nan],
                         "tpot_s": [0.01] * 9 + [np.nan], "e2e_s": [1.0] * 9 + [np.nan]})
    summary = {"ttft_s": {"p50": 0.5, "p90": 0.9}, "e2e_s": {"mean": 1.0}, "makespan_s": 10.0}
    rep = slo_report(reqs, summary, [SLO("ttft_s", "p50", 0.6), SLO("ttft_s", "p90", 1.0), SLO("e2e_s", "mean", 2)])
    finite = np.concatenate([np.arange(1, 10) * 0.1, [1e9]])
    assert rep["ttft_p50"] == pytest.approx(np.percentile(finite, 50))     # 0.55: between the 5th and 6th
    assert rep["ttft_p90"] == math.inf and rep["e2e_mean"] == math.inf     # the 10th value is the aborted one
    assert rep["attain_ttft_p50"] == pytest.approx(5 / 10) and not rep["meets"]
    assert rep["goodput_req_s"] == pytest.approx(5 / 10.0)


def test_a_static_batch_member_is_aborted_and_the_batch_ends_with_its_last_member(monkeypatch):
    """Static batching, two seats: r0 and r1 form a batch, r2 waits for the next. A deadline after r0 has
    finished (idle, holding its memory) and before r1 has: r1 leaves at the first step from then on, the
    batch is over, both give their memory back, and r2's batch starts at that very step (in the SimPy loop and
    in the core alike)."""
    data = copy.deepcopy(BASE)
    data["scheduler"] = {"batching": "static", "max_num_seqs": 2, "max_num_batched_tokens": 512,
                         "chunked_prefill": False}
    plain = run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True)
    was = plain.requests.set_index("req_id")
    f0, f1 = float(was.loc[0, "finish_s"]), float(was.loc[1, "finish_s"])
    timeout = f0 + 0.3 * (f1 - f0)
    data["workload"]["timeout_s"] = timeout
    loop, timed = off_and_on(monkeypatch, engine_core, "enabled",
                             lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, timed)
    out = timed.requests.set_index("req_id")
    starts = plain.steps["start_s"].to_numpy()
    abort = starts[starts >= timeout].min()
    assert list(out["status"]) == ["FINISHED", "ABORTED", "FINISHED"]
    assert out.loc[1, "finish_s"] == abort and out.loc[1, "reject_reason"].startswith(
        f"client timeout after {timeout:g} s (running, ")
    assert out.loc[2, "first_scheduled_s"] == abort < was.loc[2, "first_scheduled_s"]
    assert timed.profile["compiled_core"] == (native is not None) and not loop.profile["compiled_core"]


def test_a_cluster_counts_aborted_requests_out_of_each_replicas_load():
    data = copy.deepcopy(BASE)
    data["workload"] = {"synthetic": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 200.0},
                                      "prompt_len": {"dist": "fixed", "value": 200},
                                      "output_len": {"dist": "fixed", "value": 50}}, "timeout_s": 0.05}
    data["cluster"] = {"replicas": 2, "router": {"policy": "least_requests"}}
    res = run_scenario(scenario_from_dict(data), check_integrity=True)
    reqs = res.requests
    assert res.summary["num_aborted"] == int((reqs["status"] == "ABORTED").sum()) > 0
    assert res.summary["num_finished"] + res.summary["num_aborted"] + res.summary["num_rejected"] == 40
    per = reqs[reqs["status"] == "ABORTED"]["replica"].value_counts().reindex([0, 1], fill_value=0)
    assert list(res.replicas["aborted"]) == list(per)
    done = reqs[reqs["status"] == "FINISHED"]
    assert (done["e2e_s"] <= 0.05 + res.steps["duration_s"].max()).all()   # nobody finished long past it


def test_a_client_that_gives_up_sends_its_next_request_at_the_deadline(monkeypatch):
    """One slot, no pause: the client sends r0 at 0; when r0 is not whole 0.02 s later it gives up and sends
    r1 then (its slot is free at the deadline, not when the engine notices at its next step); the same in
    the SimPy loop and in the core."""
    data = copy.deepcopy(BASE)
    data["scheduler"]["max_num_seqs"] = 4
    data["workload"] = {"requests": [{"arrival": 0.0, "prompt_len": 100, "output_len": 500},
                                     {"arrival": 0.0, "prompt_len": 30, "output_len": 3}],
                        "max_concurrency": 1, "timeout_s": 0.02}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same_outcome(loop, core, "one slot")
    assert core.profile["compiled_core"] == (native is not None) and not loop.profile["compiled_core"]
    reqs = core.requests.set_index("req_id")
    assert reqs.loc[0, "status"] == "ABORTED" and reqs.loc[0, "finish_s"] >= 0.02
    assert reqs.loc[1, "arrival_s"] == 0.0 + 0.02          # sent at r0's deadline
    assert reqs.loc[1, "client_wait_s"] == pytest.approx(0.02)
    assert reqs.loc[1, "status"] == "FINISHED"
