"""The engine-level terms of a step: what a real serving engine (vLLM v1) adds to, or removes from, the
sum of isolated operators that the per-operator calibration prices.

    decode-only step, CUDA graphs on, batch <= graph_max_tokens   (a full graph: every kernel replayed)
        padded  = the next capture size >= batch (vLLM pads a decode batch up to a captured size)
        kernels cost graph_kernel_s each instead of their isolated launch/tail latency
    mixed step with tokens <= graph_max_tokens                    (piecewise graphs: attention eager)
        padded  = the next capture size >= tokens; attention kernels keep their isolated latency and
        cost eager_op_s of CPU each
    larger steps, or CUDA graphs off                              (eager: every op launched from Python)
        padded  = tokens; every kernel keeps its isolated latency; eager_op_s of CPU per op

    gpu  = layers x (GEMMs(padded) + attention + fused elementwise(padded) + 2 all-reduces(padded))
           + LM head(sequences) + sampler_s
    cpu  = cpu_step_s + cpu_seq_s x sequences + eager_op_s x eager ops
    step = max(gpu, cpu) + step_gap_s     when overlap_cpu (async scheduling)
         = gpu + cpu + step_gap_s          otherwise (also with scheduler.async_scheduling: false)

Attention of a decode sequence with context c reads its K and V at an efficiency that grows with c,

    eff(c) = attn_kv_read_eff x c / (c + attn_half_ctx)      (short contexts leave the SMs idle)

so its time is (c + attn_half_ctx) x KV bytes per token / (bandwidth x attn_kv_read_eff): linear in the
context, with a per-sequence cost that a batch sum can carry in closed form.

All-reduces of at most custom_ar_max_bytes over t = 2, 4, 6 or 8 GPUs (the world sizes vLLM's kernel
takes) use vLLM's custom all-reduce over NVLink (one or two shots, latency-bound):
custom_ar_latency_s + custom_ar_peer_s x (min(t, custom_ar_growth_until_tp) - 2) + 2 (t-1)/t x bytes /
(NVLink bandwidth x custom_ar_eff). The growth per GPU is fitted on TP 2 and TP 4 runs and stops there:
vLLM's kernel measured on 8 H100s takes 9.1 / 10.1 us for 512 elements at TP 4 / 8, 40.2 / 45.0 us for
1 Mi (SGLang PR 2904's table), where the bandwidth term's 2 (t-1)/t alone gives a 17% rise from TP 4 to 8.
Larger messages, or other GPU counts, use the NCCL table of the per-operator calibration.

Fused elementwise kernels (vLLM's fused residual-add + RMSNorm twice, rotary embedding, KV-cache write,
SiLU-and-mul): 5 kernels a layer moving b x (8 H + 2 (q + kv) + 4 kv + 3 I/t) bytes a token.

A mixture-of-experts MLP runs as vLLM's fused MoE Triton kernel: the router GEMM, the top-k softmax, the
alignment of tokens to experts' blocks, one grouped launch for the experts' up projections, SiLU-and-mul,
one for their down projections, and the sum over each token's k experts (MOE_AUX_KERNELS: the three small
ones besides the GEMMs and the activation). Its tiles reach moe_tile_eff of the library GEMMs' compute
efficiency (the Triton kernel gathers its rows by expert); fitted to vLLM's own benchmark of the kernel
(sim/data/kernels/, scripts/fit_moe_kernel.py).

Which defaults are fitted and to what is written in docs/fidelity.md; scripts/fit_engine.py refits them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

FUSED_ELEMENTWISE_KERNELS = 5   # 2 x fused add+RMSNorm, rotary, KV-cache write, SiLU-and-mul
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)   # vLLM's custom all-reduce (its _SUPPORTED_WORLD_SIZES)
EAGER_OPS_PER_LAYER = 14        # Python-dispatched ops of one layer without graphs (norms, GEMMs, views...)
ATTENTION_OPS_PER_LAYER = 2     # the eager part of a piecewise graph: KV-cache write + attention
MOE_AUX_KERNELS = 3             # a fused MoE layer's top-k softmax, block alignment and sum over the k experts
SHARED_EXPERT_KERNELS = 2       # shared experts' SiLU-and-mul and the sum of their output into the routed one


@dataclass(slots=True)
class EngineParams:
    """Engine-level step terms. Invariants: times >= 0; efficiencies in (0, 1.5]; graph_max_tokens >= 1."""

    cuda_graphs: bool = True
    graph_max_tokens: int = 512        # largest captured size (vLLM: min(2 x max_num_seqs, 512))
    graph_kernel_s: float = 1.5e-6     # one kernel inside a replayed graph (gap + ramp)
    step_gap_s: float = 1e-4           # per step, never hidden: graph launch, input copy, sampler sync
    sampler_s: float = 5e-5            # GPU sampling kernels per step
    cpu_step_s: float = 6e-4           # CPU per step: schedule, prepare inputs, process outputs
    cpu_seq_s: float = 4e-6            # CPU per scheduled sequence per step
    eager_op_s: float = 8e-6           # CPU to dispatch one eager PyTorch op
    overlap_cpu: bool = True           # async scheduling hides the CPU under the GPU
    attn_kv_read_eff: float = 0.9      # paged decode attention, long contexts, fraction of HBM bandwidth
    attn_half_ctx: float = 128.0       # context (tokens) at which decode attention reaches half of that
    custom_allreduce: bool = True
    custom_ar_max_bytes: float = 8 * 1024**2
    custom_ar_latency_s: float = 8e-6   # one custom all-reduce between 2 GPUs
    custom_ar_peer_s: float = 2e-6      # added per GPU beyond 2 (every rank signals and reads each peer)
    custom_ar_growth_until_tp: int = 4  # ... up to this many GPUs (the largest TP the growth was fitted on)
    custom_ar_eff: float = 0.5
    moe_tile_eff: float = 1.0           # fused MoE kernel: its tiles' compute efficiency over the library GEMMs'

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown engine parameters: {', '.join(unknown)}")
        params = cls(**data)
        for f in fields(cls):
            v = getattr(params, f.name)
            if isinstance(v, float) and (not math.isfinite(v) or v < 0):
                raise ValueError(f"engine parameter {f.name} must be a finite number >= 0, got {v}")
        return params

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def capture_sizes(max_tokens: int) -> list[int]:
    """vLLM's CUDA-graph capture sizes: 1, 2, 4, then multiples of 8 below 256, of 16 from 256 on, up to
    ``max_tokens``, which is always captured (the largest size is the limit itself)."""
    sizes = [s for s in (1, 2, 4) if s <= max_tokens]
    sizes += list(range(8, min(256, max_tokens + 1), 8)) + list(range(256, max_tokens + 1, 16))
    if not sizes or sizes[-1] < max_tokens:
        sizes.append(max_tokens)
    return sizes


def graph_max_tokens_for(max_num_seqs: int) -> int:
    """vLLM's default largest capture size for a server with ``max_num_seqs`` seats."""
    return min(2 * max_num_seqs, 512)
