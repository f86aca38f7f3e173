"""Disaggregated prefill/decode in the compiled core (sim/cluster/disagg_core.py, sim/csrc/core.c and
handoff.c) against the SimPy loop (sim/cluster/disagg.py, link.py) as the reference: the same results bit for
bit (summary.json apart from wall_time_s, the per-step, per-request, timeline and replicas tables) with the KV
pulled and pushed, sent after the prefill and layer by layer, a decode pool short of seats and of blocks
(bookings queued, requests queued ahead, refusals after a prefill), prefill engines waiting for blocks held
by transfers, every decode policy, preemption by recompute and by swap, prefix caches, a client in front,
client timeouts (given up on either pool, waiting for a decode seat or in transfer),
speculating decode engines, routers on both sides and fuzzed clusters; the integrity checks on after every
step."""

from __future__ import annotations

import copy
import random

import pytest
from result_compare import off_and_on, same_cluster_outcome
from test_engine_core import _assert_same_clusters

import sim.engine_core as engine_core
from sim.fuzz_cluster import draw_cluster_scenario
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")

# a tiny model on a small cache: 2 prefill and 2 decode replicas, 80 requests arriving fast
BASE = {"name": "pd", "model": "tiny-llama", "hardware": "a100-80gb", "seed": 11,
        "kv_cache": {"block_size": 4, "num_gpu_blocks": 120, "swap_space_gb": 0.0001},
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "chunked_prefill": True},
        "frontend": {"enabled": False}, "output": {"plots": False},
        "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 400.0},
                                   "prompt_len": {"dist": "uniform", "min": 4, "max": 60},
                                   "output_len": {"dist": "uniform", "min": 1, "max": 60}}},
        "cluster": {"prefill": {"replicas": 2}, "decode": {"replicas": 2},
                    "kv_transfer": {"link": "infiniband-400g", "mode": "pull"},
                    "router": {"policy": "least_requests"}}}


def _both(monkeypatch, data: dict, check: bool = True):
    return off_and_on(monkeypatch, engine_core, "enabled",
                      lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=check))


def _case(**changes) -> dict:
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        *head, last = path.split("__")
        node = d
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    return d


def _equal(monkeypatch, data: dict, check: bool = True):
    loop, core = _both(monkeypatch, data, check)
    _assert_same_clusters(loop, core)
    return core


@pytest.mark.parametrize("mode, layerwise", [("pull", False), ("push", False), ("push", True)])
def test_the_shipped_scenario_equals(monkeypatch, mode, layerwise):
    data = load_scenario("scenarios/cluster_disaggregated.yaml",
                         ["workload.limit=300", f"cluster.kv_transfer.mode={mode}",
                          f"cluster.kv_transfer.layerwise={str(layerwise).lower()}", "output.plots=false"])
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(data.model_copy(deep=True), check_integrity=False))
    _assert_same_clusters(loop, core)
    assert core.summary["cluster"]["transferred_kv_bytes"] > 0


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_a_decode_pool_short_of_seats_equals(monkeypatch, mode):
    """Two seats a decode replica: pulled, the bookings wait (kv_wait) and each request arrives queued ahead;
    pushed, the requests wait in the decode queue with their KV there."""
    core = _equal(monkeypatch, _case(cluster__decode={"replicas": 2, "scheduler": {"max_num_seqs": 2}},
                                     cluster__kv_transfer={"link": "ethernet-100g", "mode": mode}))
    if mode == "pull":
        assert core.requests["kv_wait_s"].max() > 0


