"""Where a request's time goes (sim/latency_breakdown.py): the parts add up to the mean E2E under every
kind of run; a disaggregated request's KV wait is requests.csv's kv_wait_s; a lone request's parts by
hand; the figure is written by kvsim run and compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.latency_breakdown import latency_breakdown, phase_means
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
        "kv_cache": {"block_size": 16, "num_gpu_blocks": 400}}


def _mean_e2e(res) -> float:
    done = res.requests[res.requests["status"] == "FINISHED"]
    return float(done["e2e_s"].mean())


@pytest.mark.parametrize("sets", [
    [],                                                        # the quickstart: queueing, preemption
    ["scheduler.batching=static", "scheduler.chunked_prefill=false"],   # finished requests idle until the batch ends
    ["cluster={replicas: 3, router: {policy: least_requests}}"],
    ["cluster={prefill: {replicas: 1}, decode: {replicas: 2, scheduler: {max_num_seqs: 4}}}"],   # pulled KV waits
    ["cluster={prefill: {replicas: 1}, decode: {replicas: 2}, kv_transfer: {mode: push}}"],
])
def test_the_parts_add_up_to_the_mean_e2e(sets):
    res = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.limit=150", *sets]))
    parts = phase_means(res.timeline, res.requests)
    assert parts.sum() == pytest.approx(_mean_e2e(res), rel=1e-9)
    assert {"waiting", "prefill", "decode"} <= set(parts.index) and (parts >= 0).all()


def test_a_pulled_requests_kv_wait_is_its_kv_wait_s():
    res = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
        "workload.limit=150", "cluster={prefill: {replicas: 1}, decode: {replicas: 2, scheduler: {max_num_seqs: 4}}}"]))
    done = res.requests[res.requests["status"] == "FINISHED"]
    parts = phase_means(res.timeline, res.requests)
    assert parts["kv_wait"] > 0
    assert parts["kv_wait"] == pytest.approx(float(done["kv_wait_s"].fillna(0.0).mean()), rel=1e-9)
    assert parts["transferring"] == pytest.approx(float(done["transfer_s"].fillna(0.0).mean()), rel=1e-9)


def test_a_lone_request_by_hand():
    """One request alone on an idle engine, frontend latencies 10 ms in and 20 ms out, nothing per token:
    the frontend in, no wait, its prefill step, its decode steps, the frontend out."""
    data = {**TINY, "frontend": {"enabled": True, "input_latency_s": 0.01, "output_latency_s": 0.02,
                                 "token_latency_s": 0.0},
            "workload": {"requests": [{"arrival": 1.0, "prompt_len": 100, "output_len": 5}]}}
    res = run_scenario(scenario_from_dict(data))
    r = res.requests.iloc[0]
    steps = res.steps
    parts = phase_means(res.timeline, res.requests)
    assert parts["frontend"] == pytest.approx(0.01, rel=1e-9)
    assert parts["waiting"] == 0.0
    assert parts["prefill"] == pytest.approx(steps["duration_s"].iloc[0], rel=1e-12)   # one step
    assert parts["decode"] == pytest.approx(steps["duration_s"].iloc[1:].sum(), rel=1e-12)   # four steps
    assert len(steps) == 5
    assert parts["frontend_out"] == pytest.approx(0.02, rel=1e-9)
    assert parts.sum() == pytest.approx(r["e2e_s"], rel=1e-12)


def test_the_figure_one_bar_per_run(tmp_path):
    runs = {}
    for policy in ("fcfs", "round_robin"):
        res = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                         ["workload.limit=60", f"scheduler.policy={policy}"]))
        runs[policy] = (res.timeline, res.requests)
    path = latency_breakdown(runs, tmp_path / "lb.png")
    assert path.stat().st_size > 5000


def test_disaggregated_ttft_is_the_prefill_sides_states():
    """Pushed KV: a request's first token comes from its prefill replica, so its mean TTFT is the frontend in,
    the prefill side's queue and prefill, and the frontend out; the decode replica's queue is a state of
    its own (decode_waiting), after the transfer."""
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
        "workload.limit=150", "cluster={prefill: {replicas: 2}, decode: {replicas: 1, scheduler: {max_num_seqs: 4}}, "
        "kv_transfer: {mode: push}}"])
    res = run_scenario(scn)
    done = res.requests[res.requests["status"] == "FINISHED"]
    parts = phase_means(res.timeline, res.requests)
    assert parts["decode_waiting"] > 1.0 and "preempted" not in parts.index
    first_out = scn.frontend.latencies()[1]   # the first token's output latency (no streaming backlog yet)
    ttft = parts["frontend"] + parts["waiting"] + parts["prefill"] + first_out
    assert ttft == pytest.approx(float(done["ttft_s"].mean()), rel=1e-9)
