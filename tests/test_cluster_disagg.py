"""Disaggregated prefill/decode: transferred bytes, transfer times, TTFT free of decode-side queueing when
the KV is pushed, the decode side's seats and blocks holding prefills back when it is pulled, prefill
blocks held until their transfer ends, all by hand; random small pools never stall."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import ModelSpec

TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
        "frontend": {"enabled": False}, "kv_cache": {"block_size": 16, "num_gpu_blocks": 400}}
LINK = {"bandwidth_gb_s": 1.0, "latency_s": 0.01}


def _kv_bytes_per_token() -> int:
    m = ModelSpec.from_name("tiny-llama")   # K and V, every layer, every KV head, fp16
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2


def _pd(reqs: list[tuple[float, int, int]], prefill: dict, decode: dict, link=LINK, policy="round_robin",
        mode: str = "pull") -> dict:
    return {**TINY, "workload": {"requests": [{"arrival": a, "prompt_len": p, "output_len": o} for a, p, o in reqs]},
            "cluster": {"prefill": prefill, "decode": decode, "kv_transfer": {"link": link, "mode": mode},
                        "router": {"policy": policy}}}


REQS = [(0.002 * i, 40 + 13 * (i % 9), 1 + (i * 7) % 30) for i in range(50)]


def test_transferred_bytes_are_the_prompts_kv() -> None:
    res = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 2}, {"replicas": 3})))
    decoded = [(p, o) for _, p, o in REQS if o > 1]          # one output token: finished at prefill, nothing sent
    expected = sum(p for p, _ in decoded) * _kv_bytes_per_token()
    c = res.summary["cluster"]
    assert c["transferred_kv_bytes"] == expected
    assert (c["prefill_replicas"], c["decode_replicas"]) == (2, 3)
    req = res.requests
    assert (req["status"] == "FINISHED").all()
    assert set(req["prefill_replica"]) == {0, 1} and set(req.loc[req["output_tokens"] > 1, "replica"]) == {2, 3, 4}
    assert req.loc[req["output_tokens"] == 1, "transfer_s"].isna().all()
    assert list(res.replicas["role"]) == ["prefill"] * 2 + ["decode"] * 3


def test_a_lone_transfer_takes_bytes_over_bandwidth_plus_latency() -> None:
    res = run_scenario(scenario_from_dict(_pd([(0.0, 300, 5)], {"replicas": 1}, {"replicas": 1})))
    r = res.requests.iloc[0]
    assert r["transfer_s"] == pytest.approx(300 * _kv_bytes_per_token() / 1e9 + 0.01)
    # the decode side starts after the transfer: the second token comes later than first token + transfer
    assert r["finish_s"] > r["first_token_s"] + r["transfer_s"]


def test_pushed_kv_leaves_ttft_free_of_decode_side_queueing() -> None:
    """Pushed (a KV store between the pools), the prefill side never waits for the decode side: a decode
    pool too small to hold more than one request at a time changes TPOT, not one request's TTFT."""
    roomy = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 1}, {"replicas": 2}, mode="push")))
    tight = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 1},
                                                {"replicas": 1, "kv_cache": {"num_gpu_blocks": 12},
                                                 "scheduler": {"max_num_seqs": 1}}, mode="push")))
    assert np.array_equal(roomy.requests["ttft_s"].to_numpy(), tight.requests["ttft_s"].to_numpy())
    assert tight.summary["tpot_s"]["mean"] > roomy.summary["tpot_s"]["mean"]


def test_prefill_blocks_are_held_until_the_transfer_ends() -> None:
    """A prefill cache that holds one prompt: the second request's prefill can only start once the first
    request's KV has left (its transfer is slow), so its first token comes after that transfer."""
    slow = {"bandwidth_gb_s": 0.001, "latency_s": 0.0}
    reqs = [(0.0, 160, 4), (0.0, 160, 4)]    # 160 tokens = 10 blocks + 1 for the sampled token's slot
    res = run_scenario(scenario_from_dict(_pd(reqs, {"replicas": 1, "kv_cache": {"num_gpu_blocks": 11}},
                                              {"replicas": 1}, link=slow)))
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    transfer = 160 * _kv_bytes_per_token() / 1e6
    assert a["transfer_s"] == pytest.approx(transfer)
    assert b["first_token_s"] > a["first_token_s"] + transfer


def test_link_presets_and_bad_pools() -> None:
    from sim.errors import KvsimError

    ok = _pd(REQS[:5], {"replicas": 1}, {"replicas": 1}, link="nvlink")
    assert run_scenario(scenario_from_dict(ok)).summary["cluster"]["link"] == "nvlink"
    wide = {**ok, "workload": {"requests": [{"prompt_len": 10, "output_len": 5, "n": 2}]}}
    with pytest.raises(KvsimError, match="parallel samples"):
        run_scenario(scenario_from_dict(wide))
    assert not math.isnan(run_scenario(scenario_from_dict(ok)).summary["cluster"]["transfer_s_mean"])


