"""Expert parallelism (``hardware.expert_parallel``): placement, the busiest GPU's load, memory, pricing.

References: vLLM's ``determine_expert_map`` worked by hand (floor(E / N) experts a GPU, one more on the first
E mod N), closed forms and brute-force sums of binomial maxima, a simulated top-k router (a reference
implementation of the routing the expected maxima stand for), Qwen1.5-MoE-A2.7B's and Mixtral-8x7B's expert
shapes from their config.json, and the H100's HBM bandwidth (a GPU cannot read its expert's weights faster).
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.expert_parallel import busiest_gpu, expected_max, local_expert_counts
from sim.runner import build_parts, gpu_blocks, run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import (
    HardwareSpec,
    ModelSpec,
    activation_reserve,
    group_kv_bytes_per_block,
    kv_capacity_blocks,
)
from tests.result_compare import assert_same_outcome, off_and_on

ROOT = Path(__file__).resolve().parents[1]
H100 = HardwareSpec.from_name("h100-80gb")
BASE = {"model": "mixtral-8x7b", "hardware": {"name": "h100-80gb", "tensor_parallel": 2, "expert_parallel": True},
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "chunked_prefill": True},
        "workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 20.0},
                                   "prompt_len": {"dist": "uniform", "min": 100, "max": 900},
                                   "output_len": {"dist": "uniform", "min": 5, "max": 80}}},
        "output": {"plots": False}}


@pytest.mark.parametrize("experts, gpus, counts", [
    (8, 2, [4, 4]), (8, 8, [1] * 8), (60, 8, [8, 8, 8, 8, 7, 7, 7, 7]), (256, 3, [86, 85, 85]),
])
def test_experts_are_placed_as_vllm_places_them(experts, gpus, counts):
    assert local_expert_counts(experts, gpus) == counts


def _brute_max(trials: list[int], probs: list[float]) -> float:
    """E[max] of independent binomials as the sum of P(max > x), each CDF summed term by term."""
    total = 0.0
    for x in range(max(trials)):
        below = 1.0
        for n, p in zip(trials, probs):
            below *= sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(min(x, n) + 1))
        total += 1.0 - below
    return total


@pytest.mark.parametrize("trials, probs, closed", [
    ([1, 1], [0.3, 0.3], 1 - 0.7**2),              # the larger of two coins: 1 - P(both tails)
    ([2, 2], [0.5, 0.5], (1 - 0.25**2) + (1 - 0.75**2)),   # P(max > 0) + P(max > 1)
    ([4, 4], [0.25, 0.25], None), ([8, 8, 7, 7], [0.3] * 4, None), ([400] * 8, [8 / 60] * 4 + [7 / 60] * 4, None),
    ([1, 3, 2], [0.5, 0.2, 0.9], None),
])
def test_the_expected_maximum_of_binomials_is_exact(trials, probs, closed):
    want = closed if closed is not None else _brute_max(trials, probs)
    assert expected_max(trials, probs) == pytest.approx(want, rel=1e-9)


def _simulated_router(experts: int, top_k: int, gpus: int, tokens: int, steps: int = 600) -> tuple[float, float]:
    """(active experts, rows) of the busiest GPU, averaged over ``steps`` steps of a router that sends each of
    ``tokens`` tokens to ``top_k`` distinct experts drawn uniformly."""
    rng = np.random.default_rng(7)
    owner = np.repeat(np.arange(gpus), local_expert_counts(experts, gpus))
    active, rows = [], []
    for _ in range(steps):
        chosen = np.argpartition(rng.random((tokens, experts)), top_k - 1, axis=1)[:, :top_k].ravel()
        rows.append(np.bincount(owner[chosen], minlength=gpus).max())
        hit = np.zeros(experts, dtype=bool)
        hit[chosen] = True
        active.append(np.bincount(owner[hit], minlength=gpus).max())
    return float(np.mean(active)), float(np.mean(rows))


@pytest.mark.parametrize("experts, top_k, gpus, tokens", [
    (8, 2, 2, 1), (8, 2, 2, 4), (8, 2, 4, 4), (8, 2, 8, 1), (8, 2, 2, 256), (60, 4, 8, 16), (128, 8, 8, 64),
    (256, 8, 8, 4),
])
def test_the_busiest_gpu_is_within_six_percent_of_a_simulated_router(experts, top_k, gpus, tokens):
    active, rows = busiest_gpu(experts, top_k, gpus, tokens)
    sim_active, sim_rows = _simulated_router(experts, top_k, gpus, tokens)
    assert active == pytest.approx(sim_active, rel=0.06)
    assert rows == pytest.approx(sim_rows, rel=0.06)


def test_an_uneven_placement_sizes_every_gpus_cache_by_the_fullest():
    # Qwen1.5-MoE-A2.7B on 8 GPUs: 60 experts as 8, 8, 8, 8, 7, 7, 7, 7, so each GPU keeps room for 8: four
    # experts a layer over the group that hold nothing, each 3 x 2048 x 1408 x 2 bytes (gate, up, down in
    # fp16), over 24 expert layers
    model = ModelSpec.from_name("qwen1.5-moe-a2.7b")
    lost = 4 * 3 * 2048 * 1408 * 2 * 24
    assert lost == 1_660_944_384
    tp8 = H100.model_copy(update={"tensor_parallel": 8})
    usable = H100.hbm_bytes * 0.9 * 8
    free = usable - model.weight_bytes() - activation_reserve(usable, None)
    per_block = group_kv_bytes_per_block(model, tp8, 16)
    assert kv_capacity_blocks(model, tp8, 16) == math.floor(free / per_block)
    assert kv_capacity_blocks(model, tp8.model_copy(update={"expert_parallel": True}), 16) == \
        math.floor((free - lost) / per_block)
    # Mixtral's 8 experts over 2 GPUs place evenly: nothing lost
    mixtral, tp2 = ModelSpec.from_name("mixtral-8x7b"), H100.model_copy(update={"tensor_parallel": 2})
    assert kv_capacity_blocks(mixtral, tp2.model_copy(update={"expert_parallel": True}), 16) == \
        kv_capacity_blocks(mixtral, tp2, 16)


def _executor(model: str, tp: int, ep: bool):
    scn = scenario_from_dict({**copy.deepcopy(BASE), "model": model,
                              "hardware": {"name": "h100-80gb", "tensor_parallel": tp, "expert_parallel": ep}})
    return build_parts(scn, gpu_blocks(scn), 0)[2]


def test_one_token_makes_the_busiest_gpu_read_a_whole_expert():
    # Mixtral-8x7B on 8 GPUs, one expert each: a token's two experts are two GPUs' whole experts (3 x 4096 x
    # 14336 fp16 weights, 352 MB), which no GPU reads faster than its HBM allows; split by tensor parallelism,
    # each GPU reads an eighth of both (88 MB)
    expert = 3 * 4096 * 14336 * 2
    floor_s = expert / H100.hbm_bandwidth
    with_ep, without = _executor("mixtral-8x7b", 8, True), _executor("mixtral-8x7b", 8, False)
    assert with_ep.layer_linear_time(1) - without.layer_linear_time(1) > floor_s * (1 - 2 / 8) * 0.9
    assert without.layer_linear_time(1) < floor_s < with_ep.layer_linear_time(1)


def test_narrow_experts_prefill_faster_whole_and_decode_slower_on_the_busiest_gpu():
    # Qwen3-30B-A3B's experts are 768 wide: a tensor-parallel group of 8 splits each to 96 columns a GPU,
    # tiles too narrow to fill; whole experts fill them, but a small decode batch waits for the busiest GPU
    with_ep, without = _executor("qwen3-30b-a3b", 8, True), _executor("qwen3-30b-a3b", 8, False)
    assert with_ep.layer_linear_time(8192) < 0.9 * without.layer_linear_time(8192)
    assert with_ep.layer_linear_time(8) > without.layer_linear_time(8)


def test_one_gpu_with_expert_parallelism_is_the_same_engine():
    one = {**copy.deepcopy(BASE), "model": "qwen1.5-moe-a2.7b", "hardware": {"name": "h100-80gb"}}
    plain = run_scenario(scenario_from_dict(one))
    one["hardware"]["expert_parallel"] = True
    assert_same_outcome(plain, run_scenario(scenario_from_dict(one)), "expert_parallel at TP 1")


def test_the_compiled_core_and_the_simpy_loop_agree(monkeypatch):
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(copy.deepcopy(BASE))))
    assert_same_outcome(loop, core, "expert parallelism")
    assert core.profile.get("compiled_core")


@pytest.mark.parametrize("change, key, why", [
    ({"model": "llama-2-7b"}, "hardware.expert_parallel", "no experts"),
    ({"hardware": {"name": "h100-80gb", "tensor_parallel": 16, "expert_parallel": True}}, "hardware.expert_parallel",
     "without an expert"),
    ({"executor": {"kind": "gpu"}}, "hardware.expert_parallel", "does not price"),
])
def test_what_expert_parallelism_cannot_do_is_refused_naming_the_key(change, key, why):
    with pytest.raises(KvsimError, match=why) as e:
        scenario_from_dict({**copy.deepcopy(BASE), **change})
    assert f": {key}" in e.value.one_line()


def test_whole_experts_need_no_width_the_gpus_divide():
    # an expert width of 770 does not split over 8 GPUs; placed whole, it need not
    data = {**copy.deepcopy(BASE), "model": {"name": "qwen3-30b-a3b", "intermediate_size": 770},
            "hardware": {"name": "h100-80gb", "tensor_parallel": 8}}
    with pytest.raises(KvsimError, match="does not divide"):
        scenario_from_dict(copy.deepcopy(data))
    data["hardware"]["expert_parallel"] = True
    assert scenario_from_dict(data).hardware_spec.expert_parallel


def test_kv_size_takes_expert_parallel():
    run = [sys.executable, "-m", "sim.cli", "kv-size", "--model", "qwen1.5-moe-a2.7b", "--seq-len", "4096",
           "--hardware", "h100-80gb", "--tensor-parallel", "8"]
    tp8 = H100.model_copy(update={"tensor_parallel": 8, "expert_parallel": True})
    blocks = kv_capacity_blocks(ModelSpec.from_name("qwen1.5-moe-a2.7b"), tp8, 16)
    out = subprocess.run([*run, "--expert-parallel"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"{blocks:,} blocks" in out
    bad = subprocess.run([*run[:5], "llama-2-7b", *run[6:], "--expert-parallel"], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--expert-parallel" in bad.stderr and "Traceback" not in bad.stderr
