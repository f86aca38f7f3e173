"""The Executor contract and the registry that finds executors by name.

Heavy executors (the GPU backend imports torch and triton) are registered as "module:attr" strings
and imported only when a scenario asks for them, so the simulator runs without torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim.sched.plan import StepPlan, StepResult


@runtime_checkable
class Executor(Protocol):
    """Prices (or performs) one engine step.

    ``execute`` must not mutate the plan, must return a positive ``duration_s``, and must be
    deterministic for the cost model (the same plan gives the same result).
    """

    def execute(self, plan: StepPlan) -> StepResult: ...


# name -> "module:factory"; factory(model, hardware, executor_config, kv_config) -> Executor
_REGISTRY: dict[str, str] = {
    "cost_model": "sim.executors.cost_model:make_cost_model_executor",
    "gpu": "backend.executor:make_gpu_executor",
    # runs the real backend and prices the same plan with the cost model (for cross-checks)
    "paired": "sim.executors.crosscheck:make_paired_executor",
}


def register_executor(name: str, target: str) -> None:
    """Register an executor factory under ``name`` as a "module:attr" path (imported lazily)."""
    _REGISTRY[name] = target


def executor_names() -> list[str]:
    return sorted(_REGISTRY)


def make_executor(name: str, **kwargs: Any) -> Executor:
    """Import and build the executor registered under ``name``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown executor {name!r}; known: {', '.join(executor_names())}")
    module_name, attr = _REGISTRY[name].split(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(**kwargs)



def step_model(executor: Any) -> dict[str, Any]:
    """What priced a run's steps, for its summary: the executor's ``describe()``, else its class name."""
    describe = getattr(executor, "describe", None)
    return describe() if describe is not None else {"executor": type(executor).__name__}


@dataclass
class DecodeRun:
    """The prices of ``k`` consecutive all-decode steps: one array entry per step."""

    durations: np.ndarray                                          # (k,) seconds, each > 0
    breakdown: dict[str, np.ndarray] = field(default_factory=dict)  # part -> (k,) seconds


def execute_decode_run(executor: Executor, plan: StepPlan, k: int) -> DecodeRun:
    """Price ``k`` consecutive steps that repeat the all-decode ``plan`` (step j: every context + j).

    Executors may define a method ``execute_decode_run(plan, k)`` that prices them at once (the cost
    model's is vectorised); this fallback builds each shifted plan and calls ``execute``. Either way,
    entry j must equal ``execute`` of the step-j plan bit for bit (the multi-step engine path relies on
    it). Block tables in the shifted plans are those of step 0 (executors that price do not read them).
    """
    own = getattr(executor, "execute_decode_run", None)
    if own is not None:
        return own(plan, k)
    from sim.sched.plan import ScheduledRequest

    results = []
    for j in range(k):
        shifted = StepPlan(scheduled=[ScheduledRequest(s.req_id, s.num_new_tokens, s.num_context_tokens + j,
                                                       s.block_ids) for s in plan.scheduled])
        results.append(executor.execute(shifted))
    keys = list(results[0].breakdown) if results else []
    return DecodeRun(np.array([r.duration_s for r in results], dtype=float),
                     {key: np.array([r.breakdown.get(key, 0.0) for r in results], dtype=float) for key in keys})
