"""kvsim against GPUStack's public vLLM benchmarks on H100 and A100, fitted to none of them.

    PYTHONPATH=. python scripts/gpustack_benchmark_check.py

GPUStack's performance lab (github.com/gpustack/gpustack, docs/performance-lab/; `vllm bench serve`, every
prompt sent at once unless a concurrency is given):

- gpt-oss-120b (gpt-oss-120b/h100.md; vLLM 0.10.2): on one H100 (`vllm serve openai/gpt-oss-120b
  --max-model-len 32768`, no async scheduling) and on two (`--async-scheduling -tp 2`), random prompts of
  32,000, 4,000, 2,000 and 128 tokens, and 100 ShareGPT conversations four at a time.
- Qwen3-8B (qwen3-8b/h100-latency.md; vLLM 0.11.0, `vllm serve Qwen/Qwen3-8B`, no async scheduling): 100
  ShareGPT conversations four at a time.
- Qwen3-14B on one A100 (qwen3-14b/a100.md; vLLM 0.11.0, `vllm serve Qwen/Qwen3-14B`, taken as the 80 GB
  one, whose calibration kvsim ships): random prompts of 32,000, 4,000, 2,000 and 128 tokens. No engine run
  on an A100 is among the calibration's measurements, so these are its first end-to-end check.
- DeepSeek-R1-0528 on eight H200s (deepseek-r1/h200.md; vLLM 0.11.0, `vllm serve deepseek-ai/DeepSeek-R1-0528
  -tp 8`: fp8 block-quantized weights, latent attention in 64-token blocks, no async scheduling): random
  prompts of 32,000, 4,000, 2,000 and 128 tokens, and 100 ShareGPT conversations four at a time.

kvsim replays each with the mean prompt and output lengths the benchmark printed (gpt-oss stops at its end
token, so its outputs are shorter than asked), vLLM's serving defaults (8,192 batched tokens, 1,024
sequences, chunked prefill, prefix caching) and the shipped H100 calibration, which is vLLM 0.15.1's engine
on dense Llama models. gpt-oss's MXFP4 expert kernels and attention sinks are not timed: its experts read
4.25 bits an element at the fused MoE kernel's fitted efficiency.
"""

from __future__ import annotations

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

# case: (model, requests, mean prompt, mean output, concurrency or None,
#        {GPUs: (duration s, mean TTFT s, mean TPOT s)} measured); on H100s unless HARDWARE says otherwise
CASES = {
    "gpt-oss-120b, random 32K": ("openai/gpt-oss-120b", 100, 32000, 98.77, None,
                                 {1: (198.92, 99.444, 0.02399), 2: (98.86, 48.826, 0.22032)}),
    "gpt-oss-120b, random 4K": ("openai/gpt-oss-120b", 500, 3998.5, 134.41, None,
                                {1: (145.04, 72.955, 0.03170), 2: (59.94, 29.487, 0.16473)}),
    "gpt-oss-120b, random 2K": ("openai/gpt-oss-120b", 500, 1998.24, 98.39, None,
                                {1: (72.87, 36.235, 0.04135), 2: (30.75, 15.292, 0.13932)}),
    "gpt-oss-120b, random 128": ("openai/gpt-oss-120b", 1000, 127.755, 4.0, None,
                                 {1: (7.72, 4.850, 0.30480), 2: (4.18, 2.800, 0.18305)}),
    "gpt-oss-120b, ShareGPT x4": ("openai/gpt-oss-120b", 100, 229.46, 216.91, 4,
                                  {1: (47.88, 0.04900, 0.00831), 2: (33.60, 0.03751, 0.00575)}),
    "Qwen3-8B, ShareGPT x4": ("Qwen/Qwen3-8B", 100, 232.6, 220.61, 4, {1: (44.40, 0.06400, 0.00738)}),
    "Qwen3-14B A100, random 32K": ("Qwen/Qwen3-14B", 100, 32000, 98.91, None, {1: (724.56, 359.648, 0.44558)}),
    "Qwen3-14B A100, random 4K": ("Qwen/Qwen3-14B", 500, 3995.88, 199.57, None, {1: (407.05, 197.625, 0.25461)}),
    "Qwen3-14B A100, random 2K": ("Qwen/Qwen3-14B", 500, 1996.35, 100.0, None, {1: (175.66, 86.908, 0.30173)}),
    "Qwen3-14B A100, random 128": ("Qwen/Qwen3-14B", 1000, 127.698, 4.0, None, {1: (26.79, 19.451, 0.23335)}),
    "DeepSeek-R1 H200, random 32K": ("deepseek-ai/DeepSeek-R1-0528", 100, 31999.0, 100.0, None,
                                     {8: (206.90, 101.352, 0.36579)}),
    "DeepSeek-R1 H200, random 4K": ("deepseek-ai/DeepSeek-R1-0528", 500, 3995.06, 200.0, None,
                                    {8: (132.68, 63.059, 0.16423)}),
    "DeepSeek-R1 H200, random 2K": ("deepseek-ai/DeepSeek-R1-0528", 500, 1996.786, 100.0, None,
                                    {8: (59.26, 28.912, 0.23702)}),
    "DeepSeek-R1 H200, random 128": ("deepseek-ai/DeepSeek-R1-0528", 1000, 126.882, 4.0, None,
                                     {8: (22.07, 19.392, 0.35183)}),
    "DeepSeek-R1 H200, ShareGPT x4": ("deepseek-ai/DeepSeek-R1-0528", 100, 228.36, 213.38, 4,
                                      {8: (108.42, 0.12330, 0.01936)}),
}
HARDWARE = {name: "a100-80gb" for name in CASES if " A100," in name}
HARDWARE.update({name: "h200-141gb" for name in CASES if " H200," in name})
# how each model was served where it differs from the defaults below: its context, its KV blocks (FlashMLA's 64
# tokens), async scheduling (the DeepSeek runs were served without it at TP 8)
SERVED = {"DeepSeek-R1": {"max_model_len": 163840, "block_size": 64, "async_scheduling": False}}


