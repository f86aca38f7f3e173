"""Quantized weights against a public measurement: the time int8 and int4 weights save on Llama-3.1-8B.

    PYTHONPATH=. python scripts/quantized_latency_check.py

The measurement: vLLM pull request 23197 (Marlin kernels for RTN quantization, August 2025), whose
description times `benchmark_latency.py` on one H100 for Llama-3.1-8B: a batch of B prompts of 256 tokens,
32 output tokens each, the whole batch's latency in seconds (bf16, then int8 and int4 weights through
Marlin). kvsim replays the same batch (every request at t = 0, no frontend) with the model's weights in
bf16 (fp16: the same bytes), int8 and int4, and prints each latency, and the time each quantization saves
against bf16, measured and predicted. The savings are compared rather than the latencies: the runs predate
vLLM 0.15, whose engine kvsim is calibrated to (an older engine's fixed costs per step are in both of its
latencies and cancel in their difference). Nothing here is fitted to these figures.
"""

from __future__ import annotations

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

BATCHES = (1, 4, 8, 16)
# seconds, from the pull request's table ("new RTN" rows for int8 and int4)
MEASURED = {"bf16": (0.236, 0.260, 0.284, 0.336), "int8": (0.186, 0.231, 0.248, 0.300),
            "int4": (0.154, 0.194, 0.216, 0.267)}


def predicted(weights: str, batch: int) -> float:
    model = {"name": "llama-3.1-8b"} | ({} if weights == "bf16" else {"weight_dtype": weights})
    data = {"model": model, "hardware": "h100-80gb", "frontend": {"enabled": False}, "output": {"plots": False},
            "workload": {"requests": [{"arrival": 0.0, "prompt_len": 256, "output_len": 32}] * batch}}
    return run_scenario(scenario_from_dict(data)).summary["makespan_s"]


def main() -> None:
    pred = {w: [predicted(w, b) for b in BATCHES] for w in MEASURED}
    print(f"{'batch':>5} " + " ".join(f"{w + ' meas/pred':>18}" for w in MEASURED)
          + " " + " ".join(f"{w + ' saved meas/pred':>24}" for w in ("int8", "int4")))
    for i, b in enumerate(BATCHES):
        cells = [f"{MEASURED[w][i]:8.3f} /{pred[w][i]:7.3f} s" for w in MEASURED]
        saved = []
        for w in ("int8", "int4"):
            m = MEASURED["bf16"][i] - MEASURED[w][i]
            p = pred["bf16"][i] - pred[w][i]
            saved.append(f"{m:7.3f} /{p:7.3f} s ({p / m - 1:+5.0%})")
        print(f"{b:>5} " + " ".join(f"{c:>18}" for c in cells) + " " + " ".join(f"{s:>24}" for s in saved))


if __name__ == "__main__":
    main()
