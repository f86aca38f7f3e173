"""Multi-LoRA serving: the scenario's ``lora`` section (vLLM's ``--enable-lora`` and its limits), the adapters
the requests name, what the adapters' GPU slots take from the KV cache, and where adapters are resident.

vLLM (v1) serves LoRA adapters beside one base model:

- **Slots**: the GPU holds ``max_loras`` adapter slots, each sized for ``max_lora_rank``: for every LoRA-wrapped
  projection of every layer (fused QKV, output, gate-and-up, down) an A of rank x input and a B of output x
  rank, sharded as the projection is (a column-parallel layer's A whole on each GPU and its B split, a
  row-parallel one's A split and B whole). They are allocated at start-up, before the KV cache is sized
  (``slot_bytes``).
- **Batches**: a step's batch holds requests of at most ``max_loras`` distinct adapters; a waiting request whose
  adapter would be one too many is skipped (it keeps its place) and later ones are considered (vLLM's
  scheduler; ``ContinuousScheduler._admit``).
- **Residency**: before a step runs, each adapter of its batch not in a GPU slot is loaded into one (the least
  recently used slot whose adapter the batch does not use): from the host cache of ``max_cpu_loras`` adapters
  (least recently used out), each GPU copying its share over its host link, or, not there, from disk first
  (``load_latency_s``, a fixed time: 50 ms by default, from a public measurement of PEFT's loads, not vLLM's;
  set it from your logs). The step waits for its loads (``AdapterCache``).
- **Kernels**: every LoRA-wrapped projection adds a shrink (x A) and an expand (. B) launch over the batch's
  adapter tokens, grouped by adapter, at the slots' ``max_lora_rank`` (the buffers' width; a smaller adapter is
  zero-padded) (``CostModelExecutor._lora_kernels``).

- **Prefix caching**: block hashes are keyed by the request's adapter (sim/workload/tokens.py ``root_hash``), so
  a cached block serves only requests of its adapter.

Adapters come from the section's population (``adapters`` of them, drawn per request with a uniform or Zipf
popularity from the scenario's seed, a ``share`` of the requests; the rest use the base model) or, with
``adapters: 0``, from the inline requests' own ``lora`` ids. Mixture-of-experts and latent-attention models,
pipeline stages, speculative decoding, swap preemption, static batching and prefill/decode pools are refused
with LoRA (not modelled).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.specs import ModelSpec

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # vLLM's accepted --max-lora-rank values


class LoraConfig(BaseModel):
    """``lora:``: vLLM's LoRA serving arguments, and the adapters the workload's requests name."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_loras: int = Field(default=1, ge=1, le=1024)            # --max-loras: adapters in one batch (GPU slots)
    max_lora_rank: int = Field(default=16, json_schema_extra={"enum": list(LORA_RANKS)})   # --max-lora-rank: the slots' rank
    max_cpu_loras: int | None = Field(default=None, ge=1, le=1_000_000)   # --max-cpu-loras (default max_loras)
    # an adapter's load from disk into host memory: a rank-16 adapter of a 7B model loads in 25-70 ms with PEFT
    # (huggingface/peft issue 981); vLLM's own load (safetensors into a LoRAModel) is of the same kind
    load_latency_s: float = Field(default=0.05, ge=0, le=3600)
    adapters: int = Field(default=8, ge=0, le=1_000_000)        # distinct adapters drawn (0: inline ``lora`` ids)
    adapter_rank: int | None = Field(default=None, ge=1, le=512)   # each adapter's rank (default max_lora_rank)
    popularity: Literal["uniform", "zipf"] = "zipf"             # how often each adapter is drawn
    zipf_exponent: float = Field(default=1.0, gt=0, le=10)      # adapter i (from 1) drawn in proportion to i^-s
    share: float = Field(default=1.0, ge=0, le=1)               # share of requests that name an adapter

    @model_validator(mode="after")
    def _limits(self) -> LoraConfig:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank: {self.max_lora_rank} is not one of vLLM's "
                             f"{', '.join(map(str, LORA_RANKS))}")
        if self.adapter_rank is not None and self.adapter_rank > self.max_lora_rank:
            raise ValueError(f"adapter_rank: {self.adapter_rank} exceeds max_lora_rank {self.max_lora_rank} "
                             "(vLLM refuses such an adapter)")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras: {self.max_cpu_loras} is below max_loras {self.max_loras} "
                             "(vLLM needs the host cache to hold a batch's adapters)")
        return self

    @property
    def host_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @property
    def rank(self) -> int:
        """Each adapter's own rank (what a load moves)."""
        return self.adapter_rank if self.adapter_rank is not None else self.max_lora_rank


def lora_problem(model: ModelSpec) -> str | None:
    """Why ``model``'s adapters are not modelled (None: they are): only dense, multi-head or grouped-query
    attention models' four projections a layer are."""
    if model.num_experts:
        return f"LoRA on {model.name}'s experts is not modelled (a dense model's projections are)"
    if model.latent_attention:
        return f"LoRA on {model.name}'s latent attention is not modelled (a dense model's projections are)"
    return None


