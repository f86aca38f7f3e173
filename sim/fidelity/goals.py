"""The fidelity goals, checked per stage (issue: "Predict a real engine").

A stage is at light load when its measured mean TTFT is under 1 s. There, the prediction must hold
mean E2E and mean decode time per token within +-10%, mean TTFT within +-25%, completed req/s within
+-2% and p90 E2E within +-15%. Every stage: no false saturation (predicted mean TTFT at most 3x the
measured one plus 50 ms). A figure that was not measured (a row asking for a prediction only) checks nothing.
"""

from __future__ import annotations

import math

from sim.fidelity.evaluate import StageResult

LIGHT_LOAD_TTFT_S = 1.0
BOUNDS = {"e2e_mean": 0.10, "decode_per_token": 0.10, "ttft_mean": 0.25, "req_per_s": 0.02, "e2e_p90": 0.15}


def check_goals(results: list[StageResult]) -> list[dict]:
    """One row per (stage, goal): the error, the bound and whether it holds."""
    rows = []
    for r in results:
        where = {"run": r.stage.run, "stage": r.stage.stage}
        measured = r.stage.measured
        if math.isnan(measured["ttft_mean"]):
            continue
        if measured["ttft_mean"] < LIGHT_LOAD_TTFT_S:
            for metric, bound in BOUNDS.items():
                if math.isnan(measured[metric]):
                    continue
                err = r.error(metric)
                rows.append(where | {"goal": f"{metric} within +-{bound:.0%}", "value": err,
                                     "ok": abs(err) <= bound})
        rows.append(where | {"goal": "no false saturation", "value": r.predicted("ttft_mean"),
                             "ok": not r.falsely_saturated})
    return rows
