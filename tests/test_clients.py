"""A client with a concurrency limit (workload.max_concurrency, sim/clients.py), against the open loop.

The oracles are runs without the limit (the compiled core's open loop), and the client's rule by hand:
send(i) = max(arrival_i, the time a slot frees), a slot freeing think_time_s after its response. Every test
runs twice: with the client in the compiled core (sim/csrc/client.c; one engine and colocated pools) and in
the SimPy loop (sim/clients.py), the reference tests/test_engine_core.py compares the core with.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


@pytest.fixture(autouse=True, params=[True, False], ids=["core", "loop"])
def where(request, monkeypatch):
    """The client in the compiled core, or in the SimPy loop (the open-loop oracles run alike)."""
    monkeypatch.setattr(engine_core, "enabled", request.param)
    return request.param


def _scenario(requests: list[dict], **workload) -> dict:
    return {"name": "clients", "seed": 0, "model": "llama-2-7b", "hardware": "h100-80gb",
            "scheduler": {"max_num_seqs": 64}, "kv_cache": {"prefix_caching": False},
            "workload": {"requests": requests, **workload}}


def _ran(data: dict) -> pd.DataFrame:
    """The requests' table of a run, which ran where the fixture says."""
    res = run_scenario(scenario_from_dict(data))
    assert res.profile.get("compiled_core", False) == engine_core.enabled
    return res.requests


def _run(requests: list[dict], **workload) -> pd.DataFrame:
    return _ran(_scenario(requests, **workload))


def _unheld(reqs: pd.DataFrame) -> pd.DataFrame:
    """The table of a run whose client held nothing back (every client_wait_s 0), without that column."""
    assert (reqs["client_wait_s"] == 0.0).all()
    return reqs.drop(columns="client_wait_s")


def _burst(n: int, prompt: int = 100, output: int = 20) -> list[dict]:
    return [{"arrival": 0.0, "prompt_len": prompt + i, "output_len": output + 3 * i} for i in range(n)]


def test_a_limit_above_the_load_changes_nothing():
    # 6 requests, room for all: the same table as the open loop (the compiled core), to the last bit
    open_loop = _run(_burst(6))
    for limit in (6, 50):
        pd.testing.assert_frame_equal(_unheld(_run(_burst(6), max_concurrency=limit)), open_loop)


def test_one_client_sends_each_request_when_the_last_is_answered():
    # one slot, think 0.25 s: request i+1 is sent 0.25 s after request i's whole response reached the
    # client (its send + E2E); alone on the engine, each takes what it takes in a run of its own
    reqs = _burst(4)
    closed = _run(reqs, max_concurrency=1, think_time_s=0.25)
    sends = closed["arrival_s"].to_numpy()
    answered = sends + closed["e2e_s"].to_numpy()
    assert sends[0] == 0.0
    np.testing.assert_allclose(sends[1:], answered[:-1] + 0.25, rtol=0, atol=1e-12)
    for i, req in enumerate(reqs):
        alone = _run([req])
        assert closed["e2e_s"][i] == pytest.approx(alone["e2e_s"][0], rel=1e-12)
        assert closed["ttft_s"][i] == pytest.approx(alone["ttft_s"][0], rel=1e-12)


def test_never_more_in_flight_than_the_limit_and_no_slot_idle():
    # 40 requests of different lengths at t = 0, 3 slots: at every send at most 3 requests are in flight,
    # and every send after the first 3 happens exactly when a slot frees (the earliest answer not yet used)
    reqs = [{"arrival": 0.0, "prompt_len": 50 + 37 * i % 400, "output_len": 5 + 29 * i % 90} for i in range(40)]
    closed = _run(reqs, max_concurrency=3)
    sends = closed["arrival_s"].to_numpy()
    answered = np.sort(sends + closed["e2e_s"].to_numpy())
    order = np.sort(sends)
    assert np.all(order[:3] == 0.0)
    np.testing.assert_allclose(order[3:], answered[:-3], rtol=0, atol=1e-12)   # the k-th answer frees send k+3
    for t in order:
        assert ((sends <= t) & (sends + closed["e2e_s"].to_numpy() > t)).sum() <= 3