def test_timeline_shows_each_transfer_between_prefill_and_decode() -> None:
    res = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 2}, {"replicas": 3})))
    tl, reqs = res.timeline, res.requests.set_index("req_id")
    moving = tl[tl["phase"] == "transferring"].set_index("req_id")
    # one transfer per request that decodes (output > 1), lasting its transfer_s from requests.csv
    assert sorted(moving.index) == [i for i, (_, _, o) in enumerate(REQS) if o > 1]
    np.testing.assert_allclose((moving["end_s"] - moving["start_s"]).to_numpy(),
                               reqs.loc[moving.index, "transfer_s"].to_numpy(), rtol=1e-12)
    for rid in moving.index[:10]:
        phases = tl[tl["req_id"] == rid].sort_values("start_s", kind="stable")
        names = list(phases.loc[(phases["end_s"] > phases["start_s"]) | (phases["phase"] == "done"), "phase"])
        # prefill on the prefill replica (its first token there), then the link, then decoding on the
        # decode replica; done once, at the end
        assert names.index("prefill") < names.index("transferring") < len(names) - 1 - names[::-1].index("decode")
        assert names.count("done") == 1 and names[-1] == "done"
        assert moving.loc[rid, "start_s"] >= reqs.loc[rid, "first_token_s"] - 1e-12


def test_an_fp8_kv_cache_sends_half_the_bytes_and_both_pools_must_keep_it() -> None:
    from sim.errors import KvsimError

    fp8 = {**_pd(REQS, {"replicas": 2}, {"replicas": 3}), "kv_cache": {**TINY["kv_cache"], "dtype": "fp8"}}
    decoded = sum(p for _, p, o in REQS if o > 1)
    assert run_scenario(scenario_from_dict(fp8)).summary["cluster"]["transferred_kv_bytes"] == \
        decoded * _kv_bytes_per_token() // 2                  # one byte a K or V element instead of two
    mixed = _pd(REQS[:5], {"replicas": 1}, {"replicas": 1, "kv_cache": {"dtype": "fp8"}})
    with pytest.raises(KvsimError, match="same KV bytes a token"):
        run_scenario(scenario_from_dict(mixed))


def _transfer_starts(res) -> dict[int, float]:
    tl = res.timeline
    return tl[tl["phase"] == "transferring"].set_index("req_id")["start_s"].to_dict()


def test_pulled_kv_waits_for_a_decode_seat_and_holds_the_prefill_back() -> None:
    """Pulled (vLLM's connectors), the decode replica takes a request's KV only once it has a seat and
    blocks for it, and the prefill replica holds the KV until then. One decode seat, a prefill cache that
    holds one prompt (10 blocks + 1), three prompts at once: B's KV waits on its prefill replica until A
    has finished decoding, so C's prefill starts only then. Pushed, B's KV leaves at once and C follows."""
    reqs = [(0.0, 160, 60), (0.0, 160, 4), (0.0, 160, 4)]
    fast = {"bandwidth_gb_s": 1000.0, "latency_s": 0.0}
    runs = {mode: run_scenario(scenario_from_dict(_pd(reqs, {"replicas": 1, "kv_cache": {"num_gpu_blocks": 11}},
                                                      {"replicas": 1, "scheduler": {"max_num_seqs": 1}},
                                                      link=fast, mode=mode)), check_integrity=True)
            for mode in ("pull", "push")}
    pull, push = (runs[m].requests.set_index("req_id") for m in ("pull", "push"))
    starts = _transfer_starts(runs["pull"])
    assert starts[1] >= pull.loc[0, "finish_s"]                  # B's KV left once A's seat was free
    assert pull.loc[2, "first_token_s"] > pull.loc[0, "finish_s"]  # and C's prefill waited for it
    assert push.loc[2, "first_token_s"] < push.loc[0, "finish_s"]
    assert _transfer_starts(runs["push"])[1] < push.loc[0, "finish_s"]
    assert (pull["status"] == "FINISHED").all() and (push["status"] == "FINISHED").all()
    # the same KV crosses the link either way
    assert runs["pull"].summary["cluster"]["transferred_kv_bytes"] == \
        runs["push"].summary["cluster"]["transferred_kv_bytes"] == 3 * 160 * _kv_bytes_per_token()