def _projections(model: ModelSpec) -> list[tuple[int, int, bool]]:
    """One layer's LoRA-wrapped projections as (input, output, column-parallel): fused QKV, output, gate and up
    (or up), down, unsharded (``ModelSpec.projection_matrices`` of a dense model, whose four they are)."""
    return [(k, n, column) for (k, n, _), column in zip(model.projection_matrices(), (True, False, True, False),
                                                        strict=True)]


def lora_shapes(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(input, output) of each LoRA-wrapped projection of a layer on one of ``tp`` GPUs: the shrink reads the
    GPU's input (all of it for a column-parallel layer), the expand writes its output (all of it for a
    row-parallel one, whose shrink partial sums the base layer's all-reduce adds up)."""
    return [(k, -(-n // tp)) if column else (-(-k // tp), n) for k, n, column in _projections(model)]


def slot_bytes(model: ModelSpec, tp: int, rank: int) -> int:
    """Bytes of one adapter slot of rank ``rank`` on one of ``tp`` GPUs, over every layer: each projection's A
    (rank x its input there) and B (its output there x rank), in the model's dtype."""
    per_layer = sum(rank * (k + n) for k, n in lora_shapes(model, tp))
    return per_layer * model.num_layers * model.dtype_bytes


def gpu_lora_bytes(model: ModelSpec, tp: int, lora: LoraConfig) -> int:
    """Bytes the adapter slots take over a tensor-parallel group (``max_loras`` slots of ``max_lora_rank``)."""
    return lora.max_loras * slot_bytes(model, tp, lora.max_lora_rank) * tp


def draw_adapters(lora: LoraConfig, count: int, seed: int) -> np.ndarray:
    """Each of ``count`` requests' adapter id (-1: the base model), from a stream of the seed's own: a ``share``
    of them name one of ``adapters`` adapters, adapter i (0-based) with probability in proportion to
    (i + 1)^-s (Zipf) or evenly."""
    rng = np.random.default_rng([seed, 0x10A])
    ids = np.arange(lora.adapters)
    weights = (ids + 1.0) ** -lora.zipf_exponent if lora.popularity == "zipf" else np.ones(lora.adapters)
    picks = rng.choice(lora.adapters, size=count, p=weights / weights.sum())
    named = rng.random(count) < lora.share
    return np.where(named, picks, -1).astype(np.int64)


class AdapterCache:
    """Where adapters are: ``max_loras`` GPU slots and ``max_cpu_loras`` host entries, each least recently used
    out. ``activate`` makes a batch's adapters resident and says how long their loads take.

    Invariant: the GPU slots hold at most ``max_loras`` adapters, the host at most ``max_cpu_loras``, and every
    adapter of the last batch activated is in a GPU slot."""

    def __init__(self, lora: LoraConfig, model: ModelSpec, tp: int, host_link_bandwidth: float) -> None:
        self.lora = lora
        self.gpu: OrderedDict[int, None] = OrderedDict()
        self.host: OrderedDict[int, None] = OrderedDict()
        # host to GPU: each GPU of the group copies its share of the adapter (as its slot holds it), at once
        self.copy_s = slot_bytes(model, tp, lora.rank) / host_link_bandwidth
        self.gpu_loads = 0    # adapters copied into a GPU slot
        self.disk_loads = 0   # of those, read from disk first (not in the host cache)
        self.load_s = 0.0     # seconds steps waited for loads

    def activate(self, adapters: set[int]) -> float:
        """Seconds the loads of ``adapters`` (at most ``max_loras``) take before the step can run."""
        seconds = 0.0
        for a in sorted(adapters):
            if a in self.gpu:
                self.gpu.move_to_end(a)
                continue
            if a in self.host:
                self.host.move_to_end(a)
            else:
                seconds += self.lora.load_latency_s
                self.disk_loads += 1
                self.host[a] = None
                if len(self.host) > self.lora.host_slots:
                    self.host.popitem(last=False)
            seconds += self.copy_s
            self.gpu_loads += 1
            if len(self.gpu) >= self.lora.max_loras:   # (the oldest not in this batch: it uses at most max_loras)
                old = next(x for x in self.gpu if x not in adapters)
                del self.gpu[old]
            self.gpu[a] = None
        self.load_s += seconds
        return seconds


def lora_summary(caches: list[AdapterCache]) -> dict:
    """The summary's ``lora`` over one or more engines' adapter caches (a cluster's replicas): adapters copied
    into GPU slots, of those read from disk first, and the seconds steps waited for the loads."""
    return {"gpu_loads": sum(c.gpu_loads for c in caches), "disk_loads": sum(c.disk_loads for c in caches),
            "load_s": sum(c.load_s for c in caches)}


def add_lora_column(reqs, requests: list) -> None:
    """``lora_id`` of each request (-1: the base model) as a column of the requests table ``reqs`` (its rows in
    req_id order, as ``requests``)."""
    reqs["lora_id"] = np.fromiter((r.lora_id for r in requests), dtype=np.int64, count=len(requests))
