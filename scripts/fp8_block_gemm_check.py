"""Block-quantized fp8 GEMMs against a public kernel measurement: one of DeepSeek-V3's projections on an H100.

    PYTHONPATH=. python scripts/fp8_block_gemm_check.py

The measurement: vLLM pull request 23280 (upstream CUTLASS for the SM90 block-fp8 kernel, September 2025),
whose description benchmarks DeepSeek-V3's N = 2,112, K = 7,168 GEMM (its fused q_a / kv_a projection) on
an H100 80GB HBM3 in TFLOP/s at M = 1 to 8,192 tokens: torch's bf16 GEMM, and the W8A8 fp8 GEMM with
128 x 128 weight blocks (DeepSeek's checkpoints are quantized so) through vLLM's Triton and CUTLASS kernels.
Each figure is turned into microseconds (2 M N K flops / the TFLOP/s) and set beside kvsim's price of the
same GEMM (``CostModelExecutor.gemm_s``, the shipped H100 calibration) for the model in bf16 and in fp8.
Nothing is fitted to these figures.

What it shows (2026-12-07): kvsim's bf16 price is within -3% to +32% of torch's (a shape no shipped table
holds); its fp8 price, the fp16 kernels' fitted efficiency at the H100's fp8 rate over half the bytes, is
2.4-4.5x below the CUTLASS block-fp8 kernel's time and 2.6-3.7x below the Triton one's: vLLM's block-scaled
fp8 GEMMs ran slower than bf16 at every M measured (1.4-3.6x), where kvsim prices them faster.
"""

from __future__ import annotations

from sim.executors.cost_model import make_cost_model_executor
from sim.scenario import scenario_from_dict

N, K = 2112, 7168
M = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# TFLOP/s, from the pull request's table "BF16 vs W8A8 Block FP8 GEMMs" (block_size (128, 128), H100)
MEASURED = {
    "bf16": (3.059, 49.60, 163.5, 275.7, 401.9, 566.3, 619.8, 648.2, 715.8, 666.4),
    "fp8 triton": (1.298, 20.76, 63.66, 118.3, 219.3, 305.2, 366.8, 396.0, 403.0, 406.5),
    "fp8 cutlass": (0.8931, 13.94, 55.79, 106.5, 192.5, 322.3, 350.6, 426.6, 456.9, 489.7),
}


def executor(dtype: str):
    """The shipped H100 cost model of DeepSeek-V3 with its weights in ``dtype``."""
    scn = scenario_from_dict({"model": {"name": "deepseek-v3", "dtype": dtype},
                              "hardware": {"name": "h100-80gb", "tensor_parallel": 8},
                              "workload": {"requests": [{"arrival": 0.0, "prompt_len": 8, "output_len": 2}]},
                              "output": {"plots": False}})
    return make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                    kv=scn.kv_cache, scheduler=scn.scheduler)


def main() -> None:
    bf16, fp8 = executor("bf16"), executor("fp8")
    print(f"DeepSeek-V3 GEMM N={N} K={K} on an H100, microseconds (measured: vLLM pull request 23280)")
    print(f"{'M':>5} {'bf16 meas':>10} {'kvsim':>7} {'fp8 cutlass':>12} {'fp8 triton':>11} {'kvsim fp8':>10} "
          f"{'cutlass / kvsim':>16}")
    for i, m in enumerate(M):
        us = {name: 2 * m * N * K / (rates[i] * 1e12) * 1e6 for name, rates in MEASURED.items()}
        ours16, ours8 = bf16.gemm_s(m, N, K) * 1e6, fp8.gemm_s(m, N, K) * 1e6
        print(f"{m:>5} {us['bf16']:>10.1f} {ours16:>7.1f} {us['fp8 cutlass']:>12.1f} {us['fp8 triton']:>11.1f} "
              f"{ours8:>10.1f} {us['fp8 cutlass'] / ours8:>15.2f}x")


if __name__ == "__main__":
    main()
