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
    """``{<slo name>: figure, ..., "meets": bool, "attain_<slo name>": share, ..., "goodput_req_s": x}``.
    Requests their clients gave up on (ABORTED, ``workload.timeout_s``) count as beyond every bound: in
    each figure (as an infinite value: a mean becomes infinite, a percentile moves up) and in each
    attainment (never within)."""
    figures = slo_figures(summary, slos)
    done = requests[requests["status"] == "FINISHED"]
    aborted = int((requests["status"] == "ABORTED").sum())
    good = np.ones(len(done), dtype=bool)
    attain = {}
    for s in slos:
        if s.metric not in done:   # (itl: no value per request)
            attain[f"attain_{s.name}"] = math.nan
            continue
        values = done[s.metric].to_numpy(dtype=float)
        within = ~(values > s.value)   # (no TPOT, one output token: within)
        attain[f"attain_{s.name}"] = float(within.sum() / (len(done) + aborted)) if len(done) + aborted else math.nan
        good &= within
        if aborted:
            figures[s.name] = _with_aborted(values, aborted, s.stat)
    makespan = float(summary.get("makespan_s") or 0.0)
    goodput = float(np.count_nonzero(good)) / makespan if makespan > 0 else 0.0
    return {**figures, "meets": meets(figures, slos), **attain, "goodput_req_s": goodput}


def _with_aborted(values: np.ndarray, aborted: int, stat: str) -> float:
    """``stat`` (mean, p50, p90, p99) of the finished requests' ``values`` (NaN ones left out, as the
    summary leaves them) with ``aborted`` more at infinity: numpy's linear percentile over them all,
    infinite where it reaches one of those."""
    kept = np.sort(values[~np.isnan(values)])
    if stat == "mean":
        return math.inf
    q = float(stat[1:]) / 100 * (len(kept) + aborted - 1)
    lo = int(math.floor(q))
    hi = lo + 1 if q > lo else lo
    if hi >= len(kept):
        return math.inf
    return float(kept[lo] + (q - lo) * (kept[hi] - kept[lo]))