def test_a_pulled_request_counts_in_its_decode_replicas_load_before_its_kv_arrives() -> None:
    """least_requests over two decode replicas, two prefills ending together, a slow link: the second
    request goes to the other replica, because the first one counts where it was routed while its KV is on
    its way (pushed, both are routed as their transfers end, one after the other: also apart)."""
    slow = {"bandwidth_gb_s": 0.01, "latency_s": 0.0}
    data = _pd([(0.0, 100, 5), (0.0, 100, 5)], {"replicas": 2}, {"replicas": 2}, link=slow, policy="least_requests")
    res = run_scenario(scenario_from_dict(data), check_integrity=True)
    assert sorted(res.requests["replica"]) == [2, 3]


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_small_random_pools_always_finish(mode: str) -> None:
    """Random small prefill and decode pools (every scheduling policy, swap and recompute, async scheduling
    or not, slow and fast links, one to 8 decode seats): every request finishes or is refused, with every KV
    invariant checked after each step: no stall between the pools' seats, blocks and transfers."""
    import random

    for i in range(24):
        rng = random.Random(f"pd:{mode}:{i}")
        reqs = [(round(rng.random() * 0.5, 4), rng.randint(1, 200), rng.randint(1, 120)) for _ in range(rng.randint(5, 40))]
        data = _pd(reqs, {"replicas": rng.randint(1, 2), "kv_cache": {"num_gpu_blocks": rng.randint(14, 60)}},
                   {"replicas": rng.randint(1, 3), "kv_cache": {"num_gpu_blocks": rng.randint(14, 60)},
                    "scheduler": {"max_num_seqs": rng.randint(1, 8),
                                  "policy": rng.choice(["fcfs", "priority", "round_robin", "longest_prefix_first"]),
                                  "preemption": rng.choice(["recompute", "swap"]),
                                  "async_scheduling": rng.random() < 0.5}},
                   link={"bandwidth_gb_s": rng.choice([0.01, 1.0, 50.0]), "latency_s": 0.001},
                   policy=rng.choice(["round_robin", "least_requests", "least_kv", "power_of_two"]), mode=mode)
        data["kv_cache"] = {**data["kv_cache"], "swap_space_gb": 0.001, "prefix_caching": rng.random() < 0.3}
        data["scheduler"] = {"max_num_batched_tokens": rng.choice([64, 256, 2048]),
                             "chunked_prefill": rng.random() < 0.7, "max_steps_without_progress": 5000}
        res = run_scenario(scenario_from_dict(data), check_integrity=True)
        assert set(res.requests["status"]) <= {"FINISHED", "REJECTED"}, i
        assert (res.requests["status"] == "FINISHED").sum() == res.summary["num_finished"], i


def test_kv_wait_is_the_time_from_a_prefills_end_to_its_transfer() -> None:
    """The scenario above: pulled, B's KV waits from the end of its prefill (its first token) until A has
    finished decoding and frees the one seat; C's until B has (or none, if its prefill ends later); A's not
    at all. Pushed, nothing waits. The timeline shows the wait as its own phase."""
    reqs = [(0.0, 160, 60), (0.0, 160, 4), (0.0, 160, 4)]
    fast = {"bandwidth_gb_s": 1000.0, "latency_s": 0.0}
    runs = {mode: run_scenario(scenario_from_dict(_pd(reqs, {"replicas": 1, "kv_cache": {"num_gpu_blocks": 11}},
                                                      {"replicas": 1, "scheduler": {"max_num_seqs": 1}},
                                                      link=fast, mode=mode)))
            for mode in ("pull", "push")}
    pull = runs["pull"].requests.set_index("req_id")
    expect = [0.0, pull.loc[0, "finish_s"] - pull.loc[1, "first_token_s"],
              max(0.0, pull.loc[1, "finish_s"] - pull.loc[2, "first_token_s"])]
    np.testing.assert_allclose(pull["kv_wait_s"].to_numpy(), expect, rtol=1e-12, atol=1e-15)
    assert expect[1] > 0.0                                       # A decodes 59 more tokens meanwhile
    assert runs["pull"].summary["cluster"]["kv_wait_s_mean"] == pytest.approx(sum(expect) / 3, rel=1e-12)
    assert (runs["push"].requests["kv_wait_s"] == 0.0).all()
    tl = runs["pull"].timeline
    wait = tl[(tl["req_id"] == 1) & (tl["phase"] == "kv_wait")]
    assert len(wait) == 1 and wait["start_s"].iloc[0] == pytest.approx(pull.loc[1, "first_token_s"], rel=1e-12)
    assert wait["end_s"].iloc[0] == pytest.approx(_transfer_starts(runs["pull"])[1], rel=1e-12)


