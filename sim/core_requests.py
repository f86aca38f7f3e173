"""The per-request table of a run in the compiled core, built from the core's arrays rather than read back
from one Request object at a time (``requests_frame``, sim/metrics.py, reads 13 attributes of every
Request: most of a large run's summarising).

``request_columns`` gives ``requests_frame``'s first columns (req_id ... reject_reason) with the values and
dtypes the SimPy loop's Requests give (``write_requests`` in sim/engine_core.py puts the core's results on
them alike, for everything else that reads them):
- a rejected request (handed over and refused) keeps its defaults: no times but its finish, no counts;
- a time the SimPy clock took while still its initial int 0 is that int, so a column of such times only is
  an int column (first_scheduled_s of requests all scheduled at t=0, finish_s of requests all refused then);
- arrival_s is a float column: every workload gives float arrivals (the schema's, the traces' arrays).
``tests/test_core_requests.py`` checks the table against ``requests_frame`` over the same run's Requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.request import Request, RequestStatus
from sim.sched.records import labels

STATUS_NAMES = [s.name for s in RequestStatus]


def request_columns(requests: list[Request], ints: np.ndarray, arrival: np.ndarray, counters: np.ndarray,
                    times: np.ndarray) -> dict[str, Any] | None:
    """``requests_frame``'s first columns from ``run_engines``' arrays, rewritten in place (``counters[0]``
    then holds each request's final status, refusals included), each row then copied out (the table holds
    no view of the arrays' other rows): ``ints``: req_id, prompt,
    output (capped), _, priority, _, samples; ``counters``: status, computed, generated, preemptions, int-zero flags,
    cached; ``times``: first scheduled, first token, last token, finish, rejection. None without requests."""
    n = len(requests)
    if not n:
        return None
    status, _, _, preemptions, int_zero, cached = counters
    scheduled, first, _, finish, refused_at = times
    refused = ~np.isnan(refused_at)
    sched_zero = (int_zero & 1).astype(bool)
    finish_zero = (int_zero & 2).astype(bool)
    status[refused] = int(RequestStatus.REJECTED)
    cols: dict[str, Any] = {"req_id": ints[0], "arrival_s": arrival, "prompt_tokens": ints[1],
                            "output_tokens": ints[2], "n": ints[6], "priority": ints[4],
                            "status": labels(status, STATUS_NAMES)}
    if not refused.any() and sched_zero.all():
        cols["first_scheduled_s"] = np.zeros(n, dtype=np.int64)
    else:
        scheduled[sched_zero] = 0.0
        scheduled[refused] = np.nan
        cols["first_scheduled_s"] = scheduled
    first[refused] = np.nan
    cols["first_token_s"] = first
    if refused.all() and finish_zero.all():
        cols["finish_s"] = np.zeros(n, dtype=np.int64)
    else:
        finish[refused] = np.where(finish_zero, 0.0, refused_at)[refused]
        cols["finish_s"] = finish
    preemptions[refused] = 0
    cached[refused] = 0
    cols["num_preemptions"] = preemptions
    cols["num_cached_tokens"] = cached
    reasons = {"": 0}   # each reason once (the refused requests' own), then a code a request
    codes = np.zeros(n, dtype=np.int64)
    for i in np.flatnonzero(refused | (status == int(RequestStatus.ABORTED))).tolist():   # (aborted: engine_core's)
        codes[i] = reasons.setdefault(requests[i].reject_reason, len(reasons))
    cols["reject_reason"] = labels(codes, list(reasons))
    for name, col in cols.items():   # (rows of their own: the arrays' other rows are let go with them)
        if isinstance(col, np.ndarray) and col.base is not None:
            cols[name] = col.copy()
    return cols
