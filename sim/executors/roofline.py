"""Operator pricing: a roofline with shape-aware efficiency, shared by the executor and the calibrator.

One GEMM ``[M, K] x [K, N]`` (M tokens, K inputs, N outputs, ``b`` bytes per element) costs

    flops  = 2 * M * N * K
    bytes  = b * (K * N + M * K + M * N)            weights read once, activations in and out
             (weight-only quantized weights, ``weight_bytes`` = w a weight: w * K * N + b * (M * K + M * N);
             the GEMM dequantizes them and multiplies at the activations' rate, ``peak``)
    t_c    = flops_q / (peak * compute_eff)          compute time
    t_m    = bytes / (bandwidth * memory_eff)        memory time
    t      = (t_c**p + t_m**p) ** (1/p) + latency    a smooth max (p -> inf is the plain max)

Shape awareness (``CostParams.tiles``, a list of ``[tile_m, tile_n, eff]``) prices the compute the
way a GEMM library runs it: output tiles spread over the SMs in waves, and the library picks the
tile shape that finishes first. For each candidate tile:

    tiles    = ceil(M / tile_m) * ceil(N / tile_n)   tile quantization: partial tiles cost full tiles
    waves    = q x ceil(tiles / num_sms) + (1 - q) x tiles / num_sms
               wave quantization: a partial last wave costs a fraction q (``wave_quant``) of a full one;
               q = 1 is classic data-parallel tiling, q = 0 perfect balancing (stream-K / persistent
               kernels, which Hopper cuBLAS uses, split the tail's K loop over the idle SMs);
               tiles / num_sms when tiles < num_sms: libraries split K over the idle SMs
    t_tile   = 2 * waves * num_sms * tile_m * tile_n * K / (peak * eff)
    t_c      = min over tiles of t_tile

Small tiles waste less on small or ragged shapes but reach a lower efficiency (fitted per tile), so
small GEMMs do not reach peak. On top of that, ``CostParams.gemm_correction`` (shape_correction.py) multiplies
the time by exp(r(M, N, K, operator)), a correction learned from measured shapes; empty, it changes nothing. The plain roofline of the brief is ``tiles = [], smooth_p = inf``. Every function
here accepts numpy arrays as well as scalars (the calibrator prices thousands of rows at once).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from sim.executors.shape_correction import factor, factor_scalar

# Streaming multiprocessors per GPU, from the NVIDIA datasheets (A100: 108, H100 SXM: 132, H200: 132,
# L40S: 142); a CPU has no waves to quantize, so 1.
DEFAULT_NUM_SMS = {"a100-40gb": 108, "a100-80gb": 108, "h100-80gb": 132, "h200-141gb": 132, "l40s": 142, "cpu": 1}


@dataclass(slots=True)
class CostParams:
    """Fitted (or default) efficiencies and latencies of one piece of hardware.

    Invariants: efficiencies are in (0, 1.5]; latencies and overheads are >= 0; ``smooth_p >= 1``;
    ``0 <= wave_quant <= 1``.
    An empty ``tiles`` switches tile and wave quantization off (``compute_eff`` applies instead).
    """

    compute_eff: float = 0.7          # fraction of peak FLOP/s a large GEMM reaches
    memory_eff: float = 0.8           # fraction of HBM bandwidth a streaming kernel reaches
    kernel_latency_s: float = 5e-6    # launch + tail of one kernel
    step_overhead_s: float = 2e-3     # scheduler, sampling, Python: once per engine step
    smooth_p: float = math.inf        # exponent of the smooth max of compute and memory time
    tiles: list[list[float]] = field(default_factory=list)  # [tile_m, tile_n, eff]; []: plain roofline
    num_sms: int = 108                # SMs for wave quantization
    wave_quant: float = 1.0           # fraction of a partial last wave that costs a full wave (0..1)
    attn_compute_eff: float = 0.5     # FlashAttention-style prefill reaches less than a GEMM
    attn_memory_eff: float = 0.7      # paged decode attention reading KV blocks
    attn_kv_read_eff: float = 0.7     # reading cached K/V through block tables (decode, and prefill context)
    attn_seq_latency_s: float = 0.0   # per decode sequence per layer (block-table walk; large on the CPU path)
    attn_prefill_seq_latency_s: float = 0.0  # per prefill sequence per layer
    elementwise_eff: float = 0.6      # norms, rope, activation, residual add (memory bound)
    elementwise_effs: dict[str, float] = field(default_factory=dict)  # per operator, overrides the above
    elementwise_latency_s: float = 5e-6  # launch + tail of one small elementwise kernel
    swap_block_latency_s: float = 1e-5  # per block moved over the host link
    allreduce_latency_s: float = 0.0  # extra fixed latency per all-reduce (beyond the link latency)
    allreduce_eff: float = 0.8        # fraction of interconnect bandwidth a ring all-reduce reaches
    # measured all-reduce times: {"tp": [[bytes, seconds], ...]} sorted by bytes; replaces the ring formula
    allreduce_table: dict[str, list[list[float]]] = field(default_factory=dict)
    # learned log(measured / roofline) of GEMMs per shape (shape_correction.py); {}: none
    gemm_correction: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown cost parameters: {', '.join(unknown)}")
        params = cls(**data)
        params.smooth_p = float(params.smooth_p)
        params.tiles = [[int(t[0]), int(t[1]), float(t[2])] for t in params.tiles]
        return params

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if math.isinf(out["smooth_p"]):
            out["smooth_p"] = 1e9  # JSON has no infinity
        return out


def smooth_max(a: Any, b: Any, p: float) -> Any:
    """(a^p + b^p)^(1/p): equals max(a, b) as p -> inf, and at most 2^(1/p) x the max."""
    if p >= 64:
        return np.maximum(a, b)
    hi = np.maximum(a, b)
    safe = np.where(hi > 0, hi, 1.0)
    return safe * ((a / safe) ** p + (b / safe) ** p) ** (1.0 / p) * (hi > 0)


def gemm_time(m: Any, n: int | Any, k: int | Any, peak: float, bandwidth: float, dtype_bytes: int,
              params: CostParams, op: Any = None, weight_bytes: float | None = None) -> Any:
    """Seconds for one ``[m, k] x [k, n]`` GEMM, with the formulas of the module docstring; ``op`` names the
    operator (or an array of names; None: unknown), which only the learned correction uses; ``weight_bytes``:
    bytes a weight where they are stored narrower than the activations (None: ``dtype_bytes``)."""
    m = np.asarray(m, dtype=float)
    if params.tiles:
        sms, q = params.num_sms, params.wave_quant
        n_f = np.asarray(n, dtype=float)
        t_c = None
        for tm, tn, eff in params.tiles:
            tiles = np.ceil(m / tm) * np.ceil(n_f / tn)
            # fewer tiles than SMs: split-K spreads the reduction over the idle SMs (no partial wave)
            waves = np.where(tiles >= sms, q * np.ceil(tiles / sms) + (1.0 - q) * (tiles / sms), tiles / sms)
            t_tile = 2.0 * waves * sms * tm * tn * k / (peak * eff)
            t_c = t_tile if t_c is None else np.minimum(t_c, t_tile)
    else:
        t_c = 2.0 * m * n * k / (peak * params.compute_eff)
    t_m = _traffic(1, m, n, k, dtype_bytes, weight_bytes) / (bandwidth * params.memory_eff)
    t = smooth_max(t_c, t_m, params.smooth_p) + params.kernel_latency_s
    return t * factor(params.gemm_correction, m, n, k, op) if params.gemm_correction else t


def gemm_time_scalar(m: int, n: int, k: int, peak: float, bandwidth: float, dtype_bytes: int,
                     params: CostParams, op: str | None = None, weight_bytes: float | None = None) -> float:
    """``gemm_time`` for plain Python numbers (about 20x faster than numpy on scalars); same formulas."""
    t = _launch_time(1, m, n, k, peak, bandwidth, dtype_bytes, params, weight_bytes=weight_bytes)
    return t * factor_scalar(params.gemm_correction, m, n, k, op) if params.gemm_correction else t


def grouped_gemm_time_scalar(groups: float, m: float, n: int, k: int, peak: float, bandwidth: float,
                             dtype_bytes: int, params: CostParams, tile_eff: float = 1.0,
                             weight_bytes: float | None = None,
                             row_tiles: Callable[[int], float] | None = None) -> float:
    """Seconds for one launch of ``groups`` independent ``[m, k] x [k, n]`` GEMMs (a fused mixture-of-experts
    kernel: each active expert's rows against its own weights). The module's formulas with every group's
    tiles in the same waves and every group's weights and activations in the bytes; ``groups`` and ``m``
    may be expected (fractional) counts. No learned correction: the corrections were measured on dense
    library GEMMs, not on grouped kernels; ``tile_eff`` scales the tiles' compute efficiencies instead (the
    grouped kernel's share of the library's, fitted to that kernel's own timings: EngineParams.moe_tile_eff).
    ``row_tiles``: a group's expected row tiles for a tile height (its rows random about the mean ``m``:
    sim/executors/expert_rows.py), instead of ceil(m / height).
    Invariant: at least the groups' bytes at full bandwidth x ``memory_eff``, plus one kernel latency."""
    return _launch_time(groups, m, n, k, peak, bandwidth, dtype_bytes, params, tile_eff, weight_bytes, row_tiles)


