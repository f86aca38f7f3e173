"""Parallel samples as vLLM v1 serves them (``scheduler.parallel_sampling: fanout``): a request asking for n
samples becomes n requests of its prompt, each generating its own output, which the engine schedules,
caches and finishes one by one (vLLM's ``ParentRequest`` hands the engine one child request a sample).

    workload:  request 0 (n = 1)   request 1 (n = 3)              request 2 (n = 1)
    engine:    req 0               req 1, req 2, req 3            req 4
               sample_of -1        sample_of 1 (all three)        sample_of -1

The samples arrive together, in order, and share their whole prompt's token ids (``Request.sample_of``;
sim/workload/tokens.py): with a prefix cache the first computes the prompt and the others find its full
blocks cached (vLLM caches a block when it is allocated for the step that fills it, so even in the same
step), each computing only its last, partly filled block; without one, each computes the whole prompt.
Compare ``fork`` (the PagedAttention paper's and vLLM v0's): one request whose n sequences share the
prompt's blocks and copy the partly filled one on their first write.

Invariant: the engine's requests are numbered 0..N'-1 in arrival order (a workload's invariant), and
``origin[i]`` is the workload request engine request i serves.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from sim.request import Request


def extra_samples(requests: list[Request]) -> int:
    """Samples past each request's first, over all requests (``fan_out``'s ``lengths``)."""
    return sum(r.n - 1 for r in requests)


def fan_out(requests: list[Request], lengths: np.ndarray | None = None) -> tuple[list[Request], np.ndarray | None]:
    """(the engine's requests, the workload request each serves); ``requests`` as they are and None where
    none asks for more than one sample. A request's first sample keeps its output length; the others take
    theirs from ``lengths`` in order (``extra_samples`` of them; None: each its request's)."""
    if all(r.n == 1 for r in requests):
        return requests, None
    out: list[Request] = []
    origin: list[int] = []
    more = iter(lengths.tolist()) if lengths is not None else None
    for req in requests:
        wid = req.req_id
        if req.n == 1:
            req.req_id = len(out)
            out.append(req)
            origin.append(wid)
            continue
        for s in range(req.n):
            output = next(more) if more is not None and s else req.output_len
            out.append(dataclasses.replace(req, req_id=len(out), n=1, sample_of=wid, output_len=output))
            origin.append(wid)
    return out, np.array(origin, dtype=np.int64)


def add_sample_columns(reqs: pd.DataFrame, origin: np.ndarray | None) -> None:
    """The requests' table gains ``sample_of`` (the workload request each row serves) and ``sample`` (its
    index among that request's samples; 0 for a request of one sample), where the workload fanned out."""
    if origin is None:
        return
    ids = reqs["req_id"].to_numpy()
    of = origin[ids]
    reqs["sample_of"] = of
    first = np.searchsorted(origin, of)   # (origin is sorted: the samples of a request are consecutive)
    reqs["sample"] = ids - first
