"""Routers: the cluster's global scheduler (Vidur's split: a router picks the replica, each replica's own
scheduler decides when the request runs).

A router is called once per request, at the moment the request reaches the replicas (after the
frontend's input latency and the router's ``overhead_s``), and sees every replica's state as of that
moment: its load (requests submitted and not yet finished or rejected: queued, staged or running), its
KV usage, its prefix cache. It returns a replica index (within its pool). Ties in load go to the replica
sent the fewest requests so far, then to the lowest index.

    round_robin      i-th request -> replica i mod N
    random           uniform, from a numpy Generator seeded by the scenario's seed
    least_requests   fewest queued + running requests
    least_kv         lowest KV usage (used blocks / blocks), then fewest requests
    power_of_two     two distinct replicas drawn (seeded), the less loaded of the two
    prefix_affinity  among replicas whose load is within ``load_slack`` of the least loaded one, the one
                     holding the longest cached prefix of the prompt (its full blocks, looked up read-only
                     in each replica's prefix cache); then the least loaded. ``load_slack`` trades cache
                     hits against balance, as SGLang's cache-aware router (balance threshold) and llm-d's
                     prefix scorer weighed against a load scorer do: 0 is least_requests, a large value
                     chases hits regardless of queues.
    session          a request whose hash ids extend an earlier request's (a conversation's next turn,
                     Mooncake traces) goes where that request went; any other request, least_requests.
    dp_balance       vLLM's data-parallel balancer: the least 4 x waiting + running requests (its
                     running ones: ``ReplicaView.running``), then the lowest index, the counts read at most
                     100 ms apart and each request sent counted as waiting until the next reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from sim.request import Request
from sim.workload.tokens import ROOT_HASH, block_hashes, root_hash


class ReplicaView(Protocol):
    """What a router may read of a replica (sim/cluster/replica.py)."""

    submitted: int   # requests routed here so far: the tie-break after load (then the lowest index)

    def load(self) -> int: ...
    def running(self) -> int: ...
    def kv_usage(self) -> float: ...
    def cached_prefix_blocks(self, req: Request, hashes: list[int]) -> int: ...
    def serves_adapters(self) -> bool: ...
    def adapter_residency(self, lora_id: int) -> int: ...
    def has_prefix_cache(self) -> bool: ...
    @property
    def block_size(self) -> int: ...


ROUTERS: dict[str, type[Router]] = {}


def register(name: str) -> Callable[[type[Router]], type[Router]]:
    def deco(cls: type[Router]) -> type[Router]:
        ROUTERS[name] = cls
        cls.name = name
        return cls
    return deco


class Router:
    name = "router"
    # what ``choose`` reads of the replicas, which decides how far their decode runs may go
    # (sim/cluster/runner.py): nothing (round_robin, random: the choices are made ahead of time, each
    # replica knows when its next request comes); their loads (queued + running requests, which a run
    # changes only at its last step) and KV usage (a run's blocks by any time are known from its
    # arrays): runs go on past arrivals; or their prefix caches (any step changes them)
    reads_load = True
    reads_memory = True
    reads_state = True
    # whether ``core_rule``'s rule reads the replicas' caches itself, prefix caches or adapter slots (the core
    # then runs a pool whose router reads them)
    rule_reads_caches = False

    def __init__(self, config, seed: int) -> None:
        self.config = config
        self.rng = np.random.default_rng(seed)

    def attach(self, replicas: Sequence[ReplicaView]) -> None:
        """Called once with the pool it will route to, before the first choice: a router may narrow what
        it reads (``reads_*``) to what this pool has. The choices do not change."""

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        """This router's choices as a rule the compiled core applies itself (sim/csrc/core.c
        ``rule_choice``: the same choices from the same counts, without a Python call per request), for
        ``requests`` (the next ones, in hand-over order) over ``num_replicas`` replicas (their caches may
        differ in size: least_kv compares each one's share in use); None: ``choose`` is called. Drawn randomness is used up as ``choose`` would use it; what a router
        remembers of its choices (session's homes) is not kept: it is not called after the run."""
        return None


@dataclass(frozen=True)
class CoreRule:
    """A routing rule of the compiled core: ``kind`` (``LEAST_LOAD``: least_loaded over every replica;
    ``LEAST_KV``: the least KV usage, then load; ``PAIR``: least_loaded over request g's pair ``choices[g]``
    (ascending); ``AFFINITY``: PrefixAffinity with ``slack``, its hits read from the engines' prefix caches;
    ``FOLLOW``: where the earlier request ``choices[g]`` went, or least_loaded where it is -1; ``LORA``:
    LoraAffinity with ``slack``, the adapters' residency read from the engines)."""

    LEAST_LOAD: ClassVar[int] = 1
    LEAST_KV: ClassVar[int] = 2
    PAIR: ClassVar[int] = 3
    AFFINITY: ClassVar[int] = 4
    FOLLOW: ClassVar[int] = 5
    LORA: ClassVar[int] = 6

    kind: int
    choices: np.ndarray | None = None   # int64: PAIR num_requests x 2, FOLLOW num_requests
    slack: int = 0

    def as_core_arg(self) -> tuple[int, np.ndarray | None, int]:
        choices = None if self.choices is None else np.ascontiguousarray(self.choices, dtype=np.int64)
        return self.kind, choices, self.slack


def least_loaded(replicas: Sequence[ReplicaView], among: Sequence[int] | None = None,
                 loads: Sequence[int] | None = None) -> int:
    """The replica (of ``among``, default all) with the least load, then the fewest submitted, then the
    lowest index. ``loads``: every replica's ``load()`` as of now, if already read."""
    best = None
    for i in range(len(replicas)) if among is None else among:
        r = replicas[i]
        key = (r.load() if loads is None else loads[i], r.submitted, i)
        if best is None or key < best:
            best = key
    return best[2]


@register("round_robin")
class RoundRobin(Router):
    reads_load = reads_memory = reads_state = False

    def __init__(self, config, seed: int) -> None:
        super().__init__(config, seed)
        self.next = 0

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        i = self.next % len(replicas)
        self.next += 1
        return i


@register("random")
class Random(Router):
    reads_load = reads_memory = reads_state = False

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        return int(self.rng.integers(len(replicas)))


@register("least_requests")
class LeastRequests(Router):
    reads_memory = reads_state = False

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        return least_loaded(replicas)

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        return CoreRule(CoreRule.LEAST_LOAD)


@register("dp_balance")
class DataParallelBalance(Router):
    """vLLM's balancer over the ranks of a data-parallel engine (its API server's ``DPLBAsyncMPClient``): the
    least 4 x waiting + running requests (a queued request weighs four running ones: it is TTFT still to
    come), ties to the lowest index. Its counts are those its coordinator published, at most ``REFRESH_S``
    old: here each rank's as of the first choice ``REFRESH_S`` or more after the last reading, and between
    readings every request sent to a rank adds one to that rank's waiting count, as vLLM's client adds it.
    Without the simulation's clock (a router never attached to a pool) it reads them as of each choice. It
    reads which requests run: the compiled core's views (``ReplicaState``) carry them and the core's clock."""

    reads_memory = False
    REFRESH_S = 0.1   # vLLM's DP coordinator publishes the engines' counts every 100 ms

    def __init__(self, config, seed: int) -> None:
        super().__init__(config, seed)
        self._env = None
        self._counts: list[list[int]] | None = None   # [waiting, running] per rank, as last read and since sent
        self._read_at = -math.inf

    def attach(self, replicas: Sequence[ReplicaView]) -> None:
        engine = getattr(replicas[0], "engine", None) if replicas else None
        self._env = getattr(engine, "env", None)

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        now = None if self._env is None else self._env.now
        if now is None or self._counts is None or now - self._read_at >= self.REFRESH_S:
            running = [r.running() for r in replicas]
            self._counts = [[r.load() - n, n] for r, n in zip(replicas, running)]
            self._read_at = -math.inf if now is None else now
        counts = self._counts
        best = min(range(len(counts)), key=lambda i: (4 * counts[i][0] + counts[i][1], i))
        counts[best][0] += 1
        return best


@register("least_kv")
class LeastKV(Router):
    reads_state = False

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        usage = [r.kv_usage() for r in replicas]
        low = min(usage)
        tied = [i for i, u in enumerate(usage) if u == low]   # loads read only to break a tie
        return tied[0] if len(tied) == 1 else min(tied, key=lambda i: (replicas[i].load(), i))

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        return CoreRule(CoreRule.LEAST_KV)


@register("power_of_two")
class PowerOfTwo(Router):
    """The pairs come from the seeded generator ``BLOCK`` at a time: a uniform first replica a, a uniform
    second b among the other N - 1 (b drawn from 0..N-2, then moved past a), one numpy call for each
    half of a block (a ``Generator.choice`` per request cost about 20 us inside a run)."""

    reads_memory = reads_state = False
    BLOCK = 1024

    def __init__(self, config, seed: int) -> None:
        super().__init__(config, seed)
        self._pairs: list[tuple[int, int]] = []   # drawn and not yet used, the next one last
        self._pool = 0                            # the pool size they were drawn for

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        if not self._pairs or self._pool != n:
            self._pairs = list(map(tuple, self._draw(n).tolist()))[::-1]
            self._pool = n
        return least_loaded(replicas, self._pairs.pop())

    def _draw(self, n: int) -> np.ndarray:
        """The next ``BLOCK`` pairs (rows, each ascending) for ``n`` replicas."""
        a = self.rng.integers(n, size=self.BLOCK)
        b = self.rng.integers(n - 1, size=self.BLOCK)
        b += b >= a
        return np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        num_requests = len(requests)
        if num_replicas == 1:
            return CoreRule(CoreRule.LEAST_LOAD)
        if self._pairs:   # (some were drawn and not used: the calls go on from them)
            return None
        blocks = [self._draw(num_replicas) for _ in range(-(-num_requests // self.BLOCK))]
        drawn = np.concatenate(blocks) if blocks else np.empty((0, 2), dtype=np.int64)
        pairs = drawn[:num_requests]
        self._pairs = list(map(tuple, drawn[num_requests:].tolist()))[::-1]   # the last block's rest, as choose leaves it
        self._pool = num_replicas
        return CoreRule(CoreRule.PAIR, pairs)


@register("prefix_affinity")
class PrefixAffinity(Router):
    """Reads loads and prefix caches; a pool without prefix caches (every hit 0: the choice is by load,
    then index) is read for its loads only, so its decode runs go past arrivals (sim/cluster/runner.py)."""

    reads_memory = False
    rule_reads_caches = True

    def attach(self, replicas: Sequence[ReplicaView]) -> None:
        self.reads_state = any(r.has_prefix_cache() for r in replicas)

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        loads = [r.load() for r in replicas]
        floor = min(loads) + self.config.load_slack
        among = [i for i, x in enumerate(loads) if x <= floor]
        bs = replicas[0].block_size
        max_blocks = (req.prompt_len - 1) // bs
        if max_blocks <= 0 or len(among) == 1:
            return least_loaded(replicas, among, loads)
        if not self.reads_state:   # no prefix cache anywhere: every hit is 0
            return min(among, key=lambda i: (loads[i], i))
        hashes = block_hashes(req, 0, max_blocks, bs, root_hash(req))
        hits = {i: replicas[i].cached_prefix_blocks(req, hashes) for i in among}
        return min(among, key=lambda i: (-hits[i], loads[i], i))

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        return CoreRule(CoreRule.AFFINITY, slack=int(self.config.load_slack))   # (the core reads the caches too)


@register("lora_affinity")
class LoraAffinity(Router):
    """A request naming a LoRA adapter goes, among the replicas within ``load_slack`` requests of the least
    loaded, to one holding its adapter in a GPU slot, else in its host cache, else to the least loaded (then
    fewest submitted, then lowest index); a base-model request to the least loaded (sim/lora.py: an adapter
    found in a slot needs no load, and a batch's slots are its adapters)."""

    reads_memory = False
    rule_reads_caches = True   # (the core reads the engines' adapter slots and host caches)

    def attach(self, replicas: Sequence[ReplicaView]) -> None:
        self.reads_state = any(r.serves_adapters() for r in replicas)   # (else: the least loaded, by loads alone)

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        loads = [r.load() for r in replicas]
        if req.lora_id < 0:
            return least_loaded(replicas, None, loads)
        floor = min(loads) + self.config.load_slack
        among = [i for i, x in enumerate(loads) if x <= floor]
        held = {i: replicas[i].adapter_residency(req.lora_id) for i in among}
        return min(among, key=lambda i: (-held[i], loads[i], replicas[i].submitted, i))

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        # (with no adapter named, every choice is the least loaded replica)
        if any(r.lora_id >= 0 for r in requests):
            return CoreRule(CoreRule.LORA, slack=int(self.config.load_slack))
        return CoreRule(CoreRule.LEAST_LOAD)


@register("session")
class Session(Router):
    """Conversation stickiness. Each routed request leaves its hash ids but the last (its full chunks: a
    next turn's prompt repeats them, then goes on) under the chained hash of those ids; a request goes
    where the longest such earlier prefix of its own ids went. A match of one id alone does not count:
    in the Mooncake trace the first chunk is a system prompt that every conversation shares."""

    reads_memory = reads_state = False

    def __init__(self, config, seed: int) -> None:
        super().__init__(config, seed)
        self.home: dict[int, int] = {}

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        ids = req.hash_ids
        if not ids:
            return least_loaded(replicas)
        found, key = self._match(ids, self.home)
        i = found if 0 <= found < len(replicas) else least_loaded(replicas)
        if key is not None:
            self.home[key] = i
        return i

    @staticmethod
    def _match(ids: Sequence[int], home: dict[int, int]) -> tuple[int, int | None]:
        """(what ``home`` holds under the longest prefix of ``ids`` it has, of two ids or more, else -1; the key
        this request is remembered under: the chained hash of its ids but the last, None for fewer than 3)."""
        h = ROOT_HASH
        found = -1
        chain = []
        for k, x in enumerate(ids):   # prefixes of this request, shortest first; the longest routed wins
            h = hash((h, x))
            chain.append(h)
            if k >= 1:
                found = home.get(h, found)
        return found, chain[-2] if len(ids) >= 3 else None

    def core_rule(self, requests: Sequence[Request], num_replicas: int) -> CoreRule | None:
        """FOLLOW: ``choose``'s homes, each remembered as the request that set it (the core goes where it went)."""
        if self.home:   # earlier choices the core does not know
            return None
        follow = np.full(len(requests), -1, dtype=np.int64)
        setter: dict[int, int] = {}   # key -> the last request remembered under it
        for g, req in enumerate(requests):
            if req.hash_ids:
                follow[g], key = self._match(req.hash_ids, setter)
                if key is not None:
                    setter[key] = g
        return CoreRule(CoreRule.FOLLOW, follow)


def make_router(config, seed: int) -> Router:
    return ROUTERS[config.policy](config, seed)