def _traffic(groups: Any, m: Any, n: Any, k: Any, dtype_bytes: int, weight_bytes: float | None) -> Any:
    """Bytes a launch of ``groups`` GEMMs moves: weights, activations in and out (the module's ``bytes``)."""
    if weight_bytes is None:
        return dtype_bytes * groups * (k * n + m * k + m * n)
    return groups * (weight_bytes * k * n + dtype_bytes * (m * k + m * n))


def _launch_time(groups: float, m: float, n: int, k: int, peak: float, bandwidth: float, dtype_bytes: int,
                 params: CostParams, tile_eff: float = 1.0, weight_bytes: float | None = None,
                 row_tiles: Callable[[int], float] | None = None) -> float:
    """The module's formulas for one launch of ``groups`` ``[m, k] x [k, n]`` GEMMs, latency included, no
    learned correction (``groups = 1``: one GEMM); every compute efficiency times ``tile_eff``; ``row_tiles``
    (a tile height -> a group's expected row tiles) replaces ceil(m / height)."""
    if params.tiles:
        sms, q = params.num_sms, params.wave_quant
        t_c = math.inf
        for tm, tn, eff in params.tiles:
            rows = math.ceil(m / tm) if row_tiles is None else row_tiles(tm)
            tiles = groups * rows * math.ceil(n / tn)
            waves = q * math.ceil(tiles / sms) + (1.0 - q) * (tiles / sms) if tiles >= sms else tiles / sms
            t_c = min(t_c, 2.0 * waves * sms * tm * tn * k / (peak * eff * tile_eff))
    else:
        t_c = 2.0 * groups * m * n * k / (peak * params.compute_eff * tile_eff)
    t_m = _traffic(groups, m, n, k, dtype_bytes, weight_bytes) / (bandwidth * params.memory_eff)
    p = params.smooth_p
    hi = max(t_c, t_m)
    if p < 64 and hi > 0:
        hi *= ((t_c / hi) ** p + (t_m / hi) ** p) ** (1.0 / p)
    return hi + params.kernel_latency_s


