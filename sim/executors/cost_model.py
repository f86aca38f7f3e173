"""The analytical executor: prices one engine step with a roofline, without running anything.

Per step, with T = tokens computed, B = sequences scheduled, L = layers, t = tensor_parallel, b = dtype
bytes, H = hidden, I = intermediate, hd = head_dim, q = ceil(heads / t) x hd, kv = ceil(kv_heads / t) x hd:

    linear     = L x sum over (QKV: H -> q + 2kv, out: q -> H, up: H -> I/t (x2 gated), down: I/t -> H)
                 of gemm_time(T, N, K)  +  gemm_time(B, V/t, H) for the LM head on the sampled tokens
                 (every scheduled sequence counts as sampling one token)
    attention  = L x [prefill kernel + decode kernel], each max(flops / (peak x attn_compute_eff),
                 new bytes / (bw x attn_memory_eff) + cached bytes / (bw x attn_kv_read_eff)) + latency:
                   prefill flops = 4 x hd x heads/t x pairs, pairs = sum n x c + n (n + 1) / 2 (causal:
                                   each new token sees its context and the new tokens up to itself)
                   prefill bytes = b x (sum n x (2q + 2kv) + sum c x 2kv)   (Q, O, new K/V, cached K/V)
                   decode bytes  = b x sum (c + 1) x 2kv  (+ Q and O)       (the KV read dominates)
                 + decode seqs x attn_seq_latency + prefill seqs x attn_prefill_seq_latency
    elementwise= L x (T x b / bw x [2H / e_norm1 + 2 (q + kv) / e_rope + 2H / e_norm2 + 3 I/t / e_act
                 + 2 x 3H / e_add] + 6 x elementwise_latency)   (read + write of two norms, rope, the gated
                 activation (2 I/t with a plain MLP), two residual adds; e_* per-operator efficiencies)
    allreduce  = 2 L x ring all-reduce of T x H x b bytes (after attention and after the MLP), t > 1
    swap       = (blocks out + blocks in) x (block bytes / t / host_link_bandwidth + swap_block_latency)
    copy       = blocks copied x 2 x block bytes / t / HBM bandwidth   (read the source, write the copy)
    overhead   = step_overhead_s

``duration_s`` is the sum of the breakdown. ``gemm_time`` (roofline.py) holds the GEMM formulas.
Everything that depends only on the model is computed at construction; ``execute`` runs one loop over
the batch and looks the linear time up in a per-token-count cache.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.errors import KvsimError
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams, allreduce_time, gemm_time_scalar
from sim.sched.plan import StepPlan, StepResult
from sim.specs import HardwareSpec, ModelSpec

ELEMENTWISE_KERNELS = 6
DATA_DIR = Path(__file__).resolve().parent.parent / "data"  # package data: sim/data


def linear_shapes(model: ModelSpec, tp: int) -> list[tuple[str, int, int]]:
    """(operator, K inputs, N outputs) of one layer's GEMMs on one TP shard (Vidur's operator names)."""
    hd = model.head_dim
    q = math.ceil(model.num_heads / tp) * hd
    kv = math.ceil(model.num_kv_heads / tp) * hd
    inter = model.intermediate_size // tp
    return [
        ("attn_pre_proj", model.hidden_size, q + 2 * kv),
        ("attn_post_proj", q, model.hidden_size),
        ("mlp_up_proj", model.hidden_size, inter * (2 if model.gated_mlp else 1)),
        ("mlp_down_proj", inter, model.hidden_size),
    ]


def shipped_calibration(name: str) -> Path | None:
    """The calibration file shipped for hardware ``name`` (sim/data/calibration/NAME.json), if any."""
    path = DATA_DIR / "calibration" / f"{name.lower()}.json"
    return path if path.is_file() else None


def load_calibration(ref: str, base_dir: Path | None = None) -> tuple[CostParams, dict[str, Any]]:
    """Read a calibration: a JSON path (relative to ``base_dir``) or a bare shipped hardware name."""
    path = Path(ref)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        shipped = shipped_calibration(ref)
        if shipped is None:
            raise KvsimError("executor.calibration", f"no calibration file {str(path)!r} and no shipped one "
                                                     f"named {ref!r}")
        path = shipped
    try:
        data = json.loads(path.read_text())
        return CostParams.from_dict(data["params"]), data
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KvsimError(str(path), f"not a kvsim calibration file ({exc})") from exc


def default_params(hardware: HardwareSpec) -> CostParams:
    """Uncalibrated defaults: the plain roofline with typical efficiencies."""
    return CostParams(num_sms=DEFAULT_NUM_SMS.get(hardware.name, 108))


class CostModelExecutor:
    """Prices steps of ``model`` on ``hardware`` with ``params``; deterministic and side-effect free."""

    supports_decode_runs = True   # a pure pricer: the engine may price runs of decode steps at once

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, params: CostParams, block_size: int = 16) -> None:
        self.model, self.hardware, self.params = model, hardware, params
        tp = hardware.tensor_parallel
        b = model.dtype_bytes
        self._peak, self._bw = hardware.peak_flops, hardware.hbm_bandwidth
        self._layers = model.num_layers
        self._shapes = linear_shapes(model, tp)
        q = math.ceil(model.num_heads / tp) * model.head_dim
        kv = math.ceil(model.num_kv_heads / tp) * model.head_dim
        inter = model.intermediate_size // tp
        self._vocab_shard = math.ceil(model.vocab_size / tp)
        # attention constants (per layer, per shard)
        self._attn_flops_per_pair = 4.0 * model.head_dim * math.ceil(model.num_heads / tp)
        self._attn_new_bytes = b * (2 * q + 2 * kv)     # Q and O, new K and V, per new token
        self._attn_kv_bytes = b * 2 * kv                # cached K and V, per context token
        self._attn_peak = self._peak * params.attn_compute_eff
        self._attn_bw = self._bw * params.attn_memory_eff
        self._attn_seq = params.attn_seq_latency_s
        self._attn_pre_seq = params.attn_prefill_seq_latency_s
        self._attn_kv_s = self._attn_kv_bytes / (self._bw * params.attn_kv_read_eff)  # seconds per cached token
        # elementwise and communication constants
        e = {op: params.elementwise_effs.get(op, params.elementwise_eff) for op in
             ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")}
        h = model.hidden_size
        self._elem_s_per_token = b / self._bw * (
            2 * h / e["input_layernorm"] + 2 * (q + kv) / e["attn_rope"] + 2 * h / e["post_attention_layernorm"]
            + (3 if model.gated_mlp else 2) * inter / e["mlp_act"] + 2 * 3 * h / e["add"])
        self._elem_fixed = ELEMENTWISE_KERNELS * params.elementwise_latency_s
        self._act_bytes = b * model.hidden_size
        # block movement
        block_bytes = model.kv_bytes_per_block(block_size) / tp
        self._swap_s_per_block = block_bytes / hardware.host_link_bandwidth + params.swap_block_latency_s
        self._copy_s_per_block = 2.0 * block_bytes / self._bw
        self._overhead = max(params.step_overhead_s, 1e-9)
        self._linear_cache: dict[int, tuple[float, float]] = {}
        self._head_cache: dict[int, float] = {}

    def layer_linear_time(self, tokens: int) -> float:
        """Seconds of one layer's four projections on ``tokens`` tokens."""
        p, b = self.params, self.model.dtype_bytes
        return sum(gemm_time_scalar(tokens, n, k, self._peak, self._bw, b, p) for _, k, n in self._shapes)

    def _linear(self, tokens: int) -> tuple[float, float]:
        """(linear seconds over all layers, all-reduce seconds over all layers) for ``tokens`` tokens."""
        hit = self._linear_cache.get(tokens)
        if hit is None:
            hw = self.hardware
            lin = self._layers * self.layer_linear_time(tokens)
            comm = 2 * self._layers * float(allreduce_time(tokens * self._act_bytes, hw.tensor_parallel,
                                                           hw.interconnect_bandwidth, hw.interconnect_latency_s,
                                                           self.params))
            hit = self._linear_cache[tokens] = (lin, comm)
        return hit

    def _lm_head(self, seqs: int) -> float:
        hit = self._head_cache.get(seqs)
        if hit is None:
            hit = self._head_cache[seqs] = gemm_time_scalar(seqs, self._vocab_shard, self.model.hidden_size,
                                                            self._peak, self._bw, self.model.dtype_bytes,
                                                            self.params)
        return hit

    def execute(self, plan: StepPlan) -> StepResult:
        tokens = seqs = 0
        pairs = pre_new = pre_ctx = 0
        dec_seqs = dec_ctx = 0
        for s in plan.scheduled:
            n, c = s.num_new_tokens, s.num_context_tokens
            tokens += n
            seqs += 1
            if n == 1 and c > 0:
                dec_seqs += 1
                dec_ctx += c + 1
            else:
                pre_new += n
                pre_ctx += c
                pairs += n * c + n * (n + 1) // 2
        linear = attention = elementwise = comm = 0.0
        if tokens:
            lin, comm = self._linear(tokens)
            linear = lin + self._lm_head(seqs)
            lat = self.params.kernel_latency_s
            per_layer = 0.0
            if pre_new:
                per_layer += max(self._attn_flops_per_pair * pairs / self._attn_peak,
                                 self._attn_new_bytes * pre_new / self._attn_bw + self._attn_kv_s * pre_ctx) + lat
            if dec_seqs:
                per_layer += max(self._attn_flops_per_pair * dec_ctx / self._attn_peak,
                                 self._attn_kv_s * dec_ctx + self._attn_new_bytes * dec_seqs / self._attn_bw) + lat
            attention = self._layers * (per_layer + dec_seqs * self._attn_seq + (seqs - dec_seqs) * self._attn_pre_seq)
            elementwise = self._layers * (tokens * self._elem_s_per_token + self._elem_fixed)
        swap = (len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)) * self._swap_s_per_block
        copy = len(plan.blocks_to_copy) * self._copy_s_per_block
        breakdown = {"linear": linear, "attention": attention, "elementwise": elementwise, "allreduce": comm,
                     "swap": swap, "copy": copy, "overhead": self._overhead}
        return StepResult(duration_s=linear + attention + elementwise + comm + swap + copy + self._overhead,
                          breakdown=breakdown)


def make_cost_model_executor(*, model: ModelSpec, hardware: HardwareSpec, config: Any = None, kv: Any = None,
                             num_gpu_blocks: int = 0, num_cpu_blocks: int = 0, base_dir: Path | None = None,
                             **_: Any) -> CostModelExecutor:
    """Registry factory: params from ``config.calibration`` (a file or a shipped name); without one, the
    calibration shipped for the hardware (by its name), else the uncalibrated roofline. ``calibration:
    roofline`` asks for the uncalibrated roofline explicitly."""
    ref = getattr(config, "calibration", None)
    if ref is None and shipped_calibration(hardware.name) is not None:
        ref = hardware.name
    params = load_calibration(ref, base_dir)[0] if ref and ref != "roofline" else default_params(hardware)
    overhead = getattr(config, "step_overhead_s", None)
    if overhead is not None:
        params.step_overhead_s = overhead
    return CostModelExecutor(model, hardware, params, block_size=getattr(kv, "block_size", 16))
