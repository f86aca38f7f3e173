"""DeepSeek's latent attention and the whole model against public measurements, fitted to none of them.

    PYTHONPATH=. python scripts/deepseek_latency_check.py

1. The decode attention kernel. FlashMLA (deepseek-ai/FlashMLA issue 19, its first release on one H100):
   128 decodes of about 4,096 cached tokens, one latent of 576 (values 512) a token, bf16, 16 / 32 / 64
   query heads (DeepSeek-V3 at TP 8 / 4 / 2): 0.215 / 0.218 / 0.223 ms a layer (2,826 GB/s at 16 heads).
   vLLM pull request 27363 ("Hopper", 64-token blocks, fp16 cache): 128 decodes of 1,024 tokens at 16
   heads, 84 us with FlashMLA, 71 us with FlashAttention's MLA kernel. kvsim prices one layer's decode
   attention of the same batch with the shipped H100 engine terms (its KV reads at the efficiency fitted to
   Llama runs, with each sequence's fixed cost).
2. The whole model. dstack's benchmark of DeepSeek-R1 on eight H200s (github.com/dstackai/benchmarks,
   Deepseek-R1, March 2025; vLLM 0.7.4, its V0 engine, FlashMLA, TP 8): 500 prompts of 3,200 random tokens
   and 800 output tokens at 4 to 128 in flight (SGLang's bench_serving), mean TTFT and TPOT and output
   tokens a second. kvsim replays it (a closed-loop client of that many slots) with the shipped H200
   calibration, which is vLLM 0.15.1's engine on Llama models: an older engine, and an untimed fp8 MoE and
   MLA path, so this shows how far the prediction is, not what it should be.
"""

from __future__ import annotations

from sim.executors.cost_model import make_cost_model_executor
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

# (batch, context, heads a GPU, measured seconds a layer, source)
KERNEL = [(128, 4096, 16, 0.215e-3, "FlashMLA #19"), (128, 4096, 32, 0.218e-3, "FlashMLA #19"),
          (128, 4096, 64, 0.223e-3, "FlashMLA #19"), (128, 1024, 16, 84e-6, "vLLM #27363 FlashMLA"),
          (128, 1024, 16, 71e-6, "vLLM #27363 FA-MLA")]
# in flight: (mean TTFT s, mean TPOT s, output tok/s), dstack's raw_data/online_results.csv (vLLM rows)
SERVING = {4: (0.97565, 0.02573, 148.58), 8: (1.76575, 0.03128, 237.59), 16: (3.36861, 0.04960, 294.07),
           32: (7.65078, 0.05167, 512.86), 64: (14.16437, 0.06562, 758.38), 128: (66.81162, 0.07186, 744.78)}


def kernel_s(batch: int, context: int, heads: int) -> float:
    """kvsim's decode attention of one layer: DeepSeek-V3 (bf16 cache) at the TP that leaves ``heads`` a GPU."""
    tp = 128 // heads
    model = ModelSpec.from_name("deepseek-v3")
    exe = make_cost_model_executor(model=model, hardware=HardwareSpec.from_name("h100-80gb").model_copy(
        update={"tensor_parallel": tp}))
    plan = StepPlan(scheduled=[ScheduledRequest(i, 1, context - 1, []) for i in range(batch)])
    return exe.execute(plan).breakdown["attention"] / model.num_layers


def serving(in_flight: int) -> tuple[float, float, float]:
    data = {"model": "deepseek-ai/DeepSeek-R1", "hardware": {"name": "h200-141gb", "tensor_parallel": 8},
            "kv_cache": {"block_size": 64}, "output": {"plots": False},
            "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "chunked_prefill": True},
            "workload": {"max_concurrency": in_flight, "synthetic": {
                "num_requests": 500, "arrival": {"process": "burst"},
                "prompt_len": {"dist": "fixed", "value": 3200}, "output_len": {"dist": "fixed", "value": 800}}}}
    res = run_scenario(scenario_from_dict(data))
    return float(res.requests["ttft_s"].mean()), float(res.requests["tpot_s"].mean()), \
        float(res.summary["output_throughput_tok_s"])


def main() -> None:
    print("decode attention, one layer (H100)")
    print(f"{'batch':>5} {'context':>7} {'heads':>5} {'measured':>10} {'kvsim':>10} {'error':>7}  source")
    for batch, context, heads, measured, source in KERNEL:
        pred = kernel_s(batch, context, heads)
        print(f"{batch:>5} {context:>7} {heads:>5} {measured * 1e6:>8.0f}us {pred * 1e6:>8.0f}us "
              f"{pred / measured - 1:>+7.0%}  {source}")
    print("\nDeepSeek-R1 on 8 x H200, 3,200 in / 800 out (dstack, vLLM 0.7.4 V0)")
    print(f"{'in flight':>9} {'TTFT meas/kvsim':>20} {'TPOT meas/kvsim':>22} {'out tok/s meas/kvsim':>22}")
    for n, (ttft, tpot, tok_s) in SERVING.items():
        p_ttft, p_tpot, p_tok = serving(n)
        print(f"{n:>9} {ttft:>8.2f} /{p_ttft:>6.2f} s {tpot * 1e3:>8.1f} /{p_tpot * 1e3:>6.1f} ms "
              f"{tok_s:>10.0f} /{p_tok:>7.0f} ({p_tok / tok_s:.1f}x)")


if __name__ == "__main__":
    main()
