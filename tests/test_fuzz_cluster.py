"""The cluster fuzzer: a seeded batch of random small clusters must pass three ways, its draws must cover
both shapes, every router and both transfer modes, and its checker must bite. Also replicas.csv's
``finished`` and ``handed_off``, counted by hand."""

from __future__ import annotations

import random

import pytest

import sim.engine_core as engine_core
from sim.cluster.config import ROUTER_POLICIES
from sim.fuzz_cluster import _same, check_cluster_outcome, draw_cluster_scenario, fuzz_clusters
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict


@pytest.mark.parametrize("part", range(3))   # 3 x 50 cases, each run three ways
def test_seeded_cluster_fuzz_batch_passes(part):
    report = fuzz_clusters(seed=20261204, count=50, start=50 * part)
    assert not report.failures, "\n\n".join(f"case {c.index}: {c.error}\n{c.scenario}" for c in report.failures[:3])
    assert report.counts() == {"ok": 50}


def test_cluster_draws_are_valid_reproducible_and_cover_the_shapes():
    colocated = pull = push = 0
    policies = set()
    for i in range(300):
        a = draw_cluster_scenario(random.Random(f"c:{i}"), i)
        assert a == draw_cluster_scenario(random.Random(f"c:{i}"), i)
        scn = scenario_from_dict(a)   # every draw is accepted
        policies.add(scn.cluster.router.policy)
        if scn.cluster.disaggregated:
            pull += scn.cluster.link.mode == "pull"
            push += scn.cluster.link.mode == "push"
        else:
            colocated += 1
    assert policies == set(ROUTER_POLICIES)
    assert min(colocated, pull, push) > 40


TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False}, "frontend": {"enabled": False},
        "kv_cache": {"block_size": 16, "num_gpu_blocks": 400}}
# (arrival, prompt, output): requests 1 and 4 have one output token and finish on their prefill replica
REQS = [(0.0, 40, 6), (0.001, 50, 1), (0.002, 60, 3), (0.003, 70, 9), (0.004, 80, 1), (0.005, 90, 4)]


def _disaggregated(mode: str = "pull") -> dict:
    return {**TINY, "workload": {"requests": [{"arrival": a, "prompt_len": p, "output_len": o} for a, p, o in REQS]},
            "cluster": {"prefill": {"replicas": 2}, "decode": {"replicas": 2},
                        "kv_transfer": {"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.01}, "mode": mode},
                        "router": {"policy": "round_robin"}}}


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_replicas_count_each_request_where_it_ends(mode):
    """Round robin sends requests 0, 2, 4 to prefill replica 0 and 1, 3, 5 to replica 1; the four of several
    output tokens are handed to the decode pool (round robin: 0, 3 to replica 2 and 2, 5 to replica 3, in
    the order their prefills end)."""
    res = run_scenario(scenario_from_dict(_disaggregated(mode)))
    rows = res.replicas.set_index("replica")
    assert list(rows["finished"]) == [1, 1, 2, 2]    # prefill: request 4 on 0, request 1 on 1
    assert list(rows["handed_off"]) == [2, 2, 0, 0]  # prefill 0: requests 0 and 2; prefill 1: 3 and 5
    assert rows["finished"].sum() == len(REQS)
    assert check_cluster_outcome(res, scenario_from_dict(_disaggregated(mode))) == []


def _broken(fn):
    scn = scenario_from_dict(_disaggregated())
    res = run_scenario(scn)
    fn(res)
    return check_cluster_outcome(res, scn)


@pytest.mark.parametrize("breakage, fragment", [
    (lambda r: r.requests.__setitem__("status", ["RUNNING"] + ["FINISHED"] * 5), "neither finished, rejected nor aborted"),
    (lambda r: r.requests.loc.__setitem__((0, "replica"), 1), "did not go from a prefill replica"),
    (lambda r: r.requests.loc.__setitem__((1, "transfer_s"), 0.5), "one output token"),
    (lambda r: r.requests.loc.__setitem__((0, "transfer_s"), 1e-6), "faster than the link"),
    (lambda r: r.summary["cluster"].__setitem__("transferred_kv_bytes", 1), "bytes sent"),
    (lambda r: r.requests.loc.__setitem__((0, "kv_wait_s"), -0.1), "KV wait below zero"),
    (lambda r: r.steps.loc.__setitem__((0, "slots_free"), 0), "memory slots"),
    (lambda r: r.steps.loc.__setitem__((1, "start_s"), -1.0), "overlap or go back"),
    (lambda r: r.steps.loc.__setitem__((0, "num_prefill_tokens"), 1), "tokens computed"),
    (lambda r: r.replicas.loc.__setitem__((0, "finished"), 5), "finished + rejected + aborted over the replicas"),
    (lambda r: r.timeline.loc.__setitem__(((r.timeline["req_id"] == 2) & (r.timeline["phase"] == "transferring"),
                                           "phase"), "idle"), "timeline of requests [2]"),
    (lambda r: r.replicas.loc.__setitem__((0, "handed_off"), 0), "handed off"),
])
def test_checker_bites(breakage, fragment):
    problems = _broken(breakage)
    assert any(fragment in p for p in problems), problems


def test_agreement_check_bites():
    scn = scenario_from_dict(_disaggregated())
    a, b = run_scenario(scn), run_scenario(scn)
    assert _same(a, b, "again") == []   # same scenario and seed: the same tables
    b.steps.loc[3, "duration_s"] += 1e-12
    assert _same(a, b, "again") == ["again: the steps table differs"]


def test_a_block_left_held_after_the_run_is_an_error(monkeypatch):
    """A transfer that never lets its prefill blocks go (a leak planted in the hand-off) fails the run with
    a clear error, not a silent result."""
    from sim.cluster.disagg import Handoff
    from sim.errors import KvsimError

    def leaky_send(self, req, free, src):
        yield from self.link.send(req.prompt_len * self.kv_bytes_per_token)   # the prefill blocks stay held
        self.transfer_s[req.req_id] = 0.0

    monkeypatch.setattr(Handoff, "_send", leaky_send)
    monkeypatch.setattr(engine_core, "enabled", False)   # (the hand-off of the SimPy loop)
    with pytest.raises(KvsimError, match=r"replica 0 \(prefill\) still holds \d+ KV blocks after every request ended"):
        run_scenario(scenario_from_dict(_disaggregated("push")))