@pytest.mark.parametrize("policy", ["fcfs", "priority", "round_robin", "longest_prefix_first"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_every_decode_policy_under_pressure_equals(monkeypatch, policy, preemption):
    """A decode pool of 40 blocks (preemptions, swaps), prefix caching on both sides, priorities drawn; the
    prefill pool's 40 blocks held by transfers make its engines wait for the link."""
    data = _case(kv_cache__num_gpu_blocks=40, kv_cache__prefix_caching=True,
                 scheduler__preemption=preemption,
                 cluster__decode={"replicas": 2, "scheduler": {"policy": policy, "rr_quantum_steps": 2}})
    data["workload"]["synthetic"]["priority"] = {"dist": "uniform", "min": 0, "max": 3}
    data["workload"]["synthetic"]["shared_prefix"] = {"groups": 3, "length": 12}
    core = _equal(monkeypatch, data)
    assert core.summary["num_finished"] + core.summary["num_rejected"] == 80


def test_refusals_by_the_decode_pool_equal(monkeypatch):
    """A decode pool too small for the longer requests: they are refused on arrival at their prefill replica,
    with the decode pool's reason; nothing is computed, held or sent for them, and the results keep their
    own output lengths."""
    data = _case(cluster__decode={"replicas": 2, "kv_cache": {"num_gpu_blocks": 20}})
    core = _equal(monkeypatch, data)
    reqs = core.requests
    # by hand: blocks of 4 tokens for the prompt and every output token but the last, more than 20
    need = -(-(reqs["prompt_tokens"] + reqs["output_tokens"] - 1) // 4)
    expect = (need > 20) & (reqs["output_tokens"] > 1)
    refused = reqs["status"] == "REJECTED"
    assert expect.any() and (refused == expect).all()
    assert reqs.loc[refused, "reject_reason"].str.fullmatch(
        r"the decode pool refuses it: needs \d+ KV blocks, the cache has 20").all()
    assert reqs.loc[refused, ["first_token_s", "transfer_s"]].isna().all().all()
    sent = reqs.loc[reqs["status"] == "FINISHED"]
    assert core.summary["cluster"]["transferred_kv_bytes"] == \
        int(sent.loc[sent["output_tokens"] > 1, "prompt_tokens"].sum()) * core.scenario.model_spec.kv_bytes_per_token()


@pytest.mark.parametrize("policy", ["round_robin", "power_of_two", "least_kv", "session", "prefix_affinity"])
def test_routers_on_both_sides_equal(monkeypatch, policy):
    """The prefill router's choices made ahead, by the core's rule or called; the decode router called with
    the decode engines' counts (prefix_affinity over prefill caches; the decode pool has none)."""
    data = _case(cluster__router={"policy": policy})
    if policy == "prefix_affinity":
        data["cluster"]["prefill"]["kv_cache"] = {"prefix_caching": True}
        data["workload"]["synthetic"]["shared_prefix"] = {"groups": 4, "length": 16}
    _equal(monkeypatch, data)


def test_a_client_in_front_equals(monkeypatch):
    """At most 6 in flight: a response is whole on its decode replica, or on its prefill replica for one output
    token; a refusal answers at once."""
    data = _case(workload__max_concurrency=6, workload__think_time_s=0.001,
                 cluster__decode={"replicas": 2, "kv_cache": {"num_gpu_blocks": 30}})
    _equal(monkeypatch, data)


def test_speculating_decode_engines_equal(monkeypatch):
    data = _case(speculative={"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": [0.8, 0.5, 0.3]})
    core = _equal(monkeypatch, data)
    assert core.summary["speculative"]["verifications"] > 0


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_prefix_affinity_over_decode_caches_equals(monkeypatch, mode):
    """The decode router's rule applied by the core, its hits read from the decode engines' own caches (the
    prompts' blocks booked or received there), shared prefixes on both sides."""
    data = _case(kv_cache__prefix_caching=True, cluster__router={"policy": "prefix_affinity", "load_slack": 2},
                 cluster__decode={"replicas": 3}, cluster__kv_transfer={"link": "infiniband-400g", "mode": mode})
    data["workload"]["synthetic"]["shared_prefix"] = {"groups": 3, "length": 24}
    _equal(monkeypatch, data)


@pytest.mark.parametrize("mode, bandwidth_gb_s, timeout", [("pull", 0.05, 0.02), ("push", 0.005, 0.1)])
def test_client_timeouts_between_the_pools_equal(monkeypatch, mode, bandwidth_gb_s, timeout):
    """Two seats a replica on both sides and a slow link: clients give up with their prompts queued, with their
    KV waiting for a decode seat (pulled), crossing the link, and queued or running on their decode replica;
    the same aborts at the same times, with the same reasons and the same counts by replica."""
    data = _case(cluster__prefill={"replicas": 2, "scheduler": {"max_num_seqs": 2}},
                 cluster__decode={"replicas": 2, "scheduler": {"max_num_seqs": 2}},
                 cluster__kv_transfer={"link": {"bandwidth_gb_s": bandwidth_gb_s, "latency_s": 0.001}, "mode": mode},
                 workload__timeout_s=timeout)
    core = _equal(monkeypatch, data)
    aborted = core.requests[core.requests["status"] == "ABORTED"]
    places = {reason.split("(")[1].split(",")[0] for reason in aborted["reject_reason"]}
    assert {"queued", "in transfer", "running"} <= places
    assert mode == "push" or "waiting for a decode seat" in places
    assert core.replicas["aborted"].sum() == core.summary["num_aborted"] > 0


def test_a_router_reading_what_the_core_cannot_show_runs_the_loop():
    """A router of one's own that reads replicas beyond their counts (``reads_state``) keeps the pools in the
    SimPy loop; the shipped routers all run in the core."""
    from sim.cluster.disagg_core import disagg_supported
    from sim.cluster.routers import Router, make_router
    from sim.cluster.runner import build_pool
    from sim.scenario import scenario_from_dict as load
    from sim.workload import build_workload

    scn = load(BASE)
    pools = [build_pool(scn, range(2), role, None, False, 0.0) for role in ("prefill", "decode")]
    requests = build_workload(scn.workload, base_dir=scn.base_dir, seed=scn.seed, source=scn.source).requests
    custom = Router.__new__(Router)   # (the base class: reads_state)
    shipped = make_router(scn.cluster.router, 0)
    assert disagg_supported(*pools, requests, shipped, shipped, client=False)
    assert not disagg_supported(*pools, requests, shipped, custom, client=False)
    assert not disagg_supported(*pools, requests, custom, shipped, client=False)


@pytest.mark.parametrize("part", range(2))   # 2 x 50 draws (about half disaggregated): test workers share them
def test_fuzzed_disaggregated_clusters_equal(monkeypatch, part):
    covered = 0
    for i in range(50 * part, 50 * part + 50):
        data = draw_cluster_scenario(random.Random(f"engine-core-disagg:{i}"), i)
        cl = data["cluster"]
        if "prefill" not in cl or any(cl[role].get("data_parallel") for role in ("prefill", "decode")):
            continue   # (a data-parallel pool runs in the SimPy loop only: sim/cluster/data_parallel.py)
        loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda d=data: run_scenario(
            scenario_from_dict(copy.deepcopy(d), source="<fuzz>"), check_integrity=True))
        covered += same_cluster_outcome(loop, core, f"case {i}")
    assert covered >= 12, f"only {covered} disaggregated fuzz runs ran in the core"


def test_preemptions_of_an_empty_plan_are_on_the_next_row(monkeypatch):
    """A prefill replica whose blocks wait on transfers: a plan that preempts and still starts nothing has no
    row; its preemptions are counted on the replica's next row, so the step table adds up to the summary."""
    data = _case(cluster__prefill={"replicas": 2, "kv_cache": {"num_gpu_blocks": 30}},
                 cluster__decode={"replicas": 2, "scheduler": {"max_num_seqs": 2}})
    core = _equal(monkeypatch, data)
    assert core.summary["num_preemptions"] > 0
    assert int(core.steps["num_preempted"].sum()) == core.summary["num_preemptions"]
    per_replica = core.steps.groupby("replica")["num_preempted"].sum()
    assert per_replica.to_dict() == core.replicas.set_index("replica")["preemptions"].to_dict()
