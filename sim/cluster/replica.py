"""One replica of a cluster: the scenario's engine parts (KV manager, scheduler, executor, recorder, engine)
built in a shared SimPy environment, with a pool's overrides applied.

Invariant: a replica's parts are exactly what ``run_scenario`` builds for the (overridden) scenario, so
a one-replica cluster is the single engine; the engine is fed by ``submit`` (never by its own arrival
process) and stops when the cluster calls ``end_arrivals``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import simpy

from sim.cluster.config import PoolConfig
from sim.engine import Engine
from sim.errors import KvsimError
from sim.request import Request
from sim.scenario import KVCacheConfig, Scenario, SchedulerConfig


def pool_scenario(scn: Scenario, pool: PoolConfig | None) -> Scenario:
    """The scenario a pool's replicas run: the pool's hardware, tensor_parallel, kv_cache and scheduler
    keys over the scenario's own; a data-parallel pool's also knows its ranks (``_pool_ranks``: each sizes its
    cache for its share of the experts)."""
    if pool is None:
        return scn
    update: dict = {}
    hw = pool.hardware if pool.hardware is not None else scn.hardware
    if pool.tensor_parallel is not None:
        from sim.specs import HardwareSpec

        spec = HardwareSpec.from_name(hw) if isinstance(hw, str) else hw
        hw = spec.model_copy(update={"tensor_parallel": pool.tensor_parallel})
    update["hardware"] = hw
    if pool.kv_cache:
        update["kv_cache"] = KVCacheConfig.model_validate({**scn.kv_cache.model_dump(), **pool.kv_cache})
    if pool.scheduler:
        update["scheduler"] = SchedulerConfig.model_validate({**scn.scheduler.model_dump(), **pool.scheduler})
    sub = scn.model_copy(update=update)
    sub._base_dir = scn.base_dir
    sub._source = scn.source
    sub._pool_ranks = pool.ranks_per_engine
    return sub


@dataclass
class Replica:
    """A replica and its counters; the router reads ``load``, ``kv_usage`` and ``cached_prefix_blocks``."""

    replica_id: int
    role: str            # colocated | prefill | decode
    scn: Scenario
    engine: Engine
    num_gpu_blocks: int
    submitted: int = 0
    incoming: int = 0    # routed here and not yet submitted (a decode replica's KV on its way)
    group: int | None = None   # its group in a mixed colocated fleet (cluster.groups)
    dp_engine: int | None = None   # its data-parallel engine in a fleet of several (data_parallel_size), in its pool

    def __post_init__(self) -> None:
        # what ``load`` reads at every arrival (the scheduler's lists are never replaced)
        self._finished = self.engine.scheduler.finished
        self._rejected = self.engine.scheduler.rejected
        self._aborted = self.engine.scheduler.aborted
        self._pending_finished = self.engine.pending_finished
        # and what ``kv_usage`` reads (the manager is never replaced)
        manager = self.engine.scheduler.manager
        self._num_blocks = manager.num_blocks
        self._free_blocks = manager.num_free_blocks
        self._pending_blocks = self.engine.pending_blocks

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def manager(self):
        return self.engine.scheduler.manager

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    def submit(self, req: Request) -> None:
        self.submitted += 1
        self.engine.submit(req)

    def load(self) -> int:
        """Requests submitted here (or routed here, their KV on its way) and not yet finished or rejected
        (queued, staged or running), counting the finishes of a decode run in progress by now."""
        return (self.submitted + self.incoming - len(self._finished) - len(self._rejected) - len(self._aborted)
                - self._pending_finished())

    def running(self) -> int:
        """Requests in this replica's running batch now (the rest of ``load`` waits: queued, staged, swapped
        out, or on their way)."""
        return len(self.engine.scheduler.running)

    def kv_usage(self) -> float:
        """Used blocks / blocks, counting those a decode run in progress holds by now (taken, less the
        tables of the requests it has finished)."""
        return (self._num_blocks - self._free_blocks() + self._pending_blocks()) / self._num_blocks

    def has_prefix_cache(self) -> bool:
        """Whether this replica's KV manager keeps a prefix cache."""
        return getattr(self.manager, "prefix_cache", None) is not None

    def serves_adapters(self) -> bool:
        """Whether this replica serves LoRA adapters (sim/lora.py)."""
        return self.engine.scheduler.adapters is not None

    def adapter_residency(self, lora_id: int) -> int:
        """Where this replica holds LoRA adapter ``lora_id`` (sim/lora.py): 2 in a GPU slot, 1 in its host cache,
        0 neither (or no LoRA)."""
        cache = self.engine.scheduler.adapters
        if cache is None:
            return 0
        return 2 if lora_id in cache.gpu else 1 if lora_id in cache.host else 0

    def cached_prefix_blocks(self, req: Request, hashes: list[int]) -> int:
        """How many leading full blocks of the prompt this replica's prefix cache holds (read-only)."""
        cache = getattr(self.manager, "prefix_cache", None)
        return len(cache.match_blocks(hashes, len(hashes))) if cache is not None else 0


