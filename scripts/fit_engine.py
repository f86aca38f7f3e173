"""Fit the engine-level step terms and the frontend latency to measured serving runs.

    pip install -e ".[fit]"   # scipy
    python scripts/fit_engine.py [--runs sim/data/ground_truth/vllm_h100_runs.csv] [--hardware h100-80gb]
                                 [--write]
    python scripts/fit_engine.py --cross-validate [--hold-out RUN ...] [--seeds 3] [--workers N] [--verbose]

1. Step terms, at each stage's steady state (sim/fidelity/steady.py: Little's law batch, contexts spread
   over the decode, the share of mixed steps): least squares on log(predicted / measured) mean decode
   time per token over every stage, plus a weak pull towards the documented priors (a prior's relative
   width in PRIORS), so that terms the runs cannot tell apart stay where physics puts them. Free:
       graph_kernel_s       one kernel inside a replayed CUDA graph
       step_gap_s           the per-step cost that nothing hides
       attn_kv_read_eff     the paged decode kernel's share of HBM bandwidth at long context
       custom_ar_latency_s  one custom all-reduce between 2 GPUs
       custom_ar_peer_s     its growth per GPU beyond 2 (the TP 2 and TP 4 runs identify the two)
       custom_ar_eff        its share of NVLink bandwidth
   Then ``--refine`` times: every run is replayed (seed 0, frontend off) and each stage's ratio of
   replayed to steady-state decode time (batch fluctuations, mixed steps, async admission) multiplies
   its steady-state estimate in a refit.
2. Frontend latency: every run replayed once (seed 0, --duration seconds a stage) with the frontend
   off; the latency is the median over stages of measured minus predicted mean TTFT (a frontend delay
   adds to TTFT one for one), split half input, half output (client figures cannot tell them apart).

Nelder-Mead (scipy). ``--write`` stores the terms in the hardware's shipped calibration (section
``engine``) and the frontend latency in sim/data/frontend.json (the scenario defaults).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from sim.executors.cost_model import CostModelExecutor, load_calibration, shipped_calibration
from sim.executors.engine_params import EngineParams, graph_max_tokens_for
from sim.executors.validation import calibration_json
from sim.fidelity.evaluate import evaluate
from sim.fidelity.goals import check_goals
from sim.fidelity.report import text_table
from sim.fidelity.runs import MeasuredStage, group_runs, read_runs
from sim.fidelity.steady import steady_step
from sim.specs import HardwareSpec, ModelSpec

ROOT = Path(__file__).resolve().parents[1]
# name: (prior, relative width of the prior, lower, upper)
PRIORS = {"graph_kernel_s": (1.5e-6, 1.0, 0.0, 8e-6), "step_gap_s": (1e-4, 3.0, 0.0, 3e-3),
          "attn_kv_read_eff": (0.85, 0.15, 0.4, 1.0), "custom_ar_latency_s": (8e-6, 1.0, 2e-6, 6e-5),
          "custom_ar_peer_s": (2e-6, 2.0, 0.0, 3e-5), "custom_ar_eff": (0.5, 0.5, 0.2, 1.0)}
NAMES = list(PRIORS)
CV_METRICS = ["ttft_mean", "e2e_mean", "e2e_p90", "decode_per_token", "req_per_s"]


@functools.cache
def _params(hardware: str):
    return load_calibration(hardware)[0]   # read once: the fit prices thousands of parameter sets


def executor_for(stage: MeasuredStage, hardware: str, engine: EngineParams) -> CostModelExecutor:
    params = _params(hardware)
    hw = HardwareSpec.from_name(stage.hardware).model_copy(update={"tensor_parallel": stage.tensor_parallel})
    model = ModelSpec.from_name(stage.model).model_copy(update={"max_model_len": stage.max_model_len})
    eng = EngineParams.from_dict(engine.to_dict())
    eng.graph_max_tokens = min(eng.graph_max_tokens, graph_max_tokens_for(stage.max_num_seqs))
    return CostModelExecutor(model, hw, params, 16, eng)


def with_values(base: EngineParams, values: dict[str, float]) -> EngineParams:
    eng = EngineParams.from_dict(base.to_dict())
    for k, v in values.items():
        setattr(eng, k, v)
    return eng


def decode_errors(stages, hardware: str, engine: EngineParams, bias: list[float] | None = None) -> list[float]:
    """log(predicted / measured) mean decode time per token, per stage, at the steady state (times the
    stage's simulation/steady-state ratio ``bias`` when given)."""
    bias = bias or [1.0] * len(stages)
    return [math.log(steady_step(executor_for(s, hardware, engine), s)[0] * b / s.measured["decode_per_token"])
            for s, b in zip(stages, bias)]


def simulated_bias(stages, doc: dict, engine: EngineParams, hardware: str, duration: float, tmp: Path) -> list[float]:
    """Per stage: the replayed decode time per token over the steady-state estimate, with ``engine``."""
    tmp.write_text(json.dumps(dict(doc, engine=engine.to_dict())))
    results = evaluate(stages, [0], overrides=[f"executor.calibration={tmp}", "frontend.enabled=false"],
                       max_duration_s=duration)
    steady = [steady_step(executor_for(s, hardware, engine), s)[0] for s in stages]
    return [r.predicted("decode_per_token") / st for r, st in zip(results, steady)]


def fit_step_terms(stages, hardware: str, base: EngineParams, bias: list[float] | None = None) -> dict[str, float]:
    def unpack(x):
        return {n: float(np.clip(v * PRIORS[n][0], PRIORS[n][2], PRIORS[n][3])) for n, v in zip(NAMES, x)}

    def loss(x):
        values = unpack(x)
        err = decode_errors(stages, hardware, with_values(base, values), bias)
        pull = sum(((values[n] - PRIORS[n][0]) / (PRIORS[n][0] * PRIORS[n][1])) ** 2 for n in NAMES)
        return sum(e * e for e in err) + 1e-3 * pull

    x0 = np.ones(len(NAMES))
    best = minimize(loss, x0, method="Nelder-Mead",
                    options={"maxfev": 4000, "xatol": 1e-4, "fatol": 1e-9, "initial_simplex":
                             np.vstack([x0, x0 + 0.5 * np.eye(len(NAMES))])})
    return unpack(best.x)


def fit_frontend(stages, overrides_calib: Path, duration: float, say=print) -> float:
    results = evaluate(stages, [0], overrides=[f"executor.calibration={overrides_calib}", "frontend.enabled=false"],
                       max_duration_s=duration)
    gaps = [r.stage.measured["ttft_mean"] - r.predicted("ttft_mean") for r in results]
    say("measured - engine-only TTFT per stage (ms):", " ".join(f"{g * 1e3:.1f}" for g in gaps))
    return max(0.0, float(np.median(gaps)))


def fit(stages, hardware: str, doc: dict, base: EngineParams, duration: float, refine: int,
        tmp: Path, say=print) -> tuple[EngineParams, float]:
    """(engine terms, frontend latency) fitted to ``stages``: steps 1 and 2 of the module docstring."""
    say("priors:     ", " ".join(f"{e:+.1%}" for e in decode_errors(stages, hardware, base)))
    values = fit_step_terms(stages, hardware, base)
    engine = with_values(base, values)
    say("fitted:     ", json.dumps(values))
    say("steady-state decode/token errors:", " ".join(f"{e:+.1%}" for e in decode_errors(stages, hardware, engine)))
    for i in range(refine):   # the steady state misses batch fluctuations: correct by replays
        bias = simulated_bias(stages, doc, engine, hardware, duration, tmp)
        values = fit_step_terms(stages, hardware, base, bias)
        engine = with_values(base, values)
        say(f"refined {i + 1}: replay/steady {' '.join(f'{b:.3f}' for b in bias)}; "
            f"errors {' '.join(f'{e:+.1%}' for e in decode_errors(stages, hardware, engine, bias))}")
    say("fitted:     ", json.dumps(values))
    tmp.write_text(json.dumps(dict(doc, engine=engine.to_dict())))
    try:
        frontend = fit_frontend(stages, tmp, duration, say)
    finally:
        tmp.unlink()
    say(f"frontend latency: {frontend * 1e3:.2f} ms (input {frontend / 2 * 1e3:.2f} + output {frontend / 2 * 1e3:.2f})")
    return engine, frontend


def cross_validate(stages, hardware: str, doc: dict, base: EngineParams, args, tmp: Path) -> None:
    """Leave one run out: fit on the other runs, replay the one left out with those terms and frontend,
    and print its errors and goals as ``kvsim fidelity`` does (the terms the left-out run alone would
    identify fall back towards their priors: the TP 2 and TP 4 runs are the only ones that see the
    custom all-reduce)."""
    runs = list(group_runs(stages))
    held = args.hold_out or runs
    unknown = sorted(set(held) - set(runs))
    if unknown:
        raise SystemExit(f"error: --hold-out: no run {unknown[0]!r} in {args.runs} (runs: {', '.join(runs)})")
    rows = []
    for name in held:
        train = [s for s in stages if s.run != name]
        print(f"== {name} left out: fitting on {len(train)} stages of {len(runs) - 1} runs")
        engine, frontend = fit(train, hardware, doc, base, args.duration, args.refine, tmp,
                               say=print if args.verbose else lambda *a: None)
        print("fitted:", json.dumps({n: getattr(engine, n) for n in NAMES}), f"frontend {frontend * 1e3:.2f} ms")
        tmp.write_text(json.dumps(dict(doc, engine=engine.to_dict())))
        try:
            results = evaluate([s for s in stages if s.run == name], list(range(args.seeds)),
                               overrides=[f"executor.calibration={tmp}",
                                          f"frontend.input_latency_s={frontend / 2}",
                                          f"frontend.output_latency_s={frontend / 2}"],
                               workers=args.workers)
        finally:
            tmp.unlink()
        print(text_table(results))
        goals = check_goals(results)
        print(f"goals met on the left-out run: {sum(g['ok'] for g in goals)} of {len(goals)}")
        for g in goals:
            if not g["ok"]:
                print(f"  missed: stage {g['stage']}: {g['goal']} ({g['value']:+.1%})")
        rows.extend(dict(run=r.stage.run, stage=r.stage.stage, **{m: r.error(m) for m in CV_METRICS})
                    for r in results)
    print("\nleft-out runs, signed error of each prediction:")
    print(pd.DataFrame(rows).to_string(index=False, formatters={m: "{:+.1%}".format for m in CV_METRICS}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "sim/data/ground_truth/vllm_h100_runs.csv"))
    ap.add_argument("--hardware", default="h100-80gb")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds a stage for the frontend fit")
    ap.add_argument("--refine", type=int, default=2, help="replay-corrected refits after the steady-state fit")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--cross-validate", action="store_true",
                    help="leave each run out in turn (or those of --hold-out): fit on the others, score it")
    ap.add_argument("--hold-out", action="append", metavar="RUN", help="with --cross-validate: only this run")
    ap.add_argument("--seeds", type=int, default=3, help="with --cross-validate: replays of the left-out run")
    ap.add_argument("--workers", type=int, default=1, help="with --cross-validate: replay processes")
    ap.add_argument("--verbose", action="store_true", help="with --cross-validate: each fit's progress")
    args = ap.parse_args()
    if args.write and args.cross_validate:
        raise SystemExit("error: --write and --cross-validate: a cross-validation writes nothing")
    stages = read_runs(args.runs)
    calib_path = shipped_calibration(args.hardware)
    doc = json.loads(calib_path.read_text())
    base = EngineParams.from_dict({**EngineParams().to_dict(), **doc.get("engine", {})})
    for n, (prior, *_rest) in PRIORS.items():
        setattr(base, n, prior)
    tmp = Path(calib_path.parent / f".{args.hardware}.fit.json")
    if args.cross_validate:
        cross_validate(stages, args.hardware, doc, base, args, tmp)
        return
    engine, frontend = fit(stages, args.hardware, doc, base, args.duration, args.refine, tmp)
    if args.write:
        doc["engine"] = engine.to_dict()
        calib_path.write_text(calibration_json(doc))
        fe_path = ROOT / "sim" / "data" / "frontend.json"
        fe_path.write_text(json.dumps({"input_latency_s": round(frontend / 2, 6), "output_latency_s":
                                       round(frontend / 2, 6), "token_latency_s": 0.0,
                                       "fitted_to": str(Path(args.runs).name)}, indent=1) + "\n")
        print(f"wrote {calib_path} (engine) and {fe_path}")


if __name__ == "__main__":
    main()