def predict(model: str, requests: int, prompt: float, output: float, concurrency: int | None, tp: int,
            hardware: str = "h100-80gb") -> tuple[float, float, float]:
    """kvsim's (duration, mean TTFT, mean TPOT) of one case on ``tp`` GPUs (one: without async scheduling, as
    the benchmarks' single-GPU runs were served; two: with it)."""
    served = next((v for k, v in SERVED.items() if k in model), {})
    data = {"name": "gpustack", "model": model, "hardware": {"name": hardware, "tensor_parallel": tp},
            "kv_cache": {"prefix_caching": True, "block_size": served.get("block_size", 16)}, "output": {"plots": False},
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 8192, "max_num_seqs": 1024,
                          "async_scheduling": served.get("async_scheduling", tp > 1)},
            "workload": {"max_model_len": served.get("max_model_len", 40960 if "Qwen3" in model else 32768), "synthetic": {
                "num_requests": requests, "arrival": {"process": "burst"},
                "prompt_len": {"dist": "fixed", "value": round(prompt)},
                "output_len": {"dist": "fixed", "value": max(1, round(output))}}}}
    if concurrency:
        data["workload"]["max_concurrency"] = concurrency
    s = run_scenario(scenario_from_dict(data)).summary
    return s["makespan_s"], s["ttft_s"]["mean"], s["tpot_s"]["mean"]


def main() -> None:
    print(f"{'case':<28}{'GPUs':>5}  {'duration s':>21}  {'mean TTFT s':>23}  {'mean TPOT ms':>22}")
    for name, (model, n, prompt, output, conc, measured) in CASES.items():
        for tp, (dur, ttft, tpot) in measured.items():
            p_dur, p_ttft, p_tpot = predict(model, n, prompt, output, conc, tp, HARDWARE.get(name, "h100-80gb"))
            print(f"{name:<28}{tp:>5}  {dur:>7.2f} {p_dur:>7.2f} {p_dur / dur - 1:+6.0%}  "
                  f"{ttft:>7.3f} {p_ttft:>7.3f} {p_ttft / ttft - 1:+6.0%}  "
                  f"{tpot * 1e3:>6.2f} {p_tpot * 1e3:>6.2f} {p_tpot / tpot - 1:+6.0%}")


if __name__ == "__main__":
    main()
