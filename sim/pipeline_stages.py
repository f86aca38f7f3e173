"""Pipeline stages (``hardware.pipeline_parallel``): which layers each stage holds, its weights and its KV.

vLLM splits the decoder layers into ``p`` stages as ``get_pp_indices`` does: ``L // p`` layers each, the
remainder one more each on the stages before the last (the last also holds the LM head). The first stage
holds the token embedding, the last the final norm and the LM head (a tied LM head is a copy of the
embedding there). Each stage is a tensor-parallel group of its own GPUs.

KV cache: every stage keeps the KV of its own layers for the same blocks (a block table is the model's),
so the blocks that fit are those of the tightest stage: (its GPUs' usable HBM - its weights - its activation
reserve) / (a block's KV of its layers), as vLLM takes the least of its workers' block counts.

Invariants: the stages' layers sum to L, each at least 1 (p <= L); with p = 1 the one stage is the model.
"""

from __future__ import annotations

import math

from sim.specs import (
    GiB,
    HardwareSpec,
    ModelSpec,
    activation_reserve,
    expert_placement_excess,
    group_kv_bytes_per_block,
)


def stage_layers(num_layers: int, stages: int) -> list[int]:
    """Layers of each stage, first to last (vLLM's ``get_pp_indices``)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"{stages} pipeline stages for {num_layers} layers: each stage needs a layer")
    parts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        parts[-i] += 1
    return parts


def stage_model(model: ModelSpec, layers: int, index: int, stages: int) -> ModelSpec:
    """``model`` cut to one stage's ``layers`` (named after the stage: the cost model's memo of prices is
    keyed by the model, and a stage without the LM head prices steps differently)."""
    if stages == 1:
        return model
    return model.model_copy(update={"num_layers": layers, "name": f"{model.name} [stage {index + 1}/{stages}]"})


def stage_weight_bytes(model: ModelSpec, stages: int) -> list[int]:
    """Bytes of weights on each stage (over its tensor-parallel group): its layers, the embedding on the
    first, the final norm and the LM head on the last."""
    if stages == 1:
        return [model.weight_bytes()]
    emb = model.vocab_size * model.hidden_size * model.activation_bytes   # (unquantized under W8A8 too)
    norm = model.hidden_size * model.activation_bytes
    out = []
    for i, layers in enumerate(stage_layers(model.num_layers, stages)):
        # a stage's layers alone: the weights of a model of that many layers, less its embedding, head and norm
        cut = model.model_copy(update={"num_layers": layers, "tied_embeddings": True})
        body = cut.weight_bytes() - emb - norm
        out.append(body + (emb if i == 0 else 0) + (emb + norm if i == stages - 1 else 0))
    return out


def stage_block_bytes(model: ModelSpec, hardware: HardwareSpec, block_size: int) -> list[float]:
    """Each stage's KV bytes for one block (over its group): its share of the model's layers."""
    whole = group_kv_bytes_per_block(model, hardware, block_size)
    return [whole * layers / model.num_layers for layers in stage_layers(model.num_layers, hardware.pipeline_parallel)]


def pipeline_capacity_blocks(model: ModelSpec, hardware: HardwareSpec, block_size: int,
                             gpu_memory_utilization: float, activation_reserve_bytes: int | None) -> int:
    """The blocks every stage can hold (the tightest stage's count). ``activation_reserve_bytes`` is over the
    replica (each stage keeps its share); by default 5% of each stage's usable HBM. Raises ValueError naming
    the first stage whose weights do not fit."""
    stages = hardware.pipeline_parallel
    usable = hardware.hbm_bytes * gpu_memory_utilization * hardware.tensor_parallel
    reserve = activation_reserve(usable, None if activation_reserve_bytes is None else activation_reserve_bytes / stages)
    counts = []
    weights = stage_weight_bytes(model, stages)
    layers = stage_layers(model.num_layers, stages)
    for i, (w, per_block) in enumerate(zip(weights, stage_block_bytes(model, hardware, block_size))):
        # (an uneven placement of experts: each stage's GPUs sized by its fullest, sim/expert_parallel.py)
        free = usable - w - reserve - expert_placement_excess(model.model_copy(update={"num_layers": layers[i]}),
                                                              hardware)
        if free <= 0:
            raise ValueError(f"pipeline stage {i + 1} of {stages}'s weights ({w / GiB:.1f} GiB) do not fit in "
                             f"{hardware.tensor_parallel} x {hardware.name} at gpu_memory_utilization="
                             f"{gpu_memory_utilization}")
        counts.append(math.floor(free / per_block))
    return min(counts)


def pipeline_hbm_budget(model: ModelSpec, hardware: HardwareSpec, block_size: int, num_blocks: int,
                        gpu_memory_utilization: float, activation_reserve_bytes: int | None) -> dict[str, int]:
    """``hbm_budget`` of a pipeline: bytes over every GPU of the replica (weights of every stage, a tied LM
    head counted on the last stage too; each stage's reserve; ``num_blocks`` blocks of every layer)."""
    stages = hardware.pipeline_parallel
    total = hardware.hbm_bytes * hardware.gpus
    weights = sum(stage_weight_bytes(model, stages))
    per_stage = hardware.hbm_bytes * hardware.tensor_parallel * gpu_memory_utilization
    reserve = round(stages * activation_reserve(
        per_stage, None if activation_reserve_bytes is None else activation_reserve_bytes / stages))
    kv = num_blocks * group_kv_bytes_per_block(model, hardware, block_size)
    return {"gpus": hardware.gpus, "hbm_bytes": total, "weights_bytes": weights, "activation_reserve_bytes": reserve,
            "kv_cache_bytes": kv, "unused_bytes": total - weights - reserve - kv}
