"""Hand-computed checks of the analytical executor (plain roofline, efficiencies set to 1)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sim.executors.base import make_executor
from sim.executors.cost_model import CostModelExecutor
from sim.executors.roofline import CostParams
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0, allreduce_eff=1.0)
A100 = HardwareSpec.from_name("a100-80gb")
L13 = ModelSpec.from_name("llama-2-13b")


def _exe(hw: HardwareSpec = A100, **kw) -> CostModelExecutor:
    return CostModelExecutor(L13, hw, CostParams(**{**IDEAL, **kw}))


def _plan(*reqs: tuple[int, int], **kw) -> StepPlan:
    return StepPlan(scheduled=[ScheduledRequest(i, n, c, []) for i, (n, c) in enumerate(reqs)], **kw)


def test_decode_13b_a100_is_memory_bound_weight_read():
    # Llama-2-13B linear weights: per layer QKV 5120 x 15360 = 78,643,200, out 5120 x 5120 = 26,214,400,
    # MLP 3 x 5120 x 13824 = 212,336,640 -> 317,194,240; x 40 layers = 12,687,769,600; LM head
    # 5120 x 32000 = 163,840,000. Total 12,851,609,600 params x 2 bytes = 25,703,219,200 bytes.
    # One decode token: 2 x 12.85e9 FLOPs / 312e12 = 0.08 ms of compute, far below the memory time:
    expected = 25_703_219_200 / 2039e9  # 12.606 ms
    r = _exe().execute(_plan((1, 100)))
    assert r.breakdown["linear"] == pytest.approx(expected, rel=2e-3)  # activations add ~0.1%
    assert r.breakdown["linear"] == pytest.approx(0.012606, rel=3e-3)
    # attention reads the KV of 101 tokens: 101 x 819,200 bytes (all layers), plus Q and O
    kv_read = 101 * 819_200 / 2039e9
    assert kv_read < r.breakdown["attention"] < kv_read * 1.05


def test_prefill_13b_a100_is_compute_bound():
    # 1000 prompt tokens: 2 x 1000 x 12,687,769,600 FLOPs / 312e12 = 81.33 ms; LM head on one token is
    # memory bound: 163,840,000 x 2 bytes / 2039e9 = 0.1607 ms.
    r = _exe().execute(_plan((1000, 0)))
    assert r.breakdown["linear"] == pytest.approx(2 * 1000 * 12_687_769_600 / 312e12 + 0.1607e-3, rel=1e-3)
    # causal pairs 1000 x 1001 / 2 = 500,500; 4 x 128 x 40 heads FLOPs each, x 40 layers
    assert r.breakdown["attention"] == pytest.approx(4 * 128 * 40 * 500_500 * 40 / 312e12, rel=1e-6)


def test_breakdown_sums_and_overhead():
    exe = _exe(step_overhead_s=0.003, kernel_latency_s=5e-6)
    r = exe.execute(_plan((1, 10), (1, 500), (20, 30)))
    assert r.duration_s == pytest.approx(sum(r.breakdown.values()), rel=1e-12)
    assert r.breakdown["overhead"] == 0.003
    for key in ("linear", "attention", "swap", "copy", "overhead"):
        assert key in r.breakdown


def test_swap_and_copy_charges():
    # Llama-2-13B block of 16 tokens = 13,107,200 bytes; PCIe 32e9 B/s -> 409.6 us, plus 10 us per block
    exe = _exe(swap_block_latency_s=10e-6)
    r = exe.execute(StepPlan(blocks_to_swap_out=[(1, 1), (2, 2), (3, 3)], blocks_to_swap_in=[(4, 4), (5, 5)],
                             blocks_to_copy=[(6, 7)]))
    assert r.breakdown["swap"] == pytest.approx(5 * (409.6e-6 + 10e-6), rel=1e-9)
    assert r.breakdown["copy"] == pytest.approx(2 * 13_107_200 / 2039e9, rel=1e-9)
    assert r.duration_s > 0


def test_a_step_of_swaps_alone_in_engine_mode_costs_the_cpu_side_and_the_gap():
    # no tokens: no GPU work and no sampling; the engine's CPU side of a step (0.6 ms) and its gap (267 us in
    # the shipped H100 terms), not the 2 ms fixed overhead of the isolated-operator roofline
    from sim.executors.engine_params import EngineParams

    eng = EngineParams(cpu_step_s=6e-4, step_gap_s=267e-6)
    exe = CostModelExecutor(L13, A100, CostParams(swap_block_latency_s=10e-6, step_overhead_s=2e-3), engine=eng)
    r = exe.execute(StepPlan(blocks_to_swap_out=[(1, 1), (2, 2)]))
    assert r.breakdown["swap"] == pytest.approx(2 * (409.6e-6 + 10e-6), rel=1e-9)
    assert r.breakdown["overhead"] == pytest.approx(6e-4 + 267e-6, rel=1e-12)
    assert r.duration_s == pytest.approx(r.breakdown["swap"] + 6e-4 + 267e-6, rel=1e-12)


def test_tensor_parallel_splits_weights_and_adds_allreduce():
    tp2 = A100.model_copy(update={"tensor_parallel": 2})
    one = _exe().execute(_plan((1, 100)))
    two = _exe(hw=tp2).execute(_plan((1, 100)))
    # half the weights per GPU (plus the tiny activations, which do not split)
    assert two.breakdown["linear"] == pytest.approx(one.breakdown["linear"] / 2, rel=3e-3)
    # 2 all-reduces per layer of 1 x 5120 x 2 bytes: ring 2 x 1/2 x 10240 / 300e9 + 2 x 5 us latency
    per = 10240 / 300e9 + 2 * 5e-6
    assert two.breakdown["allreduce"] == pytest.approx(2 * 40 * per, rel=1e-9)
    assert one.breakdown["allreduce"] == 0.0


def test_registry_factory_uses_the_shipped_calibration(tmp_path: Path):
    # the factory, given no calibration, prices as an executor built by hand from the hardware's shipped
    # calibration (both layers), and unlike the uncalibrated roofline; a second instance agrees exactly
    from sim.executors.cost_model import engine_params_of, load_calibration
    from sim.scenario import ExecutorConfig

    exe = make_executor("cost_model", model=L13, hardware=A100, config=None, kv=None, num_gpu_blocks=10,
                        num_cpu_blocks=0, base_dir=tmp_path)
    params, doc = load_calibration("a100-80gb")
    by_hand = CostModelExecutor(L13, A100, params, 16, engine_params_of(doc))
    plain = make_executor("cost_model", model=L13, hardware=A100, config=ExecutorConfig(calibration="roofline"))
    plan = _plan((1, 100), (5, 0))
    assert exe.execute(plan).duration_s == by_hand.execute(plan).duration_s > 0
    assert exe.execute(plan).duration_s != plain.execute(plan).duration_s


def test_execute_is_fast_for_a_decode_batch():
    exe = CostModelExecutor(L13, A100, CostParams())
    plan = _plan(*[(1, 100 + i) for i in range(100)])
    exe.execute(plan)  # warm the per-token-count cache
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        exe.execute(plan)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 100e-6  # target 20 us; generous for loaded CI machines


def test_fp8_gemms_run_at_the_fp8_rate_where_the_gpu_has_fp8_tensor_cores():
    # One layer of Llama-2-13B on 8,192 tokens, ideal efficiencies: per token 2 x 317,194,240 FLOPs (the
    # layer's linear weights, above) = 5.204e15 FLOPs a layer. Compute-bound: fp16 on an H100 at 989e12
    # FLOP/s, fp8 at 1,979e12 (datasheet, dense); attention is not a GEMM and keeps the fp16 rate.
    fp8 = L13.model_copy(update={"dtype": "fp8"})
    flops = 2 * 8192 * 317_194_240
    h100 = HardwareSpec.from_name("h100-80gb")
    assert CostModelExecutor(L13, h100, CostParams(**IDEAL)).layer_linear_time(8192) == pytest.approx(
        flops / 989e12, rel=1e-9)
    exe = CostModelExecutor(fp8, h100, CostParams(**IDEAL))
    assert exe.layer_linear_time(8192) == pytest.approx(flops / 1979e12, rel=1e-9)
    assert exe._attn_peak == 989e12
    # an A100 has no fp8 tensor cores: fp8 weights are multiplied at the fp16 rate (312e12)
    assert CostModelExecutor(fp8, A100, CostParams(**IDEAL)).layer_linear_time(8192) == pytest.approx(
        flops / 312e12, rel=1e-9)
    # decode stays bound by the weights' bytes, one a parameter in fp8: 317,194,240 bytes / 3.35e12 B/s
    assert exe.layer_linear_time(1) == pytest.approx(317_194_240 / 3.35e12, rel=1e-3)


def test_an_fp8_kv_cache_halves_the_bytes_decode_attention_reads():
    # Llama-2-13B's KV in fp16 is 819,200 bytes a token (the seed); in fp8 409,600. One decode token at
    # context 100 reads 101 tokens' K and V, the weights and Q/O stay in fp16.
    fp8_kv = L13.model_copy(update={"kv_dtype": "fp8"})
    assert fp8_kv.kv_bytes_per_token() == 409_600 and fp8_kv.weight_bytes() == L13.weight_bytes()
    r16 = _exe().execute(_plan((1, 100)))
    r8 = CostModelExecutor(fp8_kv, A100, CostParams(**IDEAL)).execute(_plan((1, 100)))
    assert r8.breakdown["linear"] == r16.breakdown["linear"]
    kv_read = 101 * 409_600 / 2039e9
    assert kv_read < r8.breakdown["attention"] < kv_read * 1.10
    # what the fp8 cache saves is exactly half of the fp16 cache's K and V traffic: the 101 tokens read and
    # the new token's K and V written (2 x 5,120 elements a layer, 40 layers)
    saved = r16.breakdown["attention"] - r8.breakdown["attention"]
    assert saved == pytest.approx((101 * 819_200 - 101 * 409_600) / 2039e9 + 40 * 2 * 5120 / 2039e9, rel=1e-9)
