"""Fit the engine-level step terms and the frontend latency to measured serving runs.

    python scripts/fit_engine.py [--runs sim/data/ground_truth/vllm_h100_runs.csv] [--hardware h100-80gb]
                                 [--duration 120] [--write]

Fitted (everything else keeps its documented prior, sim/executors/engine_params.py):
    graph_kernel_s       one kernel inside a replayed CUDA graph
    step_gap_s           the per-step cost that nothing hides
    attn_kv_read_eff     the paged decode kernel's share of HBM bandwidth at long context
    custom_ar_latency_s  one custom all-reduce (TP > 1)
    frontend latency     input + output, split half and half (the client's figures cannot tell them apart)

Loss: the sum over stages of squared log errors of mean decode time per token, mean E2E and (half
weight) mean TTFT, each stage replayed for ``--duration`` seconds (same rate) with seed 0 by
``kvsim fidelity``'s own replay (sim/fidelity). Nelder-Mead (scipy) from the priors. ``--write`` stores
the result in the hardware's shipped calibration (section ``engine``) and prints the frontend default
to put in sim/scenario.py.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from sim.executors.cost_model import shipped_calibration
from sim.executors.engine_params import EngineParams
from sim.fidelity.evaluate import evaluate
from sim.fidelity.runs import read_runs

ROOT = Path(__file__).resolve().parents[1]
# name, scale (x = value / scale), lower bound, upper bound
FREE = [("graph_kernel_s", 1e-6, 0.0, 8e-6), ("step_gap_s", 1e-4, 0.0, 3e-3),
        ("attn_kv_read_eff", 1.0, 0.4, 1.0), ("custom_ar_latency_s", 1e-5, 2e-6, 6e-5),
        ("frontend_s", 1e-2, 0.0, 0.05)]


def _values(x: np.ndarray) -> dict[str, float]:
    return {name: float(np.clip(v * scale, lo, hi)) for (name, scale, lo, hi), v in zip(FREE, x)}


def loss_of(stages, doc: dict, values: dict[str, float], duration: float, tmp: Path) -> tuple[float, list]:
    engine = EngineParams.from_dict(doc["engine"])
    for name, v in values.items():
        if name != "frontend_s":
            setattr(engine, name, v)
    calib = dict(doc, engine=engine.to_dict())
    path = tmp / "calib.json"
    path.write_text(json.dumps(calib))
    half = values["frontend_s"] / 2
    overrides = [f"executor.calibration={path}", f"frontend.input_latency_s={half}",
                 f"frontend.output_latency_s={half}"]
    results = evaluate(stages, [0], overrides=overrides, max_duration_s=duration)
    total = 0.0
    for r in results:
        for metric, w in (("decode_per_token", 1.0), ("e2e_mean", 1.0), ("ttft_mean", 0.5)):
            pred, meas = r.predicted(metric), r.stage.measured[metric]
            total += w * (math.log(pred / meas) ** 2 if pred > 0 and math.isfinite(pred) else 100.0)
    return total, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "sim/data/ground_truth/vllm_h100_runs.csv"))
    ap.add_argument("--hardware", default="h100-80gb")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--maxiter", type=int, default=120)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    stages = read_runs(args.runs)
    calib_path = shipped_calibration(args.hardware)
    doc = json.loads(calib_path.read_text())
    doc.setdefault("engine", EngineParams().to_dict())
    from sim.scenario import FrontendConfig

    fe = FrontendConfig()
    prior = {**doc["engine"], "frontend_s": fe.input_latency_s + fe.output_latency_s}
    x0 = np.array([prior[name] / scale for name, scale, _, _ in FREE])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        calls = [0]

        def f(x: np.ndarray) -> float:
            calls[0] += 1
            value, _ = loss_of(stages, doc, _values(x), args.duration, Path(tmp))
            print(f"{calls[0]:4d} {time.perf_counter() - t0:7.1f}s loss {value:.5f} "
                  + " ".join(f"{k}={v:.4g}" for k, v in _values(x).items()), flush=True)
            return value

        best = minimize(f, x0, method="Nelder-Mead", options={"maxfev": args.maxiter, "xatol": 1e-3, "fatol": 1e-5})
        values = _values(best.x)
        _, results = loss_of(stages, doc, values, args.duration, Path(tmp))
    print("fitted:", json.dumps(values, indent=1))
    for r in results:
        print(f"{r.stage.run} stage {r.stage.stage}: " + ", ".join(
            f"{m} {r.error(m):+.1%}" for m in ("decode_per_token", "e2e_mean", "ttft_mean", "e2e_p90")))
    if args.write:
        for name, v in values.items():
            if name != "frontend_s":
                doc["engine"][name] = v
        calib_path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {calib_path}; frontend latency {values['frontend_s']:.6f} s: set FRONTEND_INPUT_S and "
              f"FRONTEND_OUTPUT_S in sim/scenario.py to {values['frontend_s'] / 2:.6f}")


if __name__ == "__main__":
    main()