def roofline_time(flops: Any, nbytes: Any, peak: float, bandwidth: float, compute_eff: float,
                  memory_eff: float, latency_s: float) -> Any:
    """max(flops / (peak x compute_eff), bytes / (bandwidth x memory_eff)) + latency."""
    return np.maximum(flops / (peak * compute_eff), nbytes / (bandwidth * memory_eff)) + latency_s


def allreduce_time(nbytes: Any, tp: int, link_bandwidth: float, link_latency_s: float,
                   params: CostParams) -> Any:
    """Ring all-reduce over ``tp`` GPUs: 2 (t-1)/t x bytes / (bw x eff) + 2 (t-1) x link latency.

    Zero when ``tp == 1``. A ring moves each byte through 2 (t-1) hops, each paying the link latency.
    With a measured table for ``tp`` (``params.allreduce_table``), the time is interpolated linearly in
    bytes instead, and extrapolated beyond the largest size at the last point's bandwidth.
    """
    if tp <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float)
    table = params.allreduce_table.get(str(tp))
    if table:
        sizes = np.array([r[0] for r in table])
        times = np.array([r[1] for r in table])
        x = np.asarray(nbytes, dtype=float)
        return np.where(x <= sizes[-1], np.interp(x, sizes, times), times[-1] * x / sizes[-1])
    bw = link_bandwidth if link_bandwidth > 0 else 16e9  # no NVLink: assume PCIe-class peer traffic
    return (2.0 * (tp - 1) / tp * np.asarray(nbytes, dtype=float) / (bw * params.allreduce_eff)
            + 2 * (tp - 1) * link_latency_s + params.allreduce_latency_s)
