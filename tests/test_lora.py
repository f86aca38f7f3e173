"""Multi-LoRA serving (the ``lora`` section, sim/lora.py): slots, the batch's adapter limit, loads, kernels.

References: Llama-2-7B's projection shapes from its config.json (hidden 4096, 32 heads of 128 and 32 KV heads,
intermediate 11008, 32 layers, fp16) worked by hand into adapter bytes; vLLM's scheduling rule (a waiting
request whose adapter would be one too many for the batch is skipped) played by hand on three requests; the
H100's host link and HBM bandwidths from its datasheet (a load or a kernel cannot move bytes faster); the Zipf
law's frequencies.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from result_compare import assert_same, off_and_on, same_cluster_outcome

from sim import engine_core
from sim.errors import KvsimError
from sim.lora import LoraConfig, draw_adapters, gpu_lora_bytes, slot_bytes
from sim.native import native
from sim.runner import build_parts, gpu_blocks, run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import HardwareSpec, ModelSpec, activation_reserve, group_kv_bytes_per_block

ROOT = Path(__file__).resolve().parents[1]
H100 = HardwareSpec.from_name("h100-80gb")
LLAMA7 = ModelSpec.from_name("llama-2-7b")
# one rank of a Llama-2-7B adapter, a layer: QKV (4096 in, 3 x 4096 out), output (4096, 4096), gate and up
# (4096, 2 x 11008), down (11008, 4096): the sum of inputs and outputs
RANK1_LAYER = (4096 + 12288) + (4096 + 4096) + (4096 + 22016) + (11008 + 4096)   # 65,792
ADAPTER16 = 16 * RANK1_LAYER * 32 * 2   # rank 16, 32 layers, fp16: 67,371,008 bytes

BASE = {"model": "llama-2-7b", "hardware": "h100-80gb", "frontend": {"enabled": False}, "output": {"plots": False},
        "kv_cache": {"num_gpu_blocks": 2000},
        "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "chunked_prefill": True},
        "lora": {"max_loras": 1, "adapters": 0, "load_latency_s": 0.05}}


def test_an_adapter_slot_takes_its_projections_ranks_on_each_gpu():
    assert RANK1_LAYER == 65_792 and ADAPTER16 == 67_371_008
    assert slot_bytes(LLAMA7, 1, 16) == ADAPTER16
    # over two GPUs a column-parallel layer keeps its A whole and splits its B, a row-parallel one the reverse:
    # QKV 4096 + 6144, output 2048 + 4096, gate-and-up 4096 + 11008, down 5504 + 4096 a rank, on each GPU
    per_gpu = 16 * ((4096 + 6144) + (2048 + 4096) + (4096 + 11008) + (5504 + 4096)) * 32 * 2
    assert slot_bytes(LLAMA7, 2, 16) == per_gpu == 42_074_112
    assert gpu_lora_bytes(LLAMA7, 2, LoraConfig(max_loras=4, max_lora_rank=16)) == 4 * 2 * per_gpu


def test_the_slots_come_out_of_the_kv_cache():
    data = {**copy.deepcopy(BASE), "kv_cache": {}, "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]},
            "lora": {"max_loras": 4, "max_lora_rank": 16}}
    usable = H100.hbm_bytes * 0.9
    free = usable - LLAMA7.weight_bytes() - activation_reserve(usable, None)
    per_block = group_kv_bytes_per_block(LLAMA7, H100, 16)
    assert gpu_blocks(scenario_from_dict(data)) == math.floor((free - 4 * ADAPTER16) / per_block)
    del data["lora"]
    assert gpu_blocks(scenario_from_dict(data)) == math.floor(free / per_block)


def test_kv_size_counts_the_slots():
    usable = H100.hbm_bytes * 0.9
    free = usable - LLAMA7.weight_bytes() - activation_reserve(usable, None)
    want = math.floor((free - 4 * ADAPTER16) / group_kv_bytes_per_block(LLAMA7, H100, 16))
    run = [sys.executable, "-m", "sim.cli", "kv-size", "--model", "llama-2-7b", "--seq-len", "4096", "--hardware",
           "h100-80gb", "--max-loras", "4"]
    out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"{want:,} blocks" in out and "4 LoRA slots of rank 16: 0.27 GB" in out
    bad = subprocess.run([*run, "--max-lora-rank", "17"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --max-lora-rank:") and "Traceback" not in bad.stderr


def _run(requests: list[dict], **lora) -> pd.DataFrame:
    data = {**copy.deepcopy(BASE), "workload": {"requests": requests}}
    data["lora"].update(lora)
    return run_scenario(scenario_from_dict(data))


def test_a_request_whose_adapter_would_be_one_too_many_waits_and_later_ones_go_ahead():
    # one adapter a batch: adapter 0's two requests start together; adapter 1's, queued between them, is
    # skipped until both have finished; the base model's request is never held back
    reqs = [{"arrival": 0.0, "prompt_len": 100, "output_len": 20, "lora": 0},
            {"arrival": 0.0, "prompt_len": 100, "output_len": 5, "lora": 1},
            {"arrival": 0.0, "prompt_len": 100, "output_len": 30, "lora": 0},
            {"arrival": 0.0, "prompt_len": 100, "output_len": 5}]
    res = _run(reqs)
    t = res.requests.set_index("req_id")
    start = t["first_scheduled_s"]
    assert start[0] == start[2] == start[3] == 0.0
    assert start[1] >= t["finish_s"][[0, 2]].max()
    assert list(t["lora_id"]) == [0, 1, 0, -1]
    # two adapters a batch: all start at once
    both = _run(reqs, max_loras=2, max_cpu_loras=2).requests
    assert (both["first_scheduled_s"] == 0.0).all()


def test_loads_come_from_disk_once_and_from_the_host_after():
    # three requests far apart, adapters 0, 1, 0 and one GPU slot: each is copied into the slot; with one
    # adapter in the host cache each is read from disk first, with two the last is found there
    reqs = [{"arrival": 0.0, "prompt_len": 50, "output_len": 3, "lora": 0},
            {"arrival": 10.0, "prompt_len": 50, "output_len": 3, "lora": 1},
            {"arrival": 20.0, "prompt_len": 50, "output_len": 3, "lora": 0}]
    copy_s = ADAPTER16 / H100.host_link_bandwidth
    one = _run(reqs).summary["lora"]
    assert (one["gpu_loads"], one["disk_loads"]) == (3, 3)
    assert one["load_s"] == pytest.approx(3 * 0.05 + 3 * copy_s)
    two = _run(reqs, max_cpu_loras=2).summary["lora"]
    assert (two["gpu_loads"], two["disk_loads"]) == (3, 2)
    assert two["load_s"] == pytest.approx(2 * 0.05 + 3 * copy_s)
    # the load is part of the step that needs it: the first step's LoRA time holds it
    steps = _run(reqs).steps
    assert steps["time_lora_s"].iloc[0] >= 0.05 + copy_s


def test_the_kernels_read_every_active_adapters_weights():
    scn = scenario_from_dict({**copy.deepcopy(BASE), "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]}})
    executor = build_parts(scn, 2000, 0)[2]
    one = executor._lora_kernels(16, 1, False)
    four = executor._lora_kernels(16, 4, False)
    assert one >= ADAPTER16 / H100.hbm_bandwidth       # (at the slots' rank, 16: an adapter's bytes)
    assert four >= 4 * ADAPTER16 / H100.hbm_bandwidth
    assert four > one


def test_a_lora_section_without_adapters_in_use_changes_no_timing():
    reqs = [{"arrival": 0.01 * i, "prompt_len": 100 + 7 * i, "output_len": 10 + i} for i in range(30)]
    plain = {**copy.deepcopy(BASE), "workload": {"requests": reqs}}
    del plain["lora"]
    without = run_scenario(scenario_from_dict(plain)).requests
    with_section = _run(reqs, max_loras=4, max_cpu_loras=4).requests
    pd.testing.assert_frame_equal(without, with_section.drop(columns="lora_id"))


def test_the_prefix_cache_shares_blocks_only_within_an_adapter():
    # one 320-token system prompt (20 blocks of 16), then each request's own 40 tokens: the second request
    # reuses the first's 20 blocks under the same adapter, none under another adapter or the base model
    def second_hit(first: int, second: int) -> int:
        reqs = [{"arrival": 0.0, "prompt_len": 360, "output_len": 2, "prefix_group": 0, "prefix_len": 320,
                 "lora": first},
                {"arrival": 1.0, "prompt_len": 360, "output_len": 2, "prefix_group": 0, "prefix_len": 320,
                 "lora": second}]
        data = {**copy.deepcopy(BASE), "workload": {"requests": reqs}}
        data["kv_cache"]["prefix_caching"] = True
        data["lora"].update(max_loras=2, max_cpu_loras=2)
        return int(run_scenario(scenario_from_dict(data)).requests["num_cached_tokens"].iloc[1])

    assert second_hit(3, 3) == 320
    assert second_hit(3, 4) == 0
    assert second_hit(3, -1) == 0


def test_drawn_adapters_follow_their_popularity_and_share():
    lora = LoraConfig(adapters=4, popularity="zipf", zipf_exponent=1.0, share=0.5)
    ids = draw_adapters(lora, 200_000, seed=3)
    assert (ids == draw_adapters(lora, 200_000, seed=3)).all()
    named = ids[ids >= 0]
    assert len(named) / len(ids) == pytest.approx(0.5, abs=0.01)
    want = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / (1 + 1 / 2 + 1 / 3 + 1 / 4)   # Zipf: in proportion to 1 / i
    assert np.bincount(named, minlength=4) / len(named) == pytest.approx(want, abs=0.01)
    even = draw_adapters(LoraConfig(adapters=4, popularity="uniform"), 100_000, seed=3)
    assert np.bincount(even) / len(even) == pytest.approx([0.25] * 4, abs=0.01)


def test_a_drawn_workload_runs_on_a_cluster_of_replicas():
    data = {**copy.deepcopy(BASE), "cluster": {"replicas": 2},
            "lora": {"max_loras": 2, "max_cpu_loras": 4, "adapters": 6},
            "workload": {"synthetic": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 40.0},
                                       "prompt_len": {"dist": "uniform", "min": 50, "max": 400},
                                       "output_len": {"dist": "uniform", "min": 5, "max": 40}}}}
    res = run_scenario(scenario_from_dict(data))
    assert res.summary["num_finished"] == 80
    assert set(res.requests["lora_id"]) <= set(range(6))
    assert res.summary["lora"]["gpu_loads"] >= len(set(res.requests["lora_id"]))


def test_the_lora_affinity_router_keeps_an_adapters_requests_together():
    # two replicas of one slot each; adapters 0, 0, 1, 1 arrive 1 ms apart. Round robin sends each replica one
    # request of each adapter, so each serves them one adapter at a time and loads both; lora_affinity sends
    # the second request of adapter 0 where adapter 0 already sits (its load, 1, is within the slack), and
    # adapter 1's to the other replica: each replica loads one adapter
    reqs = [{"arrival": 0.001 * i, "prompt_len": 200, "output_len": 50, "lora": a} for i, a in enumerate([0, 0, 1, 1])]

    def run(policy: str):
        data = {**copy.deepcopy(BASE), "workload": {"requests": reqs},
                "cluster": {"replicas": 2, "router": {"policy": policy}}}
        return run_scenario(scenario_from_dict(data))

    rr, aff = run("round_robin"), run("lora_affinity")
    assert list(rr.requests["replica"]) == [0, 1, 0, 1] and rr.summary["lora"]["gpu_loads"] == 4
    assert list(aff.requests["replica"]) == [0, 0, 1, 1] and aff.summary["lora"]["gpu_loads"] == 2
    assert aff.summary["ttft_s"]["p90"] < rr.summary["ttft_s"]["p90"]


@pytest.mark.parametrize("change, key", [
    ({"model": "mixtral-8x7b", "hardware": {"name": "h100-80gb", "tensor_parallel": 2}}, "model"),
    ({"hardware": {"name": "h100-80gb", "pipeline_parallel": 2}}, "hardware.pipeline_parallel"),
    ({"scheduler": {"preemption": "swap"}}, "scheduler.preemption"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative"),
    ({"lora": {"max_loras": 4, "max_cpu_loras": 2}}, "lora"),
    ({"lora": {"max_lora_rank": 8, "adapter_rank": 16}}, "lora"),
    ({"lora": {"max_lora_rank": 17}}, "lora"),
    ({"lora": {"adapters": 4}}, "lora.adapters"),   # (the inline requests name their own)
])
def test_what_lora_serving_does_not_model_is_refused_naming_the_key(change, key):
    data = {**copy.deepcopy(BASE), "workload": {"requests": [{"prompt_len": 10, "output_len": 2, "lora": 0}]}, **change}
    with pytest.raises(KvsimError) as e:
        scenario_from_dict(data)
    assert f": {key}" in e.value.one_line()


def test_a_request_naming_an_adapter_needs_the_section():
    data = {**copy.deepcopy(BASE), "workload": {"requests": [{"prompt_len": 10, "output_len": 2, "lora": 3}]}}
    del data["lora"]
    with pytest.raises(KvsimError, match="workload.requests: a request names a LoRA adapter"):
        scenario_from_dict(data)


PRESSURE = {"synthetic": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 30.0},
                          "prompt_len": {"dist": "uniform", "min": 40, "max": 500},
                          "output_len": {"dist": "uniform", "min": 5, "max": 60}}}


@pytest.mark.parametrize("policy, slots, blocks", [("fcfs", 1, 2000), ("fcfs", 2, 60), ("priority", 1, 60),
                                                   ("round_robin", 2, 80), ("longest_prefix_first", 1, 60)])
def test_the_compiled_core_serves_adapters_as_the_simpy_loop_does(monkeypatch, policy, slots, blocks):
    # six adapters (Zipf) over one or two slots, the cache roomy or tight (preemptions, heads blocked on
    # blocks): the same requests, steps and loads bit for bit, every invariant checked after each step
    data = {**copy.deepcopy(BASE), "workload": copy.deepcopy(PRESSURE),
            "lora": {"max_loras": slots, "max_cpu_loras": slots + 1, "adapters": 6, "share": 0.8}}
    data["scheduler"]["policy"] = policy
    data["kv_cache"] = {"num_gpu_blocks": blocks, "prefix_caching": policy == "longest_prefix_first"}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] == (native is not None) and not loop.profile.get("compiled_core")
    assert core.summary["lora"]["gpu_loads"] > 6 and core.steps["time_lora_s"].gt(0).any()


@pytest.mark.parametrize("policy", ["lora_affinity", "round_robin", "least_requests"])
def test_a_cluster_of_lora_replicas_runs_in_the_core_as_in_the_simpy_loop(monkeypatch, policy):
    data = {**copy.deepcopy(BASE), "workload": copy.deepcopy(PRESSURE),
            "lora": {"max_loras": 1, "max_cpu_loras": 2, "adapters": 4},
            "cluster": {"replicas": 3, "router": {"policy": policy}}}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(data)), check_integrity=True))
    assert same_cluster_outcome(loop, core, policy) == (native is not None)