def test_a_pool_whose_hardware_cannot_hold_the_weights_is_named() -> None:
    """Llama-2-13B's 24.2 GiB of weights on a decode pool of 16 GiB CPUs: the error names the pool."""
    from sim.errors import KvsimError

    data = {**_pd(REQS[:3], {"replicas": 1}, {"replicas": 1, "hardware": "cpu"}), "model": "llama-2-13b",
            "kv_cache": {"block_size": 16}}
    with pytest.raises(KvsimError) as e:
        run_scenario(scenario_from_dict(data, source="pd.yaml"))
    assert e.value.one_line().startswith("error: pd.yaml: cluster.decode: model weights (24.2 GiB) do not fit in 1 x cpu")


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_a_handed_over_request_decodes_from_its_first_step_there(mode: str) -> None:
    """On its decode replica a request holds its prompt's KV and one token: its first step there computes
    that token's KV and samples the next, a decode; its timeline shows no prefill after its transfer."""
    res = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 2}, {"replicas": 3}, mode=mode)))
    assert res.summary["num_preemptions"] == 0
    tl = res.timeline
    landed = tl[tl["phase"] == "transferring"].set_index("req_id")["end_s"]
    pre = tl[tl["phase"] == "prefill"]
    late = pre[pre["start_s"] >= pre["req_id"].map(landed).fillna(float("inf"))]
    assert late.empty, late
    first = tl[tl["phase"] == "decode"].groupby("req_id")["start_s"].min()
    reqs = res.requests.set_index("req_id")
    for rid in landed.index[:10]:   # the prefill replica's decode phase is the first token's point: its
        assert first[rid] == pytest.approx(reqs.loc[rid, "first_token_s"], rel=1e-12)   # decode starts there


def test_a_layerwise_link_by_hand() -> None:
    """1 GB/s, no latency: a transfer asked for at its prefill's end counts the time the link stood idle
    since its KV began to be written as already sent, but never sends its last layer before the end."""
    import simpy

    from sim.cluster.link import KVLink

    env = simpy.Environment()
    link = KVLink(env, 1e9, 0.0)
    ends: dict[str, float] = {}

    def send(name: str, at: float, nbytes: float, ready_from: float | None, tail: float):
        yield env.timeout(at)
        yield from link.send(nbytes, ready_from=ready_from, tail_bytes=tail)
        ends[name] = env.now

    # a: idle link, KV written from 4.0 to 5.0: 1 s of its 2 s already sent -> lands at 6.0
    # b: asked at 5.5 while a holds the link: queues, overlaps nothing -> 2 s from 6.0 to 8.0
    # c: at 10.0, written from 9.9 (the link idle since 8.0): 0.1 s of 1 s sent -> 10.9
    # d: at 20.0, written long before: the whole transfer would be sent, but its last 0.1 GB leave after -> 20.1
    for args in [("a", 5.0, 2e9, 4.0, 2e8), ("b", 5.5, 2e9, 5.0, 2e8), ("c", 10.0, 1e9, 9.9, 1e7),
                 ("d", 20.0, 1e9, 0.0, 1e8)]:
        env.process(send(*args))
    env.run()
    assert ends == pytest.approx({"a": 6.0, "b": 8.0, "c": 10.9, "d": 20.1})
    assert link.busy_s == pytest.approx(6.0) and link.bytes_sent == 6e9


def test_layerwise_push_overlaps_the_transfer_with_its_prefill() -> None:
    """One request, tiny-llama (2 layers): what is left after the prefill is the transfer less the prefill's
    time (slow link), or its last layer (fast link), plus the latency; everything else as pushed."""
    for bw in (1.0, 1e-4):
        data = _pd([(0.0, 300, 5)], {"replicas": 1}, {"replicas": 1},
                   link={"bandwidth_gb_s": bw, "latency_s": 0.01}, mode="push")
        plain = run_scenario(scenario_from_dict(data)).requests.iloc[0]
        data["cluster"]["kv_transfer"]["layerwise"] = True
        r = run_scenario(scenario_from_dict(data)).requests.iloc[0]
        wire = 300 * _kv_bytes_per_token() / (bw * 1e9)
        prefill = r["first_token_s"] - r["first_scheduled_s"]
        assert r["transfer_s"] == pytest.approx(max(wire - prefill, wire / 2) + 0.01)
        assert plain["transfer_s"] == pytest.approx(wire + 0.01)
        assert r["ttft_s"] == plain["ttft_s"] and r["finish_s"] < plain["finish_s"]


def test_layerwise_needs_pushed_kv() -> None:
    from sim.errors import KvsimError

    data = _pd(REQS[:5], {"replicas": 1}, {"replicas": 1})
    data["cluster"]["kv_transfer"]["layerwise"] = True
    with pytest.raises(KvsimError, match="layerwise: only with mode push"):
        scenario_from_dict(data)
