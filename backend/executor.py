"""GPUExecutor: the simulator's Executor over the real backend (``executor.kind: gpu``).

``execute(plan)`` swaps out, swaps in, copies (in that order: a swap-out frees device blocks before
a swap-in may reuse them), then runs the forward pass of the scheduled tokens and returns the
measured time: CUDA events on a GPU, wall clock on the CPU (``executor.device: cpu`` runs the
plain-torch reference kernels, so the whole path runs in CI). The breakdown has linear, attention,
swap, copy, other and, when ``executor.step_overhead_s`` is set, overhead; duration is their sum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.runner import SeqWork, StepRunner
from backend.shapes import ModelShape
from sim.errors import KvsimError
from sim.sched.plan import StepPlan, StepResult

# A CPU device pool is allocated lazily by the OS, but refuse pools that could never be touched.
CPU_POOL_LIMIT_BYTES = 8 * 1024**3


class GPUExecutor:
    """Runs StepPlans on a StepRunner; the plan is never mutated."""

    def __init__(self, runner: StepRunner, step_overhead_s: float = 0.0) -> None:
        self.runner = runner
        self.step_overhead_s = step_overhead_s
        self.num_steps = 0

    def describe(self) -> dict[str, Any]:
        """What runs the steps (a run summary's ``step_model``)."""
        return {"executor": "gpu", "device": str(getattr(self.runner, "device", "cuda"))}

    def execute(self, plan: StepPlan) -> StepResult:
        seqs = [SeqWork(s.num_new_tokens, s.num_context_tokens, s.block_ids) for s in plan.scheduled]
        timing = self.runner.run(seqs, plan.blocks_to_copy, plan.blocks_to_swap_out, plan.blocks_to_swap_in)
        breakdown = dict(timing.breakdown)
        if self.step_overhead_s:
            breakdown["overhead"] = self.step_overhead_s
        self.num_steps += 1
        return StepResult(duration_s=max(sum(breakdown.values()), 1e-9), breakdown=breakdown)


def make_gpu_executor(*, model: Any, hardware: Any, config: Any, kv: Any, num_gpu_blocks: int,
                      num_cpu_blocks: int, base_dir: Path | None = None, **_: Any) -> GPUExecutor:
    """The registry factory: builds the model (config.num_layers layers, seeded) and its KV pools."""
    if getattr(model, "num_experts", 0):
        raise KvsimError("executor.kind", f"the GPU backend runs dense models only; {model.name} is a mixture "
                         "of experts: price it with executor.kind: cost_model")
    if getattr(model, "kv_lora_rank", 0):
        raise KvsimError("executor.kind", f"the GPU backend runs multi-head attention only; {model.name} has latent "
                         "attention: price it with executor.kind: cost_model")
    if getattr(model, "local_layers", 0):
        raise KvsimError("model.sliding_window", f"the GPU backend's kernels attend the whole context; {model.name} "
                         "has sliding-window layers: price it with executor.kind: cost_model")
    if getattr(model, "weight_dtype", None) is not None:
        raise KvsimError("model.weight_dtype", f"the GPU backend multiplies weights in the model's dtype "
                         f"({model.dtype}); price {model.weight_dtype} weights with executor.kind: cost_model")
    if getattr(model, "kv_dtype", None) not in (None, model.dtype):
        raise KvsimError("kv_cache.dtype", f"the GPU backend keeps K and V in the model's dtype ({model.dtype}); "
                         f"price a {model.kv_dtype} KV cache with executor.kind: cost_model")
    shape = ModelShape.of(model)
    device = getattr(config, "device", "cuda")
    num_layers = getattr(config, "num_layers", None)
    layers = min(num_layers or shape.num_layers, shape.num_layers)
    block_bytes = 2 * layers * kv.block_size * shape.kv_size * (4 if device == "cpu" else 2)
    if device == "cpu" and num_gpu_blocks * block_bytes > CPU_POOL_LIMIT_BYTES:
        raise KvsimError("kv_cache.num_gpu_blocks",
                         f"{num_gpu_blocks} blocks need {num_gpu_blocks * block_bytes / 1024**3:.1f} GiB on the "
                         "CPU; set kv_cache.num_gpu_blocks (or executor.num_layers) smaller for executor.device: cpu")
    try:
        runner = StepRunner(shape, device=device, block_size=kv.block_size, num_gpu_blocks=num_gpu_blocks,
                            num_cpu_blocks=num_cpu_blocks, num_layers=num_layers,
                            seed=getattr(config, "seed", 0) or 0)
    except RuntimeError as e:
        raise KvsimError("executor.device", str(e)) from None
    return GPUExecutor(runner, step_overhead_s=getattr(config, "step_overhead_s", None) or 0.0)
