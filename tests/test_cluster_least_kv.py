"""least_kv reads replicas in the order of a floor of their KV usage and stops once a floor is above the
least usage read: its choices are those of reading every replica's (usage, load, index)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.cluster.config import RouterConfig
from sim.cluster.routers import LeastKV
from sim.request import Request


@dataclass
class FakeReplica:
    """A ReplicaView with fixed used / decode-run / total blocks and load; counts what is read."""

    used: int
    running: int
    blocks: int
    loaded: int
    submitted: int = 0
    usage_reads: int = 0
    load_reads: int = 0

    def kv_usage_floor(self) -> float:
        return self.used / self.blocks

    def kv_usage(self) -> float:
        self.usage_reads += 1
        return (self.used + self.running) / self.blocks

    def load(self) -> int:
        self.load_reads += 1
        return self.loaded


def _choose(pool: list[FakeReplica]) -> int:
    return LeastKV(RouterConfig(policy="least_kv"), seed=0).choose(Request(0, 0.0, 100, 5), pool)


def test_same_choice_as_reading_every_replica() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        blocks = rng.choice([7, 10, 100])
        pool = [FakeReplica(rng.randint(0, 5), rng.choice([0, 0, rng.randint(0, 4)]), blocks, rng.randint(0, 3))
                for _ in range(rng.randint(1, 8))]
        want = min(range(len(pool)), key=lambda i: ((pool[i].used + pool[i].running) / blocks, pool[i].loaded, i))
        assert _choose(pool) == want


def test_reads_only_replicas_that_may_win() -> None:
    # replica 1 is the emptiest even with its decode run's blocks: replicas 0 and 2, whose floors are
    # above its usage, are not read, and no load is read (no tie)
    pool = [FakeReplica(50, 0, 100, 1), FakeReplica(10, 5, 100, 9), FakeReplica(40, 0, 100, 0)]
    assert _choose(pool) == 1
    assert [r.usage_reads for r in pool] == [0, 1, 0]
    assert all(r.load_reads == 0 for r in pool)


def test_a_tie_in_usage_goes_to_the_least_loaded() -> None:
    pool = [FakeReplica(20, 0, 100, 3), FakeReplica(10, 10, 100, 1), FakeReplica(30, 0, 100, 0)]
    assert _choose(pool) == 1
    assert [r.load_reads for r in pool] == [1, 1, 0]
