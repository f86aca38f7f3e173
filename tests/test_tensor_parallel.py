"""Tensor parallelism end to end: the shipped TP=4 scenario, capacity and swap space derived by hand, and
``--set hardware.tensor_parallel=N`` on a scenario that names a hardware preset; an fp8 KV cache's capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import KvsimError
from sim.runner import cpu_blocks, gpu_blocks, run_scenario
from sim.scenario import load_scenario
from sim.specs import HardwareSpec

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

# Llama-2-70B from its config.json: hidden 8192, 80 layers, 64 heads of 128, 8 KV heads, MLP 28672, vocab 32000
LAYER = 8192 * (8192 + 2 * 8 * 128) + 8192 * 8192 + 3 * 8192 * 28672 + 2 * 8192
PARAMS_70B = 80 * LAYER + 2 * 32000 * 8192 + 8192           # untied embedding and LM head, final norm
KV_BYTES_PER_TOKEN_70B = 2 * 80 * 8 * 128 * 2                # K and V, layers, KV heads, head dim, fp16


def test_hand_derived_70b_numbers():
    assert PARAMS_70B == 68_976_648_192  # "70B"
    assert KV_BYTES_PER_TOKEN_70B == 327_680


def test_tp4_capacity_and_swap_space():
    scn = load_scenario(SCENARIOS / "tensor_parallel_70b.yaml")
    usable = 80 * 2**30 * 0.9 * 4                     # four GPUs at gpu_memory_utilization 0.9
    free = usable - 0.05 * usable - 2 * PARAMS_70B    # default activation reserve: 5% of usable
    assert gpu_blocks(scn) == int(free // (16 * KV_BYTES_PER_TOKEN_70B)) == 29_720
    # swap_space_gb is per GPU (vLLM): 4 GB on each of 4 GPUs
    assert cpu_blocks(scn) == (4 * 2**30 * 4) // (16 * KV_BYTES_PER_TOKEN_70B) == 3_276


def test_tp4_scenario_runs_end_to_end():
    # a smaller cache than HBM gives (capacity is checked above): the per-step invariant check is O(blocks)
    scn = load_scenario(SCENARIOS / "tensor_parallel_70b.yaml", ["workload.limit=30", "kv_cache.num_gpu_blocks=600"])
    s = run_scenario(scn, check_integrity=True).summary
    assert s["num_finished"] + s["num_rejected"] == 30 and s["num_finished"] >= 28


def test_set_tensor_parallel_on_a_preset():
    one = load_scenario(SCENARIOS / "quickstart.yaml", ["workload.limit=20"])
    two = load_scenario(SCENARIOS / "quickstart.yaml", ["workload.limit=20", "hardware.tensor_parallel=2"])
    assert two.hardware_spec.tensor_parallel == 2 and two.hardware_spec.hbm_bytes == one.hardware_spec.hbm_bytes
    # Llama-2-13B: 2 x 13,015,864,320 bytes of weights; KV 2 x 40 x 40 x 128 x 2 = 819,200 bytes a token
    weights = 2 * (40 * (5120 * 3 * 5120 + 5120 * 5120 + 3 * 5120 * 13824 + 2 * 5120) + 2 * 32000 * 5120 + 5120)
    for scn, tp in ((one, 1), (two, 2)):
        usable = 80 * 2**30 * 0.9 * tp
        assert gpu_blocks(scn) == int((0.95 * usable - weights) // (16 * 819_200))
        assert cpu_blocks(scn) == (4 * 2**30 * tp) // (16 * 819_200)
    small = load_scenario(SCENARIOS / "quickstart.yaml", ["workload.limit=20", "hardware.tensor_parallel=2",
                                                          "kv_cache.num_gpu_blocks=600"])
    assert run_scenario(small, check_integrity=True).summary["num_finished"] == 20


def test_an_fp8_kv_cache_holds_twice_the_tokens_of_the_same_memory():
    # kv_cache.dtype: fp8 (vLLM's --kv-cache-dtype fp8): 1 byte a K or V element, so 409,600 bytes a token
    # of Llama-2-13B (the seed's 819,200 in fp16); the weights stay fp16
    scn = load_scenario(SCENARIOS / "quickstart.yaml", ["workload.limit=40", "kv_cache.dtype=fp8"])
    weights = 2 * (40 * (5120 * 3 * 5120 + 5120 * 5120 + 3 * 5120 * 13824 + 2 * 5120) + 2 * 32000 * 5120 + 5120)
    assert scn.model_spec.kv_bytes_per_token() == 409_600 and scn.model_spec.weight_bytes() == weights
    assert gpu_blocks(scn) == int((0.95 * 80 * 2**30 * 0.9 - weights) // (16 * 409_600))
    assert cpu_blocks(scn) == (4 * 2**30) // (16 * 409_600)
    s = run_scenario(scn, check_integrity=True).summary
    assert s["num_finished"] == 40


def test_the_gpu_backend_refuses_an_fp8_kv_cache_it_would_not_keep():
    from backend.executor import make_gpu_executor

    scn = load_scenario(SCENARIOS / "quickstart.yaml", ["kv_cache.dtype=fp8"])
    with pytest.raises(KvsimError, match="kv_cache.dtype: the GPU backend keeps K and V in the model's dtype"):
        make_gpu_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=None, kv=scn.kv_cache,
                          num_gpu_blocks=1, num_cpu_blocks=0)


def test_set_hardware_name_switches_presets_or_renames():
    a100, h100 = HardwareSpec.from_name("a100-80gb"), HardwareSpec.from_name("h100-80gb")
    # another preset: its fields, with the ones set beside the name kept (either order)
    for sets in (["hardware.tensor_parallel=2", "hardware.name=h100-80gb"],
                 ["hardware.name=h100-80gb", "hardware.tensor_parallel=2"]):
        assert load_scenario(SCENARIOS / "quickstart.yaml", sets).hardware_spec == h100.model_copy(
            update={"tensor_parallel": 2})
    # a mapping naming a preset in the file (TP 4 there) switches the same way
    tp4 = load_scenario(SCENARIOS / "tensor_parallel_70b.yaml", ["hardware.name=H100-80GB"]).hardware_spec
    assert tp4 == h100.model_copy(update={"tensor_parallel": 4})
    # a name that is no preset renames the preset's fields (and so has no shipped calibration)
    renamed = load_scenario(SCENARIOS / "quickstart.yaml", ["hardware.name=my-a100"]).hardware_spec
    assert renamed == a100.model_copy(update={"name": "my-a100"})
    model = load_scenario(SCENARIOS / "quickstart.yaml", ["model.name=my-13b"]).model_spec
    assert model.name == "my-13b" and model.hidden_size == 5120 and model.num_layers == 40
    # a cluster pool's hardware preset takes one field too
    pool = load_scenario(SCENARIOS / "cluster_disaggregated.yaml",
                         ["cluster.prefill.hardware=h100-80gb", "cluster.prefill.hardware.tensor_parallel=2"])
    assert pool.cluster.prefill.hardware == h100.model_copy(update={"tensor_parallel": 2})


@pytest.mark.parametrize("sets, key, fragment", [
    (["hardware.tensor_parallel=3"], "hardware.tensor_parallel", "3 does not divide llama-2-13b's 40 attention heads"),
    # Phi-4: 40 attention heads but 10 KV heads; 4 GPUs neither split 10 nor take a copy each
    (["model=phi-4", "hardware.tensor_parallel=4"], "hardware.tensor_parallel",
     "4 GPUs cannot share phi-4's 10 KV heads"),
    (["cluster={prefill: {replicas: 1}, decode: {replicas: 1, tensor_parallel: 3}}"], "cluster.decode.tensor_parallel",
     "3 does not divide llama-2-13b's 40 attention heads"),
])
def test_a_tensor_parallel_degree_that_cannot_shard_the_model_is_refused(sets, key, fragment):
    with pytest.raises(KvsimError) as e:
        load_scenario(SCENARIOS / "quickstart.yaml", sets)
    assert e.value.one_line().startswith(f"error: {SCENARIOS / 'quickstart.yaml'}: {key}: {fragment}")
    assert e.value.one_line().endswith("(from --set)")


def test_more_gpus_than_kv_heads_hold_a_copy_each():
    """Qwen2.5-1.5B has 2 KV heads: at TP 4 each GPU holds one of them, so a token's KV takes twice the
    model's bytes over the group (vLLM replicates KV heads when there are more GPUs than heads)."""
    sets = ["model=qwen2.5-1.5b", "workload.limit=20"]
    per_token = 2 * 28 * 2 * 128 * 2            # K and V, 28 layers, 2 KV heads of 128, fp16: 28,672 bytes
    for tp, copies in ((1, 1), (2, 1), (4, 2)):
        scn = load_scenario(SCENARIOS / "quickstart.yaml", [*sets, f"hardware.tensor_parallel={tp}"])
        usable = 80 * 2**30 * 0.9 * tp
        weights = scn.model_spec.weight_bytes()
        assert gpu_blocks(scn) == int((0.95 * usable - weights) // (16 * per_token * copies))
        assert cpu_blocks(scn) == (4 * 2**30 * tp) // (16 * per_token * copies)
    # each GPU's share of a swapped block: one KV head of the two, 16 tokens, every layer
    from sim.runner import build_parts

    scn = load_scenario(SCENARIOS / "quickstart.yaml", [*sets, "hardware.tensor_parallel=4"])
    exe = build_parts(scn, 100, 10)[2]
    share = 16 * 2 * 28 * 1 * 128 * 2
    assert exe._swap_s_per_block - exe.params.swap_block_latency_s == pytest.approx(
        share / scn.hardware_spec.host_link_bandwidth, rel=1e-12)