def test_arrivals_still_bound_the_sends():
    # arrivals 2 s apart, each request done in well under 2 s: the limit never binds, sends = arrivals
    reqs = [{"arrival": 2.0 * i, "prompt_len": 200, "output_len": 30} for i in range(5)]
    closed = _run(reqs, max_concurrency=1)
    assert closed["arrival_s"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    pd.testing.assert_frame_equal(_unheld(closed), _run(reqs))


def test_a_rejected_request_frees_its_slot_at_once():
    # the middle request can never fit (a prompt beyond max_model_len): the engine rejects it as it
    # arrives, the client has its error then (send + the frontend's input latency) and sends the next
    reqs = [{"arrival": 0.0, "prompt_len": 100, "output_len": 10},
            {"arrival": 0.0, "prompt_len": 5000, "output_len": 10},
            {"arrival": 0.0, "prompt_len": 100, "output_len": 10}]
    q = _ran({**_scenario(reqs, max_concurrency=1), "frontend": {"input_latency_s": 0.003}})
    assert q["status"].tolist() == ["FINISHED", "REJECTED", "FINISHED"]
    assert q["arrival_s"][1] == pytest.approx(q["arrival_s"][0] + q["e2e_s"][0], abs=1e-12)
    assert q["arrival_s"][2] == pytest.approx(q["arrival_s"][1] + 0.003, abs=1e-12)


def test_bad_settings_are_named():
    with pytest.raises(KvsimError, match="think_time_s .* needs workload.max_concurrency"):
        scenario_from_dict(_scenario(_burst(2), think_time_s=1.0))
    with pytest.raises(KvsimError, match="max_concurrency"):
        scenario_from_dict(_scenario(_burst(2), max_concurrency=0))


def _cluster(requests: list[dict], cluster: dict, **workload) -> pd.DataFrame:
    return _ran({**_scenario(requests, **workload), "cluster": cluster})


def test_a_cluster_of_one_is_the_single_engine():
    reqs = [{"arrival": 0.0, "prompt_len": 50 + 37 * i % 400, "output_len": 5 + 29 * i % 90} for i in range(30)]
    single = _run(reqs, max_concurrency=4, think_time_s=0.1)
    one = _cluster(reqs, {"replicas": 1}, max_concurrency=4, think_time_s=0.1)   # (plus the replica's columns)
    pd.testing.assert_frame_equal(one[single.columns], single)


def test_a_cluster_behind_the_client():
    # 3 replicas, least_requests, 5 slots over 30 requests: never more than 5 in flight, every send after
    # the first 5 when a slot frees; with 30 slots, the open loop's table (the compiled core's)
    reqs = [{"arrival": 0.0, "prompt_len": 50 + 37 * i % 400, "output_len": 5 + 29 * i % 90} for i in range(30)]
    cluster = {"replicas": 3, "router": {"policy": "least_requests"}}
    closed = _cluster(reqs, cluster, max_concurrency=5)
    sends = closed["arrival_s"].to_numpy()
    answered = np.sort(sends + closed["e2e_s"].to_numpy())
    np.testing.assert_allclose(np.sort(sends)[5:], answered[:-5], rtol=0, atol=1e-12)
    pd.testing.assert_frame_equal(_unheld(_cluster(reqs, cluster, max_concurrency=30)), _cluster(reqs, cluster))


POOLS = {"prefill": {"replicas": 2}, "decode": {"replicas": 2}, "kv_transfer": {"link": "infiniband-400g"},
         "router": {"policy": "least_requests"}}


def test_disaggregated_pools_behind_the_client():
    # 2 prefill + 2 decode replicas, 30 requests (every fifth of one output token: it ends on its prefill
    # replica): with 4 slots, never more than 4 in flight and every send after the first 4 when a slot
    # frees; with 30 slots, the open loop's table
    reqs = [{"arrival": 0.0, "prompt_len": 50 + 37 * i % 400, "output_len": 1 if i % 5 == 0 else 5 + 29 * i % 90}
            for i in range(30)]
    closed = _cluster(reqs, POOLS, max_concurrency=4)
    assert (closed["status"] == "FINISHED").all()
    sends = closed["arrival_s"].to_numpy()
    answered = np.sort(sends + closed["e2e_s"].to_numpy())
    np.testing.assert_allclose(np.sort(sends)[4:], answered[:-4], rtol=0, atol=1e-12)
    pd.testing.assert_frame_equal(_unheld(_cluster(reqs, POOLS, max_concurrency=30)), _cluster(reqs, POOLS))


def test_exponential_pauses():
    # one user, 400 short requests, pauses exponential with mean 0.05 s: pause i = send(i+1) - answer(i);
    # their mean is 0.05 within 15% (the standard error of 399 draws is 5%), half are below 0.05 ln 2 within
    # 0.08 (the median of the exponential), the same seed draws the same pauses and another seed others
    reqs = [{"arrival": 0.0, "prompt_len": 20, "output_len": 2} for _ in range(400)]

    def pauses(seed: int) -> np.ndarray:
        data = {**_scenario(reqs, max_concurrency=1, think_time_s=0.05, think_time_dist="exponential"), "seed": seed}
        q = _ran(data)
        sends = q["arrival_s"].to_numpy()
        return sends[1:] - (sends[:-1] + q["e2e_s"].to_numpy()[:-1])

    p = pauses(0)
    assert p.min() >= 0
    assert abs(p.mean() / 0.05 - 1) < 0.15
    assert abs((p < 0.05 * np.log(2)).mean() - 0.5) < 0.08
    np.testing.assert_array_equal(p, pauses(0))
    assert not np.array_equal(p, pauses(1))
    with pytest.raises(KvsimError, match="needs workload.max_concurrency"):
        scenario_from_dict(_scenario(reqs, think_time_dist="exponential"))


def test_stages_of_limits():
    # 6 requests at t = 0 under 3 slots, 6 more at t = 100 s (the first six long done) under 1: the second
    # six go one after the other, each sent as the one before is answered; the first six three at a time
    reqs = _burst(6) + [dict(r, arrival=100.0) for r in _burst(6)]
    steps = [{"from_s": 0.0, "limit": 3}, {"from_s": 50.0, "limit": 1}]
    q = _run(reqs, max_concurrency=steps)
    sends, ends = q["arrival_s"].to_numpy(), (q["arrival_s"] + q["e2e_s"]).to_numpy()
    assert (sends[:3] == 0.0).all() and (sends[3:6] > 0.0).all() and sends[6] == 100.0
    np.testing.assert_allclose(sends[7:], ends[6:11], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.sort(sends[:6])[3:], np.sort(ends[:6])[:3], rtol=0, atol=1e-12)
    for bad, why in (([{"from_s": 1.0, "limit": 2}], "first stage starts at from_s: 0"),
                     ([{"from_s": 0.0, "limit": 2}, {"from_s": 0.0, "limit": 3}], "from_s must increase")):
        with pytest.raises(KvsimError, match=why):
            scenario_from_dict(_scenario(reqs, max_concurrency=bad))


def test_how_long_the_client_held_each_request_back():
    # one slot, three requests planned at t = 0 and one at 60 s (long after), pause 0.25 s: request i waits
    # at the client for the whole responses of those before it plus their pauses (each E2E from a run of the
    # request alone), the last one not at all; the summary's figures are those of the four waits, and the
    # timeline has a client interval from the planned arrival to the send, first among the request's rows
    reqs = _burst(3) + [{"arrival": 60.0, "prompt_len": 80, "output_len": 7}]
    data = {**_scenario(reqs, max_concurrency=1, think_time_s=0.25), "frontend": {"input_latency_s": 0.002}}
    res = run_scenario(scenario_from_dict(data))
    alone = [run_scenario(scenario_from_dict({**data, "workload": {"requests": [r]}})).requests["e2e_s"][0]
             for r in reqs[:2]]
    expected = np.array([0.0, alone[0] + 0.25, alone[0] + alone[1] + 0.5, 0.0])
    np.testing.assert_allclose(res.requests["client_wait_s"].to_numpy(), expected, rtol=0, atol=1e-9)
    s = res.summary["client_wait_s"]
    assert s["mean"] == pytest.approx(expected.mean(), abs=1e-9)
    assert s["p50"] == pytest.approx((expected[1] + 0.0) / 2, abs=1e-9)   # the middle two of 0, 0, w1, w2
    tl = res.timeline
    held = tl[tl["phase"] == "client"]
    assert held["req_id"].tolist() == [1, 2]
    np.testing.assert_allclose(held["start_s"], [0.0, 0.0], atol=0)
    np.testing.assert_allclose(held["end_s"], res.requests["arrival_s"][1:3], atol=0)
    for rid in (1, 2):
        assert tl[tl["req_id"] == rid]["phase"].iloc[0] == "client"
        assert tl[tl["req_id"] == rid]["phase"].iloc[1] == "frontend"


def test_no_wait_without_a_binding_limit_and_no_column_without_a_client():
    reqs = [{"arrival": 2.0 * i, "prompt_len": 200, "output_len": 30} for i in range(5)]
    capped = run_scenario(scenario_from_dict(_scenario(reqs, max_concurrency=1)))
    assert (capped.requests["client_wait_s"] == 0.0).all()
    assert capped.summary["client_wait_s"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    assert "client" not in set(capped.timeline["phase"])
    plain = run_scenario(scenario_from_dict(_scenario(reqs)))
    assert "client_wait_s" not in plain.requests.columns and "client_wait_s" not in plain.summary


@pytest.mark.parametrize("cluster", [{"replicas": 3, "router": {"policy": "least_requests"}}, POOLS],
                         ids=["colocated", "disaggregated"])
def test_a_clusters_client_waits(cluster):
    # 24 requests at t = 0 behind 4 slots: each waits until it is sent, and the first 4 not at all
    reqs = [{"arrival": 0.0, "prompt_len": 50 + 37 * i % 400, "output_len": 5 + 29 * i % 90} for i in range(24)]
    res = run_scenario(scenario_from_dict({**_scenario(reqs, max_concurrency=4), "cluster": cluster}))
    q = res.requests
    np.testing.assert_array_equal(q["client_wait_s"].to_numpy(), q["arrival_s"].to_numpy())
    assert (np.sort(q["client_wait_s"].to_numpy())[:4] == 0).all() and (q["client_wait_s"] > 0).sum() == 20
    assert res.summary["client_wait_s"]["mean"] == pytest.approx(q["arrival_s"].mean(), abs=1e-12)
    assert (res.timeline["phase"] == "client").sum() == 20
