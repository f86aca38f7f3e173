"""A fleet of data-parallel engines behind one gateway (``cluster: {replicas: N, data_parallel: true,
data_parallel_size: S}``): the cluster's router picks an engine, the engine's own balancer picks its rank.

Each vLLM data-parallel engine has its own API server, which sends a request to one of its S ranks by its
coordinator's counts (``dp_balance``); a gateway in front of several engines (llm-d's, Dynamo's, SGLang's
router) sees each engine as one endpoint. So here:

    engine = router.choose(req, engines)          the cluster's router over ``EngineView``s: an engine's
                                                  load, running requests and submissions summed over its
                                                  ranks, its KV usage their mean (equal caches), its cached
                                                  prefix the longest any rank holds
    rank   = balancers[engine].choose(req, ranks)  vLLM's balancer over that engine's ranks

The pair acts as one router over every rank (``FleetRouter``): what it reads of the ranks is what either
level reads, and its choice is the rank's index in the pool (engine after engine).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cluster.routers import DataParallelBalance, PrefixAffinity, ReplicaView, Router
from sim.request import Request


class EngineView:
    """One data-parallel engine as a gateway's router reads it (``ReplicaView``), from its ranks."""

    def __init__(self, ranks: Sequence[ReplicaView]) -> None:
        self.ranks = list(ranks)
        self.engine = getattr(self.ranks[0], "engine", None)   # (its clock, for a router that reads one)

    @property
    def submitted(self) -> int:
        return sum(r.submitted for r in self.ranks)

    @property
    def block_size(self) -> int:
        return self.ranks[0].block_size

    def load(self) -> int:
        return sum(r.load() for r in self.ranks)

    def running(self) -> int:
        return sum(r.running() for r in self.ranks)

    def kv_usage(self) -> float:
        return sum(r.kv_usage() for r in self.ranks) / len(self.ranks)

    def cached_prefix_blocks(self, req: Request, hashes: list[int]) -> int:
        return max(r.cached_prefix_blocks(req, hashes) for r in self.ranks)

    def has_prefix_cache(self) -> bool:
        return any(r.has_prefix_cache() for r in self.ranks)

    def serves_adapters(self) -> bool:
        return any(r.serves_adapters() for r in self.ranks)

    def adapter_residency(self, lora_id: int) -> int:
        return max(r.adapter_residency(lora_id) for r in self.ranks)


class FleetRouter(Router):
    """The gateway's ``router`` over the engines, then each engine's ``DataParallelBalance`` over its
    ``size`` ranks; ``choose`` returns the rank's index in the whole pool."""

    def __init__(self, gateway: Router, size: int) -> None:
        super().__init__(gateway.config, 0)   # (it draws nothing itself: the gateway's router draws)
        self.gateway, self.size = gateway, size
        self.balancers: list[DataParallelBalance] = []
        self.engines: list[EngineView] = []

    def attach(self, replicas: Sequence[ReplicaView]) -> None:
        size = self.size
        rank_lists = [list(replicas[i:i + size]) for i in range(0, len(replicas), size)]
        self.engines = [EngineView(ranks) for ranks in rank_lists]
        self.balancers = [DataParallelBalance(self.config, 0) for _ in rank_lists]
        self.gateway.attach(self.engines)
        for balancer, ranks in zip(self.balancers, rank_lists):
            balancer.attach(ranks)
        self.reads_load = True   # (each engine's balancer reads its ranks' counts)
        self.reads_memory = self.gateway.reads_memory
        self.reads_state = True

    def choose(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        e = self.gateway.choose(req, self.engines)
        return e * self.size + self.balancers[e].choose(req, self.engines[e].ranks)


def routes_in_core(router: Router) -> bool:
    """Whether the compiled core can route for ``router`` (attached to its pool already): it reads at most the
    engines' counts, KV usage, running requests, the clock and their prefix caches' hits (``ReplicaState``), or
    its rule reads their caches itself; a fleet's gateway the first (it is called with views, never applied by
    a rule), not adapter slots."""
    if isinstance(router, FleetRouter):
        return not router.gateway.reads_state or isinstance(router.gateway, (DataParallelBalance, PrefixAffinity))
    return not router.reads_state or router.rule_reads_caches or isinstance(router, DataParallelBalance)


def engine_router(router: Router, replicas: int, size: int) -> Router:
    """The router in front of ``replicas`` data-parallel ranks, ``size`` an engine (1: plain replicas):
    ``router`` itself over one engine's ranks (or plain replicas), else the gateway's over the engines and
    each engine's balancer over its ranks (``FleetRouter``)."""
    if size <= 1 or replicas <= size:
        return router
    return FleetRouter(router, size)
