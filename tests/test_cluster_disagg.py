"""Disaggregated prefill/decode: transferred bytes, transfer times, TTFT free of decode-side queueing,
prefill blocks held until their transfer ends, all by hand."""

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


def _pd(reqs: list[tuple[float, int, int]], prefill: dict, decode: dict, link=LINK, policy="round_robin") -> dict:
    return {**TINY, "workload": {"requests": [{"arrival": a, "prompt_len": p, "output_len": o} for a, p, o in reqs]},
            "cluster": {"prefill": prefill, "decode": decode, "kv_transfer": {"link": link},
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


def test_ttft_has_no_decode_side_queueing() -> None:
    """The prefill side never waits for the decode side: a decode pool too small to hold more than one
    request at a time changes TPOT, not one request's TTFT."""
    roomy = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 1}, {"replicas": 2})))
    tight = run_scenario(scenario_from_dict(_pd(REQS, {"replicas": 1},
                                                {"replicas": 1, "kv_cache": {"num_gpu_blocks": 12},
                                                 "scheduler": {"max_num_seqs": 1}})))
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
