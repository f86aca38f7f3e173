"""Parallel samples fanned out as vLLM v1 serves them (``scheduler.parallel_sampling: fanout``,
sim/workload/fanout.py): each sample a request of its own sharing the prompt's token ids. Checked by hand on
one request (its prefill tokens and blocks with and without a prefix cache), on the token ids themselves,
against the SimPy loop in the compiled core, behind a client that counts a request's samples once, and with
what forked samples cannot do (speculative decoding, static batching, a contiguous allocator, prefill/decode
pools)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from result_compare import assert_same, off_and_on
from test_engine_core import PRESSURE, _scenario

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.request import Request
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.workload.fanout import fan_out
from sim.workload.tokens import ROOT_HASH, block_hashes, token_ids


def _one(mode: str, cache: bool, **extra) -> dict:
    return {"name": "hand", "model": "tiny-llama", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 40, "swap_space_gb": 0, "prefix_caching": cache},
            "executor": {"calibration": "roofline"}, "output": {"plots": False},
            "scheduler": {"parallel_sampling": mode},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 40, "output_len": 3, "n": 3}]}, **extra}


@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "prefix-cache"])
def test_one_request_of_three_samples_by_hand(monkeypatch, cache):
    """A prompt of 40 tokens (2 full blocks of 16 and 8 tokens), 3 samples of 3 tokens. Forked: one prefill of
    40 tokens in 3 blocks, then the partly filled block copied twice (5 blocks). Fanned out without a cache:
    three prefills of 40 (120 tokens, 9 blocks). With one: the first sample computes 40, the others find its 2
    full blocks cached in the same step and compute their last 8 (56 tokens; 2 shared + 3 own = 5 blocks);
    64 of the 120 prompt tokens came from the cache."""
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(_one("fanout", cache)), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"]
    st = core.steps
    assert st["num_prefill_tokens"].tolist() == ([56, 0, 0] if cache else [120, 0, 0])
    assert st["num_decode_tokens"].tolist() == [0, 3, 3]
    assert st["kv_blocks_used"].tolist() == ([5, 5, 0] if cache else [9, 9, 0])
    assert st["blocks_copied"].sum() == 0
    assert core.summary["prefix_cache_hit_rate"] == pytest.approx(64 / 120 if cache else 0.0)
    reqs = core.requests
    assert reqs["req_id"].tolist() == [0, 1, 2] and (reqs["n"] == 1).all()
    assert reqs["sample_of"].tolist() == [0, 0, 0] and reqs["sample"].tolist() == [0, 1, 2]
    assert reqs["num_cached_tokens"].tolist() == ([0, 32, 32] if cache else [0, 0, 0])
    assert core.summary["num_finished"] == 3
    forked = run_scenario(scenario_from_dict(_one("fork", cache)))
    assert forked.steps["num_prefill_tokens"].tolist() == [40, 0, 0]
    assert forked.steps["kv_blocks_used"].tolist() == [3, 5, 0]
    assert "sample_of" not in forked.requests


def test_samples_share_their_prompt_and_nothing_else():
    reqs = [Request(0, 0.0, 40, 5), Request(1, 0.0, 40, 5, n=2), Request(2, 0.1, 40, 5, n=2)]
    out, origin = fan_out(reqs)
    assert [r.req_id for r in out] == [0, 1, 2, 3, 4] and origin.tolist() == [0, 1, 1, 2, 2]
    assert [r.sample_of for r in out] == [-1, 1, 1, 2, 2] and all(r.n == 1 for r in out)
    prompt = [token_ids(r, 0, 40) for r in out]
    assert np.array_equal(prompt[1], prompt[2]) and np.array_equal(prompt[3], prompt[4])
    assert not np.intersect1d(prompt[1], prompt[3]).size and not np.intersect1d(prompt[0], prompt[1]).size
    assert not np.intersect1d(token_ids(out[1], 40, 45), token_ids(out[2], 40, 45)).size   # their own outputs
    assert block_hashes(out[1], 0, 2, 16, ROOT_HASH) == block_hashes(out[2], 0, 2, 16, ROOT_HASH)
    assert block_hashes(out[1], 0, 2, 16, ROOT_HASH) != block_hashes(out[3], 0, 2, 16, ROOT_HASH)
    same, none = fan_out([Request(0, 0.0, 8, 2)])
    assert none is None and same[0].req_id == 0


@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_pressure_fanned_out_equals_in_the_core(monkeypatch, cache, preemption):
    data = _scenario(PRESSURE, preemption=preemption, parallel_sampling="fanout")
    data["kv_cache"]["prefix_caching"] = cache
    for i, r in enumerate(data["workload"]["requests"]):
        r["n"] = 1 + i % 4
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    s = core.summary
    assert core.profile["compiled_core"] and s["num_preemptions"] >= 5
    inline = data["workload"]["requests"]
    by_arrival = sorted(range(len(inline)), key=lambda i: inline[i]["arrival"])   # (the workload's order)
    assert len(core.requests) == sum(r["n"] for r in inline)
    assert (core.requests.groupby("sample_of")["sample"].max() + 1).tolist() == [inline[i]["n"] for i in by_arrival]
    if cache:
        assert s["prefix_cache_hit_rate"] > 0.2


def _samples(extra: dict, **scheduler) -> dict:
    return {"name": "x", "model": "llama-2-7b", "hardware": "h100-80gb", "kv_cache": {"num_gpu_blocks": 600},
            "scheduler": {"parallel_sampling": "fanout", **scheduler}, "output": {"plots": False},
            "workload": {"synthetic": {"num_requests": 30, "arrival": {"process": "poisson", "rate": 20.0},
                                       "prompt_len": {"dist": "uniform", "min": 20, "max": 300},
                                       "output_len": {"dist": "uniform", "min": 2, "max": 60}, "n": 3}},
            **extra}


@pytest.mark.parametrize("case", ["speculative", "static", "contiguous", "disaggregated"])
def test_what_forks_cannot_do_runs_fanned_out(case):
    extra, scheduler = {}, {}
    if case == "speculative":
        extra = {"speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}}
    elif case == "static":
        scheduler = {"batching": "static"}
    elif case == "contiguous":
        extra = {"kv_cache": {"num_gpu_blocks": 600, "allocator": "contiguous-oracle"}}
    else:
        extra = {"cluster": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}}
    fork = _samples(extra, **scheduler)
    fork["scheduler"]["parallel_sampling"] = "fork"
    with pytest.raises(KvsimError, match="parallel_sampling: fanout"):
        run_scenario(scenario_from_dict(fork, source="s.yaml"))
    res = run_scenario(scenario_from_dict(_samples(extra, **scheduler)), check_integrity=True)
    assert res.summary["num_finished"] == 90 and (res.requests["sample"] < 3).all()


def _in_flight_most(reqs) -> int:
    """The most workload requests in flight at once: each from the send of its samples to the last one's
    finish (the frontend off: a response is whole when its engine finishes it)."""
    spans = reqs.groupby("sample_of").agg(start=("arrival_s", "min"), end=("finish_s", "max"))
    events = sorted([(t, 1) for t in spans["start"]] + [(t, -1) for t in spans["end"]], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("think", [0.0, 0.05], ids=["no-pause", "pause"])
def test_a_client_counts_a_request_of_samples_once(monkeypatch, think):
    """A client of 2 slots sends a request's 3 samples together, under one slot, and frees it when the last
    of them is answered: never more than 2 requests' samples in flight, and a held-back request's samples
    all sent at the moment (plus the pause) the request before it had its last answer."""
    data = _samples({"frontend": {"enabled": False}})
    data["workload"]["synthetic"].update(num_requests=12, n=3, sample_lengths="independent")
    data["workload"].update(max_concurrency=2, think_time_s=think)
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"]
    reqs = core.requests
    assert _in_flight_most(reqs) == 2 and reqs.groupby("sample_of")["arrival_s"].nunique().eq(1).all()
    sends = reqs.groupby("sample_of")["arrival_s"].first().to_numpy()
    ends = reqs.groupby("sample_of")["finish_s"].max().to_numpy()
    held = reqs.groupby("sample_of")["client_wait_s"].first().to_numpy() > 0
    answers = np.sort(ends)   # (a slot frees at each request's last answer, plus the pause, in that order)
    for k in np.flatnonzero(held):   # the k-th request waited for the (k - 2)-th answer (2 slots)
        assert sends[k] == pytest.approx(answers[k - 2] + think)


def test_fanned_out_behind_clients_equals_in_the_core(monkeypatch):
    data = _scenario(PRESSURE, parallel_sampling="fanout")
    data["kv_cache"]["prefix_caching"] = True
    for i, r in enumerate(data["workload"]["requests"]):
        r["n"] = 1 + i % 3
    data["workload"].update(max_concurrency=[{"from_s": 0, "limit": 3}, {"from_s": 5.0, "limit": 6}],
                            think_time_s=0.01, think_time_dist="exponential")
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["client_wait_s"]["mean"] > 0
    data["cluster"] = {"replicas": 2, "router": {"policy": "least_kv"}}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"]


def test_independent_sample_lengths_draw_each_sample_its_own_output():
    """``sample_lengths: independent``: a request's first sample keeps the output length the workload drew for
    it (the same as forked), the others draw their own from output_len; the same seed, the same draws."""
    data = _samples({})
    data["workload"]["synthetic"].update(n=4, sample_lengths="independent")
    a = run_scenario(scenario_from_dict(copy.deepcopy(data))).requests
    b = run_scenario(scenario_from_dict(copy.deepcopy(data))).requests
    assert a["output_tokens"].tolist() == b["output_tokens"].tolist()
    same = copy.deepcopy(data)
    same["workload"]["synthetic"]["sample_lengths"] = "same"
    firsts = run_scenario(scenario_from_dict(same)).requests
    first = a[a["sample"] == 0]
    assert first["output_tokens"].tolist() == firsts[firsts["sample"] == 0]["output_tokens"].tolist()
    spread = a.groupby("sample_of")["output_tokens"].nunique()
    assert (spread > 1).mean() > 0.9 and a["output_tokens"].between(2, 60).all()
    finish = a.groupby("sample_of")["finish_s"].agg(["min", "max"])
    assert (finish["max"] > finish["min"]).mean() > 0.9   # samples end apart: a request waits for its longest
    fork = copy.deepcopy(data)
    fork["scheduler"]["parallel_sampling"] = "fork"
    with pytest.raises(KvsimError, match="workload.synthetic.sample_lengths: independent needs"):
        scenario_from_dict(fork, source="s.yaml")


def test_the_summary_counts_the_workload_requests_whole():
    """summary.json's ``fanout``: per workload request, the first token of its first sample and the finish of
    its last (a plain loop over the rows here), for the requests all of whose samples finished."""
    data = _samples({"kv_cache": {"num_gpu_blocks": 40}})   # (a small cache: some requests never fit)
    data["workload"]["synthetic"].update(n=3, sample_lengths="independent",
                                         prompt_len={"dist": "uniform", "min": 20, "max": 1000})
    res = run_scenario(scenario_from_dict(data))
    rows = res.requests.to_dict("records")
    by: dict[int, list] = {}
    for r in rows:
        by.setdefault(r["sample_of"], []).append(r)
    whole = [rs for rs in by.values() if all(r["status"] == "FINISHED" for r in rs)]
    block = res.summary["fanout"]
    assert block["requests"] == 30 and block["finished"] == len(whole) and 0 < len(whole) < 30
    assert block["ttft_s"]["mean"] == pytest.approx(np.mean([min(r["ttft_s"] for r in rs) for rs in whole]))
    assert block["e2e_s"]["mean"] == pytest.approx(np.mean([max(r["e2e_s"] for r in rs) for rs in whole]))
    assert block["e2e_s"]["p90"] >= res.summary["e2e_s"]["p90"]   # (a request's last sample is its slowest)
