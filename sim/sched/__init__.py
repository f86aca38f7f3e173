"""Schedulers: who runs in each step. ``make_scheduler`` picks one from a scenario's ``scheduler`` section."""

from __future__ import annotations

from sim.sched.base import SchedulerBase
from sim.sched.continuous import ContinuousScheduler
from sim.sched.plan import ScheduledRequest, StepPlan, StepResult


def make_scheduler(config, manager, max_model_len: int) -> SchedulerBase:
    if config.batching == "static":
        raise NotImplementedError("static batching is not built yet")
    return ContinuousScheduler(config, manager, max_model_len)


__all__ = ["ContinuousScheduler", "SchedulerBase", "ScheduledRequest", "StepPlan", "StepResult", "make_scheduler"]
