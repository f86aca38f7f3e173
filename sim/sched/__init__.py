"""Schedulers: who runs in each step. ``make_scheduler`` picks one from a scenario's ``scheduler`` section."""

from __future__ import annotations

from sim.sched.base import Phase, SchedulerBase
from sim.sched.continuous import ContinuousScheduler
from sim.sched.plan import ScheduledRequest, StepPlan, StepResult
from sim.sched.static import StaticScheduler


def make_scheduler(config, manager, max_model_len: int) -> SchedulerBase:
    if config.batching == "static":
        return StaticScheduler(config, manager, max_model_len)
    return ContinuousScheduler(config, manager, max_model_len)


__all__ = ["ContinuousScheduler", "Phase", "SchedulerBase", "ScheduledRequest", "StaticScheduler", "StepPlan",
           "StepResult", "make_scheduler"]
