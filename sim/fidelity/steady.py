"""The steady state of a measured stage, priced by an executor without simulating it.

Little's law gives the requests in the engine, N = rate x measured mean E2E. In steady state they are
spread evenly over their decode, so their contexts run evenly from the prompt length to prompt +
output - 1. A step is a decode step of N sequences, or, when a request arrived during the previous
step (probability 1 - exp(-rate x T)), a mixed step that also computes its uncached prompt tail (the
prompts repeat, so only the last partial block is computed). The mean step T solves

    T = (1 - p(T)) x decode(N) + p(T) x mixed(N),      p(T) = 1 - exp(-rate x T)

and is the decode time per token a request sees. Fractional N interpolates between the two integer
batches around it. Used by scripts/fit_engine.py (microseconds a stage, so the fit can try thousands of
parameter sets) and by the fidelity notebook to show each term's share.
"""

from __future__ import annotations

import math

import numpy as np

from sim.fidelity.runs import MeasuredStage
from sim.sched.plan import ScheduledRequest, StepPlan, StepResult


def _plan(n: int, prompt: int, out: int, prefill: int = 0) -> StepPlan:
    ctx = np.linspace(prompt, prompt + out - 1, n) if n > 1 else np.array([prompt + out / 2])
    scheduled = [ScheduledRequest(i, 1, int(c), []) for i, c in enumerate(np.rint(ctx))]
    if prefill:
        scheduled.append(ScheduledRequest(n, prefill, prompt - prefill, []))
    return StepPlan(scheduled=scheduled)


def uncached_tail(prompt: int, block_size: int = 16) -> int:
    """Tokens a repeated prompt still computes: its last partial block (a full last block: one token)."""
    return prompt % block_size or 1


def steady_step(executor, stage: MeasuredStage, block_size: int = 16) -> tuple[float, StepResult]:
    """(mean step seconds, the decode step's result at the integer batch nearest N) for ``stage``."""
    # the requests in the engine: Little's law, or a concurrent load's workers (each always has one in flight)
    rate = stage.measured["req_per_s"] if stage.load == "concurrent" else stage.rate_req_s
    n_real = float(stage.concurrency) if stage.load == "concurrent" else max(1.0, rate * stage.measured["e2e_mean"])
    prompt = int(round(stage.prompt_quantiles["mean"]))
    tail = uncached_tail(prompt, block_size)
    lo = int(math.floor(n_real))
    frac = n_real - lo
    dec = mix = 0.0
    for n, w in ((lo, 1 - frac), (lo + 1, frac)):
        if w:
            dec += w * executor.execute(_plan(n, prompt, stage.output_len)).duration_s
            mix += w * executor.execute(_plan(n, prompt, stage.output_len, prefill=tail)).duration_s
    t = dec
    for _ in range(20):
        p = 1 - math.exp(-rate * t)
        t = (1 - p) * dec + p * mix
    return t, executor.execute(_plan(int(round(n_real)), prompt, stage.output_len))
