"""Speculative decoding against a public measurement: EAGLE and EAGLE-3 heads on Llama-3.1-8B, one request at a time.

    PYTHONPATH=. python scripts/speculative_latency_check.py

The measurement: vLLM issue 20780 (July 2025), which tables the mean acceptance length (AL) and the time per
output token (TPOT) of vLLM V1 on MT-Bench for Llama-3.1-8B-Instruct at batch size 1, without drafts and
with the yuhuili EAGLE and EAGLE-3 heads at k = 2 to 7 drafts a step. The issue does not name the GPU; its
author's earlier figures for the same model and benchmark (vLLM pull request 16937) were taken on an H100,
which kvsim prices here. kvsim replays requests one at a time (a client of one slot, no frontend), prompts of
100 tokens and outputs of 300 (MT-Bench's order of magnitude), each head with ``mean_acceptance_length`` set
to the measured AL for its k, and prints the TPOT measured and predicted, and each k's speed-up over decoding
without drafts: the speed-ups are the figures to compare, since the engine the issue ran predates vLLM 0.15,
whose fixed costs per step kvsim is calibrated to (they are in every TPOT and mostly cancel in a ratio).
Nothing here is fitted to these figures.
"""

from __future__ import annotations

from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

KS = (2, 3, 4, 5, 6, 7)
# from the tables: AL per k, TPOT in ms at batch size 1
AL = {"eagle": (2.10, 2.29, 2.39, 2.43, 2.45, 2.47), "eagle3": (2.36, 2.79, 3.08, 3.32, 3.46, 3.54)}
TPOT_MS = {"none": 7.07, "eagle": (4.37, 4.29, 4.48, 4.71, 4.94, 5.20), "eagle3": (4.32, 4.09, 4.05, 4.13, 4.20, 4.29)}


def predicted_tpot_ms(method: str | None = None, k: int = 0, al: float = 0.0) -> float:
    data = {"model": "llama-3.1-8b", "hardware": "h100-80gb", "frontend": {"enabled": False},
            "output": {"plots": False},
            "workload": {"synthetic": {"num_requests": 20, "arrival": {"process": "burst"},
                                       "prompt_len": {"dist": "fixed", "value": 100},
                                       "output_len": {"dist": "fixed", "value": 300}},
                         "max_concurrency": 1}}
    if method is not None:
        data["speculative"] = {"method": method, "num_speculative_tokens": k, "mean_acceptance_length": al}
    return 1e3 * run_scenario(scenario_from_dict(data)).summary["tpot_s"]["mean"]


def main() -> None:
    base = predicted_tpot_ms()
    print(f"no drafts: TPOT {TPOT_MS['none']:.2f} ms measured, {base:.2f} ms predicted")
    print(f"{'method':>7} {'k':>2} {'AL':>5} {'TPOT meas/pred (ms)':>20} {'speed-up meas/pred':>20} {'error':>6}")
    for method in ("eagle", "eagle3"):
        for i, k in enumerate(KS):
            pred = predicted_tpot_ms(method, k, AL[method][i])
            meas = TPOT_MS[method][i]
            up_m, up_p = TPOT_MS["none"] / meas, base / pred
            print(f"{method:>7} {k:>2} {AL[method][i]:5.2f} {meas:9.2f} /{pred:6.2f}   {up_m:10.2f}x /{up_p:5.2f}x "
                  f"{up_p / up_m - 1:+6.0%}")


if __name__ == "__main__":
    main()
