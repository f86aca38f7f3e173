"""The scenario's ``cluster:`` section (pydantic, extra="forbid").

Three shapes, exclusive:

    cluster: {replicas: 4, router: {policy: round_robin, overhead_s: 0.0}}            # colocated
    cluster: {groups: [{replicas: 2, hardware: h100-80gb},                            # colocated, mixed
                       {replicas: 4, hardware: a100-80gb, tensor_parallel: 2}],
              router: {policy: least_requests}}
    cluster: {prefill: {replicas: 2}, decode: {replicas: 6},                          # disaggregated
              kv_transfer: {link: infiniband-400g}, router: {policy: least_requests}}
    cluster: {replicas: 8, data_parallel: true, router: {policy: dp_balance}}   # one data-parallel engine
    cluster: {replicas: 16, data_parallel: true, data_parallel_size: 8}        # two engines of 8 ranks
    (a prefill or decode pool takes data_parallel and data_parallel_size too)

A pool, or a group of a mixed colocated fleet, may override ``hardware``, ``tensor_parallel``, ``kv_cache``
and ``scheduler`` (the last two key by key over the scenario's own); one router spreads the requests over
every group's replicas, numbered group after group. A link is a preset name or ``{bandwidth_gb_s, latency_s}``;
``kv_transfer.mode`` is ``pull`` (the decode side allocates, then reads the KV) or ``push`` (sim/cluster/disagg.py);
``kv_transfer.layerwise`` (push only) streams the KV layer by layer while the prefill runs.
Invariants: at least one replica per pool and per group; a prefill pool always has a decode pool and
back; ``kv_transfer`` only with pools; ``groups: [{replicas: N}]`` is ``replicas: N``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.specs import LINK_PRESETS, HardwareSpec, check_preset, complete_from_preset

ROUTER_POLICIES = ("round_robin", "random", "least_requests", "least_kv", "power_of_two", "prefix_affinity",
                   "session", "lora_affinity", "dp_balance")



class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RouterConfig(_Strict):
    """The global scheduler in front of the replicas (sim/cluster/routers.py)."""

    policy: Literal["round_robin", "random", "least_requests", "least_kv", "power_of_two", "prefix_affinity",
                    "session", "lora_affinity", "dp_balance"] = "round_robin"
    overhead_s: float = Field(default=0.0, ge=0, le=60)   # the router's decision time, before the replica
    # prefix_affinity, lora_affinity: a replica whose load (queued + running requests) exceeds the least loaded
    # one's by more than this is not considered, however much of the prompt it has cached or whichever adapters
    # it holds
    load_slack: int = Field(default=8, ge=0)


class LinkConfig(_Strict):
    bandwidth_gb_s: float = Field(gt=0)
    latency_s: float = Field(default=0.0, ge=0)


class KVTransferConfig(_Strict):
    link: str | LinkConfig = "infiniband-400g"
    # pull (vLLM's KV connectors, e.g. NIXL): the decode replica first allocates blocks for the prompt and the
    # next token, then reads the KV, which the prefill replica holds until then; push (a KV store between the
    # pools, e.g. Mooncake's): the KV leaves as soon as the prefill ends, the decode side allocates on admission
    mode: Literal["pull", "push"] = "pull"
    # push only: each layer's KV leaves while the prefill computes the next (layer-wise connectors, e.g.
    # LMCache's or vLLM's P2P NCCL one), so the transfer overlaps the prefill (sim/cluster/link.py)
    layerwise: bool = False

    @model_validator(mode="after")
    def _layerwise_pushes(self) -> KVTransferConfig:
        if self.layerwise and self.mode != "push":
            raise ValueError("layerwise: only with mode push (pulled KV is read after the decode side has "
                             "allocated for it, once the prefill has ended)")
        return self

    @field_validator("link")
    @classmethod
    def _preset(cls, v: str | LinkConfig) -> str | LinkConfig:
        if isinstance(v, str) and v not in LINK_PRESETS:
            raise ValueError(f"unknown link {v!r}; known: {', '.join(LINK_PRESETS)} or {{bandwidth_gb_s, latency_s}}")
        return v

    def bandwidth_latency(self) -> tuple[float, float]:
        """(bytes per second, seconds)."""
        if isinstance(self.link, str):
            bw, lat = LINK_PRESETS[self.link]
        else:
            bw, lat = self.link.bandwidth_gb_s, self.link.latency_s
        return bw * 1e9, lat


def _check_partial(section: str, v: dict[str, Any] | None) -> dict[str, Any] | None:
    """Validate a pool's partial ``kv_cache`` or ``scheduler`` against the scenario's own schema."""
    if v is None:
        return v
    from sim.scenario import KVCacheConfig, SchedulerConfig  # lazy: sim.scenario imports this module

    model = {"kv_cache": KVCacheConfig, "scheduler": SchedulerConfig}[section]
    try:
        model.model_validate(v)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{key}: {msg}") from None
    return v


def _check_engines(data_parallel: bool, size: int | None, replicas: int | None) -> None:
    """``data_parallel_size`` (the ranks of each data-parallel engine) only with ``data_parallel``, and
    dividing the replicas."""
    if size is not None and not data_parallel:
        raise ValueError("data_parallel_size: the ranks of each data-parallel engine; give it with data_parallel: true")
    if size is not None and replicas is not None and replicas % size:
        raise ValueError(f"data_parallel_size: {replicas} replicas do not split into engines of {size} ranks "
                         "(give a multiple of it)")


class PoolConfig(_Strict):
    """One pool of identical replicas: prefill, decode, or a group of a mixed colocated fleet."""

    replicas: int = Field(ge=1)
    hardware: str | HardwareSpec | None = None
    tensor_parallel: int | None = Field(default=None, ge=1)
    kv_cache: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    # a prefill or decode pool's replicas as the ranks of one data-parallel engine (sim/cluster/data_parallel.py),
    # or of several of data_parallel_size ranks each
    data_parallel: bool = False
    data_parallel_size: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _engines(self) -> PoolConfig:
        _check_engines(self.data_parallel, self.data_parallel_size, self.replicas)
        return self

    @property
    def ranks_per_engine(self) -> int:
        """The ranks of each data-parallel engine of the pool (``data_parallel``; 1: none)."""
        return (self.data_parallel_size or self.replicas) if self.data_parallel else 1

    @field_validator("hardware", mode="before")
    @classmethod
    def _hardware_from_preset(cls, v: Any) -> Any:
        return complete_from_preset(v, HardwareSpec)

    @field_validator("hardware")
    @classmethod
    def _hardware_preset(cls, v: str | HardwareSpec | None) -> str | HardwareSpec | None:
        return check_preset(v, HardwareSpec)

    @field_validator("kv_cache")
    @classmethod
    def _kv(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_partial("kv_cache", v)

    @field_validator("scheduler")
    @classmethod
    def _sched(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return _check_partial("scheduler", v)


class ClusterConfig(_Strict):
    replicas: int | None = Field(default=None, ge=1)
    # a colocated fleet of mixed replicas: each group its own hardware, tensor_parallel, kv_cache, scheduler
    groups: list[PoolConfig] | None = Field(default=None, min_length=1)
    router: RouterConfig = RouterConfig()
    prefill: PoolConfig | None = None
    decode: PoolConfig | None = None
    kv_transfer: KVTransferConfig | None = None
    # the replicas are the ranks of one data-parallel engine of a mixture of experts (vLLM's
    # --data-parallel-size): attention on each rank's own requests, the expert layers over every rank's GPUs,
    # all ranks stepping together (sim/cluster/data_parallel.py)
    data_parallel: bool = False
    # with data_parallel: the ranks of each engine (vLLM's --data-parallel-size); the replicas are then
    # replicas / data_parallel_size such engines side by side behind the router (None: one engine of them all)
    data_parallel_size: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _shape(self) -> ClusterConfig:
        pools = (self.prefill is not None, self.decode is not None)
        if pools[0] != pools[1]:
            have, lack = ("prefill", "decode") if pools[0] else ("decode", "prefill")
            raise ValueError(f"a {have} pool needs a {lack} pool")
        given = [name for name, there in (("replicas", self.replicas is not None), ("groups", self.groups is not None),
                                          ("prefill and decode pools", pools[0])) if there]
        if len(given) > 1:
            raise ValueError(f"give one of replicas (colocated), groups (colocated, mixed) or prefill and decode "
                             f"pools, not {' with '.join(given)}")
        if not given:
            raise ValueError("give replicas (colocated), groups (colocated, mixed) or prefill and decode pools")
        if self.kv_transfer is not None and not pools[0]:
            raise ValueError("kv_transfer applies to prefill and decode pools")
        if self.data_parallel and self.replicas is None:
            raise ValueError("data_parallel: the ranks of one data-parallel engine are given as replicas (N ranks), "
                             "or as a prefill or decode pool's replicas (prefill: {replicas: N, data_parallel: true})")
        _check_engines(self.data_parallel, self.data_parallel_size, self.replicas)
        if self.groups is not None and any(g.data_parallel for g in self.groups):
            raise ValueError("groups: a mixed fleet's groups are plain replicas; data_parallel is for the cluster's "
                             "replicas or a prefill or decode pool")
        return self

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None

    @property
    def ranks_per_engine(self) -> int:
        """The ranks of each data-parallel engine of the cluster's replicas (``data_parallel``; 1: none)."""
        return (self.data_parallel_size or int(self.replicas or 1)) if self.data_parallel else 1

    @property
    def num_replicas(self) -> int:
        if self.prefill is not None and self.decode is not None:
            return self.prefill.replicas + self.decode.replicas
        if self.groups is not None:
            return sum(g.replicas for g in self.groups)
        return int(self.replicas or 1)

    def colocated_groups(self) -> list[tuple[PoolConfig | None, range]]:
        """A colocated fleet's groups, each with its replicas' ids (numbered group after group); one group
        of the scenario's own replicas (None: no overrides) without ``groups``."""
        if self.groups is None:
            return [(None, range(self.num_replicas))]
        out, at = [], 0
        for g in self.groups:
            out.append((g, range(at, at + g.replicas)))
            at += g.replicas
        return out

    @property
    def link(self) -> KVTransferConfig:
        return self.kv_transfer or KVTransferConfig()
