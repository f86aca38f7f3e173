"""A run measured against SLOs: each SLO's figure, whether the run meets them all, each SLO's attainment,
and the goodput.

    attainment(s)  share of finished requests whose own value of s's metric is within s's bound
                   (NaN for itl, which has no value per request; a request of one output token has no
                   TPOT and counts as within a TPOT bound)
    goodput        requests a second that finished within every bound (vLLM's ``--goodput``, DistServe's
                   metric): finished requests whose TTFT, TPOT and E2E are each within the bound of every
                   SLO on that metric, over the run's makespan (the denominator of ``request_throughput``,
                   so goodput equals it when every request is good). itl bounds apply to the run's
                   figure only.

Invariant: 0 <= goodput_req_s <= request_throughput.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster.capacity import SLO, meets, slo_figures


def slo_report(requests: pd.DataFrame, summary: dict[str, Any], slos: list[SLO]) -> dict[str, Any]:
    """``{<slo name>: figure, ..., "meets": bool, "attain_<slo name>": share, ..., "goodput_req_s": x}``."""
    figures = slo_figures(summary, slos)
    done = requests[requests["status"] == "FINISHED"]
    good = np.ones(len(done), dtype=bool)
    attain = {}
    for s in slos:
        if s.metric not in done:   # (itl: no value per request)
            attain[f"attain_{s.name}"] = math.nan
            continue
        within = ~(done[s.metric].to_numpy(dtype=float) > s.value)   # (no TPOT, one output token: within)
        attain[f"attain_{s.name}"] = float(within.mean()) if len(done) else math.nan
        good &= within
    makespan = float(summary.get("makespan_s") or 0.0)
    goodput = float(np.count_nonzero(good)) / makespan if makespan > 0 else 0.0
    return {**figures, "meets": meets(figures, slos), **attain, "goodput_req_s": goodput}
