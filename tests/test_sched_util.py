"""Shared harness for the scheduling-policy tests: the real engine, 1-second steps, every plan kept."""

from __future__ import annotations

from sim.engine import Engine
from sim.kv import make_kv_manager
from sim.metrics import Recorder
from sim.request import Request
from sim.scenario import KVCacheConfig, SchedulerConfig
from sim.sched import make_scheduler
from sim.sched.plan import StepPlan, StepResult


class OneSecond:
    """An executor whose steps all take 1 s; records (req_id, new tokens, context) and block moves."""

    def __init__(self) -> None:
        self.plans: list[list[tuple[int, int, int]]] = []
        self.tables: list[dict[int, list[int]]] = []
        self.swap_out: list[list[tuple[int, int]]] = []
        self.swap_in: list[list[tuple[int, int]]] = []
        self.recorder: Recorder | None = None

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append([(s.req_id, s.num_new_tokens, s.num_context_tokens) for s in plan.scheduled])
        self.tables.append({s.req_id: list(s.block_ids) for s in plan.scheduled})
        self.swap_out.append(list(plan.blocks_to_swap_out))
        self.swap_in.append(list(plan.blocks_to_swap_in))
        return StepResult(1.0, {})


def simulate(reqs: list[Request], num_blocks: int, block_size: int, cpu_blocks: int = 0,
             allocator: str = "paged", max_model_len: int = 1024, **sched):
    """Run ``reqs`` to completion with the integrity check after every step; returns (sched, executor)."""
    kv = KVCacheConfig(block_size=block_size, allocator=allocator)
    mgr = make_kv_manager(kv, num_blocks, cpu_blocks, max_model_len)
    sch = make_scheduler(SchedulerConfig(**sched), mgr, max_model_len)
    ex = OneSecond()
    ex.recorder = Recorder(num_blocks, num_blocks * block_size)
    Engine(reqs, sch, ex, ex.recorder, check_integrity=True).run()
    return sch, ex


def who(ex: OneSecond) -> list[list[int]]:
    """The request ids of each step, in plan order."""
    return [[rid for rid, _, _ in p] for p in ex.plans]