def check_released(rep: Replica, free_blocks: int | None = None) -> None:
    """After every request has ended, each of the replica's KV blocks is free again (cached ones count as
    free): ``free_blocks`` as the compiled core left them, else its manager's."""
    free = rep.manager.num_free_blocks() if free_blocks is None else free_blocks
    held = rep.manager.num_blocks - free
    if held:
        raise KvsimError("engine", f"replica {rep.replica_id} ({rep.role}) still holds {held} KV blocks "
                         "after every request ended (a leak)")


def build_replica(scn: Scenario, replica_id: int, role: str, env: simpy.Environment, check_integrity: bool,
                  arrival_delay_s: float, executor: Any = None, group: int | None = None) -> Replica:
    """Build a replica's parts the way ``run_scenario`` builds the single engine's (``executor``: one of
    another replica of the same scenario, shared: sim.runner.shared_executor; ``group``: its group of a
    mixed fleet, named in errors)."""
    from sim.runner import build_parts, cpu_blocks, gpu_blocks

    try:
        num_gpu = gpu_blocks(scn)
    except KvsimError as e:   # a pool's (or group's) own hardware or tensor_parallel: name it
        if role == "colocated" and group is None:
            raise
        where = f"groups.{group}" if group is not None else role
        raise KvsimError(f"{scn.source}: cluster.{where}", e.what) from None
    if num_gpu < 1:
        which = f"group {group}'s replicas" if group is not None else f"a {role} replica"
        raise KvsimError(f"{scn.source}: kv_cache", f"no room for a single KV block on {which}")
    num_cpu = cpu_blocks(scn)
    manager, scheduler, executor, recorder = build_parts(scn, num_gpu, num_cpu, executor, replica_id)
    engine = Engine(None, scheduler, executor, recorder, check_integrity=check_integrity,
                    max_steps_without_progress=scn.scheduler.max_steps_without_progress,
                    async_scheduling=scn.scheduler.async_scheduling, arrival_delay_s=arrival_delay_s,
                    multi_step=scn.scheduler.multi_step and scn.workload.timeout_s is None and scn.lora is None,
                    env=env,
                    replica_id=replica_id)
    # prefill/decode pools: transfers act on the engines between arrivals (sim/cluster/disagg.py)
    engine.eager_steps = role == "colocated"
    return Replica(replica_id, role, scn, engine, num_gpu)


def build_pool(scn: Scenario, ids: range, role: str, env: simpy.Environment, check_integrity: bool,
               arrival_delay_s: float, group: int | None = None) -> list[Replica]:
    """The replicas ``ids`` of one scenario, sharing the first one's executor where it is a pure pricer
    (sim.runner.shared_executor: each step size is then priced once for the pool, not once a replica);
    ``group``: their group of a mixed colocated fleet."""
    from sim.runner import shared_executor

    pool: list[Replica] = []
    executor = None
    for i in ids:
        rep = build_replica(scn, i, role, env, check_integrity, arrival_delay_s, executor, group)
        rep.group = group
        executor = shared_executor(rep.engine.executor)
        pool.append(rep)
    return pool
