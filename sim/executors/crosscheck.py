"""Cross-check the cost model against the real backend, step by step and on a whole scenario.

Two measurements, both on the same scenario:

1. Step time. The ``paired`` executor runs each plan on the real backend (executor ``gpu``; device cpu
   or cuda) and prices the very same plan with the cost model; the simulation advances by the real time
   and the prediction rides along in the breakdown as ``predicted`` (so steps.csv gets a
   ``time_predicted_s`` column, and ``time_predicted_linear_s`` / ``time_predicted_attention_s``);
   ``predicted_default`` is the uncalibrated cost model's price, for scale. Step-time MAPE compares the two on identical plans.
2. End to end. The scenario runs once with the real backend and once with the cost model alone; TTFT,
   TPOT and throughput are compared (relative differences).

On a busy CPU the real step times carry scheduler stalls (a step now and then takes several times its
usual time), which inflate means; the median step error (``step_mdape``) and the p50 latencies are the
robust figures.

The paired result's breakdown is the real one plus ``predicted``, so it does not add up to the duration;
use it for this comparison only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.executors.base import make_executor, register_executor
from sim.executors.cost_model import CostModelExecutor, default_params, make_cost_model_executor
from sim.sched.plan import StepPlan, StepResult

register_executor("paired", "sim.executors.crosscheck:make_paired_executor")

SUMMARY_KEYS = ("ttft_s", "tpot_s", "e2e_s")  # compared by mean and by median (p50)


class PairedExecutor:
    """The real executor's result, with the cost model's price of the same plan as ``predicted``."""

    def __init__(self, real: Any, model: Any, default: Any) -> None:
        self.real, self.model, self.default = real, model, default

    def describe(self) -> dict[str, Any]:
        """The real executor's description, with the cost model it is checked against."""
        return {**self.real.describe(), "predicted_by": self.model.describe()}

    def execute(self, plan: StepPlan) -> StepResult:
        measured = self.real.execute(plan)
        pred = self.model.execute(plan)
        extra = {"predicted": pred.duration_s, "predicted_linear": pred.breakdown["linear"],
                 "predicted_attention": pred.breakdown["attention"],
                 "predicted_default": self.default.execute(plan).duration_s}
        return StepResult(duration_s=measured.duration_s, breakdown={**measured.breakdown, **extra})


def make_paired_executor(**kwargs: Any) -> PairedExecutor:
    model = make_cost_model_executor(**kwargs)
    default = CostModelExecutor(model.model, model.hardware, default_params(model.hardware),
                                block_size=getattr(kwargs.get("kv"), "block_size", 16))
    return PairedExecutor(make_executor("gpu", **kwargs), model, default)


def step_ape(steps: Any, column: str = "time_predicted_s") -> np.ndarray:
    """Absolute percentage error (fractions) of a prediction column against ``duration_s``, per step."""
    meas = steps["duration_s"].to_numpy()
    return np.abs(steps[column].to_numpy() - meas) / meas


def step_mape(steps: Any, column: str = "time_predicted_s") -> float:
    """MAPE of a prediction column against ``duration_s`` over the steps of a paired run."""
    return float(np.mean(step_ape(steps, column)))


def compare(scenario: str | Path, calibration: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run ``scenario`` paired (real backend + predictions) and with the cost model alone; compare.

    ``calibration`` is passed as ``executor.calibration`` (an absolute path, or a shipped name).
    """
    from sim import load_scenario, run_scenario

    calib = str(Path(calibration).resolve()) if Path(calibration).exists() else str(calibration)
    sets = list(overrides or []) + [f"executor.calibration={calib}"]
    real = run_scenario(load_scenario(str(scenario), overrides=sets + ["executor.kind=paired"]))
    model = run_scenario(load_scenario(str(scenario), overrides=sets + ["executor.kind=cost_model"]))
    out: dict[str, Any] = {"num_steps": int(len(real.steps)), "step_mape": step_mape(real.steps),
                           "step_mdape": float(np.median(step_ape(real.steps))),
                           "step_mape_uncalibrated": step_mape(real.steps, "time_predicted_default_s"),
                           "step_mdape_uncalibrated": float(np.median(step_ape(real.steps,
                                                                               "time_predicted_default_s")))}
    for key in SUMMARY_KEYS:
        for stat in ("mean", "p50"):
            a, b = real.summary[key][stat], model.summary[key][stat]
            out[f"{key}_{stat}"] = {"real": a, "model": b, "rel_diff": (b - a) / a}
    a, b = real.summary["output_throughput_tok_s"], model.summary["output_throughput_tok_s"]
    out["output_throughput_tok_s"] = {"real": a, "model": b, "rel_diff": (b - a) / a}
    a, b = real.steps["duration_s"].sum(), model.steps["duration_s"].sum()
    out["busy_time_s"] = {"real": float(a), "model": float(b), "rel_diff": float((b - a) / a)}
    return out
