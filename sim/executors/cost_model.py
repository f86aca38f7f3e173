"""The analytical executor: prices one engine step with a roofline, without running anything.

Per step, with T = tokens computed, B = sequences scheduled, L = layers, t = tensor_parallel, b = dtype
bytes, H = hidden, I = intermediate, hd = head_dim, q = ceil(heads / t) x hd, kv = ceil(kv_heads / t) x hd:

    linear     = L x sum over (QKV: H -> q + 2kv, out: q -> H, up: H -> I/t (x2 gated), down: I/t -> H)
                 of gemm_time(T, N, K)  +  gemm_time(B, V/t, H) for the LM head on the sampled tokens
                 (every scheduled sequence counts as sampling one token); weight-only quantized
                 projections (``ModelSpec.weight_dtype``) read their weights at its bytes (scales
                 included) and multiply at the dtype's rate, with the learned correction of the same
                 shape in the dtype (no quantized kernel's timings are shipped); the LM head stays in dtype
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

A mixture of experts' layers (``_moe_mlp_time``) price their experts as vLLM's fused kernel runs them, their
shared experts as a dense MLP beside it, and its dense layers' MLP as a dense model's: ``linear`` sums
each kind of layer (``ModelSpec.layer_groups``). Multi-head latent attention (DeepSeek-V2/V3;
``attention_shapes``) has four projections, the latent's up projection among them on every token; its
prefill attends keys of hd and values of v_head_dim a head (a cached token's latent up-projected, its FLOPs
priced with its bytes), its decode every head's query against one cached latent of kv_lora_rank +
qk_rope_head_dim a token (``_attn_dec_*``: a decode's constants, a prefill's for every other model).

Local attention (``ModelSpec.local_attention``: a sliding window, or Llama 4's chunks) prices its layers'
attention over what their queries see (sim/executors/local_attention.py): ``attention`` is the full layers'
share of the formulas above plus the local layers' with their decode keys, pairs and cached reads.

Speculative decoding (sim/speculative.py): a request verifying d drafts is a decode of 1 + d queries over
c + 1 + d tokens of KV (its 1 + d tokens in T, a row of logits each in the LM head), and the step gains a
``draft`` part: the drafter's k passes (sim/executors/drafter.py), part of the GPU's work.

That is the sum of isolated operators, which the per-operator calibration fits. With ``engine``
(EngineParams, sim/executors/engine_params.py) the executor prices a step as a real engine runs it
instead: CUDA graphs with padded batches, fused elementwise kernels, custom all-reduce, the CPU side
overlapped by async scheduling, and decode attention efficiency by context; ``overhead`` is then
whatever the GPU's work leaves exposed (CPU beyond the GPU, the per-step gap, the sampler).
Everything that depends only on the model is computed at construction; ``execute`` runs one loop over
the batch and looks the linear time up in a per-token-count cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import KvsimError
from sim.executors.base import DecodeRun
from sim.executors.document_cache import read_document
from sim.executors.engine_params import (
    ATTENTION_OPS_PER_LAYER,
    CUSTOM_AR_WORLD_SIZES,
    EAGER_OPS_PER_LAYER,
    FUSED_ELEMENTWISE_KERNELS,
    MOE_AUX_KERNELS,
    SHARED_EXPERT_KERNELS,
    EngineParams,
    capture_sizes,
    graph_max_tokens_for,
)
from sim.executors.expert_rows import row_tiles
from sim.executors.layer_terms import attention_shapes, attention_terms, mlp_shapes
from sim.executors.price_memo import PriceMemo, price_memo
from sim.executors.roofline import (
    DEFAULT_NUM_SMS,
    CostParams,
    allreduce_time,
    gemm_time_scalar,
    grouped_gemm_time_scalar,
)
from sim.executors.shape_correction import check as check_correction
from sim.expert_parallel import busiest_gpu
from sim.lora import lora_shapes
from sim.native import native
from sim.sched.plan import LaneEntries, StepPlan, StepResult
from sim.specs import HardwareSpec, ModelSpec

ELEMENTWISE_KERNELS = 6
BREAKDOWN_PARTS = ("linear", "attention", "elementwise", "allreduce", "swap", "copy", "overhead")
DATA_DIR = Path(__file__).resolve().parent.parent / "data"  # package data: sim/data


def shipped_calibration(name: str) -> Path | None:
    """The calibration file shipped for hardware ``name`` (sim/data/calibration/NAME.json), if any."""
    path = DATA_DIR / "calibration" / f"{name.lower()}.json"
    return path if path.is_file() else None


def engine_params_of(doc: dict[str, Any], source: str = "calibration") -> EngineParams | None:
    """The ``engine`` section of a calibration document (None when it has none)."""
    section = doc.get("engine")
    if section is None:
        return None
    try:
        return EngineParams.from_dict(section)
    except (TypeError, ValueError) as exc:
        raise KvsimError(source, f"engine: {exc}") from None


def load_calibration(ref: str, base_dir: Path | None = None, key: str = "executor.calibration"
                     ) -> tuple[CostParams, dict[str, Any]]:
    """Read a calibration: a JSON path (relative to ``base_dir``) or a bare shipped hardware name. A derived
    calibration (``derived_from``: a shipped name; see ``derived_document``) reads as its source's
    document with its own ``hardware``, ``derived_from`` and ``derivation``. ``key``: what named it (the
    scenario key, or a command's flag), for the error where there is no such calibration."""
    path = Path(ref)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        shipped = shipped_calibration(ref)
        if shipped is None:
            raise KvsimError(key, f"no calibration file {str(path)!r} and no shipped one named {ref!r}")
        path = shipped
    try:
        data = dict(derived_document(read_document(path), str(path)))   # (its nested values: read-only)
        params = CostParams.from_dict(data["params"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KvsimError(str(path), f"not a kvsim calibration file ({exc})") from exc
    try:
        check_correction(params.gemm_correction)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise KvsimError(str(path), f"params.gemm_correction: {exc}") from None
    return params, data


def derived_document(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """``doc`` itself, or for a derived calibration (a GPU with no measurements of its own, built on the
    same chip as a measured one: ``{"hardware": H, "derived_from": S, "derivation": why}``, no params) the
    shipped calibration S's document with ``doc``'s keys over it. Its fitted parameters price H's steps
    against H's own peak rates, bandwidth and memory (scripts/derive_calibration.py checks the chip)."""
    base = doc.get("derived_from")
    if base is None:
        return doc
    if "params" in doc:
        raise KvsimError(source, "derived_from: a derived calibration has no params of its own")
    path = shipped_calibration(str(base))
    if path is None:
        raise KvsimError(source, f"derived_from: no shipped calibration named {base!r}")
    src = read_document(path)
    if "derived_from" in src:
        raise KvsimError(source, f"derived_from: {base!r} is derived itself (one step only)")
    return {**src, **doc}


def default_params(hardware: HardwareSpec) -> CostParams:
    """Uncalibrated defaults: the plain roofline with typical efficiencies."""
    return CostParams(num_sms=DEFAULT_NUM_SMS.get(hardware.name, 108))


def _per_step(value, zero: np.ndarray) -> np.ndarray:
    """A run's breakdown entry as one value per step (a scalar repeated; an array as it is)."""
    return value if isinstance(value, np.ndarray) else zero + value


class CostModelExecutor:
    """Prices steps of ``model`` on ``hardware`` with ``params`` (and, given, the engine terms ``engine``);
    deterministic and side-effect free."""

    supports_decode_runs = True   # execute_decode_run prices k decode steps at once, equal to k execute()s
    shareable = True   # no state but memos of its own prices: the engines of one scenario may share one
    drafter = None     # speculative decoding: prices each step's draft passes (sim/executors/drafter.py)
    _lora = None       # LoRA serving (sim/lora.py, ``enable_lora``): its kernels and adapter loads in each step

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, params: CostParams, block_size: int = 16,
                 engine: EngineParams | None = None, calibration: str = "custom", derived_from: str | None = None,
                 calibrated_for: str | None = None, lm_head: bool = True) -> None:
        self.model, self.hardware, self.params = model, hardware, params
        # False: a pipeline stage before the last (sim/executors/pipeline.py), which computes no logits (its
        # model is named after the stage, so its memo of prices is its own)
        self._has_lm_head = lm_head
        self.calibration = calibration   # where params came from: a shipped name, a file, "roofline", "custom"
        self.derived_from = derived_from   # a derived calibration's measured source (derived_document)
        self.calibrated_for = calibrated_for   # the hardware the calibration was made for, where not this one
        tp = hardware.tensor_parallel
        b = model.activation_bytes   # (the elementwise kernels' and all-reduces' elements: 16-bit under W8A8)
        self._peak, self._bw = hardware.peak_flops, hardware.hbm_bandwidth
        # the GEMMs' rate: fp8 weights and activations on fp8 tensor cores where the GPU has them; attention
        # stays at the fp16 rate (its kernels compute in fp16/bf16)
        self._gemm_peak = (hardware.peak_flops_fp8 if model.dtype == "fp8" and hardware.peak_flops_fp8
                           else hardware.peak_flops)
        self._layers = model.num_layers
        # local attention (a sliding window, or a chunk): these layers' attention reads only what their queries
        # see (sim/executors/local_attention.py), step by step: no decode runs (they price from context sums
        # alone); the compiled core sums what each entry sees as execute does
        self._local, self._local_layers = model.local_attention, model.local_layers
        self._full_layers = self._layers - self._local_layers
        if self._local_layers:
            self.supports_decode_runs = False
        self._attn_shapes = attention_shapes(model, tp)
        self._mlp_shapes = mlp_shapes(model, model.intermediate_size, tp)
        self._shapes = self._attn_shapes + self._mlp_shapes
        # expert parallelism: each GPU holds whole experts (their full width) and waits for the busiest
        self._ep = tp if hardware.expert_parallel and model.num_experts and tp > 1 else 1
        self._expert_shapes = mlp_shapes(model, model.intermediate_size, 1) if self._ep > 1 else self._mlp_shapes
        self._min_tile_rows = min((tile[0] for tile in params.tiles), default=1)
        # a mixture of experts' dense MLPs: its shared experts (on the expert layers), its dense layers' MLP
        self._shared_shapes = mlp_shapes(model, model.shared_expert_size, tp) if model.shared_expert_size else []
        self._dense_shapes = mlp_shapes(model, model.dense_intermediate_size, tp) if model.dense_layers else []
        self._layer_groups = model.layer_groups()
        self._vocab_shard = math.ceil(model.vocab_size / tp)
        # attention constants (per layer, per shard): a prefill's, then a decode's (the same unless latent)
        a = attention_terms(model, tp)
        self._attn_flops_per_pair, self._attn_new_bytes, self._attn_kv_bytes = a.flops_per_pair, a.new_bytes, \
            a.kv_bytes
        self._attn_dec_flops_per_pair, self._attn_dec_new_bytes, self._attn_dec_kv_bytes = \
            a.dec_flops_per_pair, a.dec_new_bytes, a.dec_kv_bytes
        self._rope_width, self._kv_write_width, self._bottleneck_width = a.rope_width, a.kv_write_width, \
            a.bottleneck_width
        self._attn_peak = self._peak * params.attn_compute_eff
        self._attn_bw = self._bw * params.attn_memory_eff
        self._attn_seq = params.attn_seq_latency_s
        self._attn_pre_seq = params.attn_prefill_seq_latency_s
        self._attn_kv_s = self._attn_kv_bytes / (self._bw * params.attn_kv_read_eff)  # seconds per cached token
        if a.up_flops:   # (latent attention's up-projection of a cached token, at a large GEMM's rate)
            self._attn_kv_s += a.up_flops / (self._peak * params.compute_eff)
        self._attn_dec_kv_s = self._attn_dec_kv_bytes / (self._bw * params.attn_kv_read_eff)
        # elementwise and communication constants
        e = {op: params.elementwise_effs.get(op, params.elementwise_eff) for op in
             ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")}
        h = model.hidden_size
        self._elem_s_per_token = b / self._bw * (
            2 * h / e["input_layernorm"] + 2 * a.rope_width / e["attn_rope"] + 2 * h / e["post_attention_layernorm"]
            + (3 if model.gated_mlp else 2) * model.activated_mlp_width(tp) / e["mlp_act"]
            + 2 * 3 * h / e["add"])
        if a.bottleneck_width:   # latent attention's norms of the query's and the latent's bottlenecks
            self._elem_s_per_token += b / self._bw * 2 * a.bottleneck_width / e["input_layernorm"]
        self._elem_fixed = ELEMENTWISE_KERNELS * params.elementwise_latency_s
        self._act_bytes = b * model.hidden_size
        # block movement
        block_bytes = model.kv_bytes_per_block(block_size) * model.kv_replicas(tp) / tp   # one GPU's share
        self._swap_s_per_block = block_bytes / hardware.host_link_bandwidth + params.swap_block_latency_s
        self._copy_s_per_block = 2.0 * block_bytes / self._bw
        self._overhead = max(params.step_overhead_s, 1e-9)
        self._moe_tile_eff = engine.moe_tile_eff if engine is not None else 1.0
        # Python-dispatched ops of a step run without graphs, over all layers: an expert layer's router and small
        # kernels, and its shared experts' two GEMMs, activation and sum, besides a dense layer's
        self._eager_ops = sum(n * (EAGER_OPS_PER_LAYER + self._extra_eager_ops(dense)) for n, dense in self._layer_groups)
        self.engine = engine
        memo = price_memo(model, hardware, params, engine)   # (shared with executors of the same setup)
        self._linear_cache, self._head_cache = memo.linear, memo.head
        # a step of no tokens (swaps or copies alone): the fixed overhead; in engine mode no GPU work, the CPU
        # side of a step and its gap (vLLM's engine still schedules it and syncs)
        self._empty_step_s = self._overhead if engine is None else engine.cpu_step_s + engine.step_gap_s
        if engine is not None:
            self._init_engine(engine, memo)
        consts = self._decode_constants()
        # the compiled core prices step by step (local layers too); decode runs price from context sums alone
        self._core_priced = consts is not None
        self._native_consts = None if self._local_layers else consts

    # ------------------------------------------------------------ engine-level terms
    def _init_engine(self, e: EngineParams, memo: PriceMemo) -> None:
        """Constants of the engine-level step (sim/executors/engine_params.py)."""
        b, h = self.model.activation_bytes, self.model.hidden_size
        self._graph_max = e.graph_max_tokens if e.cuda_graphs else 0
        pad = [0] * (self._graph_max + 1)
        sizes = capture_sizes(self._graph_max) if self._graph_max else []
        i = 0
        for n in range(1, self._graph_max + 1):
            while sizes[i] < n:
                i += 1
            pad[n] = sizes[i]
        self._pad = pad
        # decode attention: (context + half_ctx) x KV bytes per token / (bw x eff), plus Q and O
        self._eng_kv_s = self._attn_dec_kv_bytes / (self._bw * e.attn_kv_read_eff)
        self._eng_half = e.attn_half_ctx
        self._eng_qo_s = self._attn_dec_new_bytes / self._attn_bw
        # fused elementwise kernels stream at the bandwidth of a copy (memory_eff); the low efficiencies
        # fitted to isolated small kernels are their launch latency, which a graph replaces
        act = (3 if self.model.gated_mlp else 2) * self.model.activated_mlp_width(self.hardware.tensor_parallel)
        # (the KV-cache write reads the new K and V in the model's dtype and stores them in the cache's)
        rope, kv_write = self._rope_width, self._kv_write_width
        self._fused_s_per_token = (b * (8 * h + 2 * rope + kv_write + act + 2 * self._bottleneck_width)
                                   + self.model.kv_dtype_bytes * kv_write) / (self._bw * self.params.memory_eff)
        self._eng_linear_cache, self._eng_fixed_cache = memo.engine_linear, memo.engine_fixed

    def _engine_linear(self, padded: int, graph: bool) -> tuple[float, float]:
        """(GEMMs over all layers, all-reduces over all layers) on ``padded`` tokens."""
        key = (padded, graph)
        hit = self._eng_linear_cache.get(key)
        if hit is None:
            e, p, hw = self.engine, self.params, self.hardware
            layers = 0.0
            for n, dense in self._layer_groups:
                per_layer = self.layer_linear_time(padded, dense)
                if graph:   # inside a graph each GEMM pays graph_kernel_s instead of its isolated latency
                    per_layer += self._layer_kernels(dense) * (e.graph_kernel_s - p.kernel_latency_s)
                layers += n * per_layer
            nbytes = padded * self._act_bytes
            tp = hw.tensor_parallel
            if tp <= 1:
                comm = 0.0
            elif (e.custom_allreduce and tp in CUSTOM_AR_WORLD_SIZES and nbytes <= e.custom_ar_max_bytes
                  and hw.interconnect_bandwidth > 0):
                comm = e.custom_ar_latency_s + e.custom_ar_peer_s * (min(tp, e.custom_ar_growth_until_tp) - 2) \
                    + 2.0 * (tp - 1) / tp * nbytes / (hw.interconnect_bandwidth * e.custom_ar_eff)
            else:
                comm = float(allreduce_time(nbytes, tp, hw.interconnect_bandwidth, hw.interconnect_latency_s, p))
            hit = self._eng_linear_cache[key] = (layers, 2 * self._layers * comm)
        return hit

    def _engine_fixed(self, tokens: int, seqs: int, has_prefill: bool) -> tuple[float, float, float, float, float]:
        """The parts of an engine step that do not depend on decode contexts:
        (linear, allreduce, elementwise, prefill-free attention kernel cost per layer, cpu).
        A function of its arguments only: cached per (tokens, seqs, has_prefill)."""
        key = (tokens, seqs, has_prefill)
        hit = self._eng_fixed_cache.get(key)
        if hit is None:
            hit = self._eng_fixed_cache[key] = self._engine_fixed_terms(tokens, seqs, has_prefill)
        return hit

    def _engine_fixed_terms(self, tokens: int, seqs: int, has_prefill: bool) -> tuple[float, float, float, float, float]:
        """``_engine_fixed``, computed."""
        e, p = self.engine, self.params
        if tokens <= self._graph_max:
            padded = self._pad[tokens]
            graph, full = True, not has_prefill
        else:
            padded, graph, full = tokens, False, False
        lin, comm = self._engine_linear(padded, graph)
        linear = lin + self._lm_head(seqs)
        k_elem = e.graph_kernel_s if graph else p.elementwise_latency_s
        elementwise = self._layers * (padded * self._fused_s_per_token + FUSED_ELEMENTWISE_KERNELS * k_elem)
        k_attn = e.graph_kernel_s if full else p.kernel_latency_s
        eager_ops = 0 if full else (self._layers * ATTENTION_OPS_PER_LAYER if graph else self._eager_ops)
        cpu = e.cpu_step_s + e.cpu_seq_s * seqs + e.eager_op_s * eager_ops
        return linear, comm, elementwise, k_attn, cpu

    def _engine_step(self, tokens: int, seqs: int, dec_seqs: int, dec_ctx: int, pre_new: int, pre_ctx: int,
                     pairs: int, swap: float, copy: float, spec: tuple[int, float] | None = None,
                     win: tuple[int, int, int] | None = None, lora: tuple[float, float] | None = None) -> StepResult:
        """``spec``: (draft tokens verified, the draft passes' seconds) of a step that verifies drafts; its
        verifying sequences are among the decodes (``dec_seqs``, ``dec_ctx`` counting their new tokens).
        ``win``: the local-attention layers' (decode keys, prefill cached tokens, prefill pairs); None: every
        layer attends the whole context. ``lora``: (the LoRA kernels' seconds, on the GPU; the adapter loads'
        seconds, before the step runs) of a LoRA engine's step (sim/lora.py)."""
        e = self.engine
        linear, comm, elementwise, k_attn, cpu = self._engine_fixed(tokens, seqs, pre_new > 0)
        queries = dec_seqs
        if spec is not None:   # a query and a row of logits for each draft token too
            queries += spec[0]
            linear += self._lm_head(seqs + spec[0]) - self._lm_head(seqs)
        per_layer = self._engine_attention(pre_new, pre_ctx, pairs, dec_seqs, dec_ctx, queries, k_attn)
        if win is None:
            attention = self._layers * per_layer
        else:   # the local-attention layers' attention over what they see
            attention = self._full_layers * per_layer + self._local_layers * self._engine_attention(
                pre_new, win[1], win[2], dec_seqs, win[0], queries, k_attn)
        gpu = linear + attention + elementwise + comm + e.sampler_s
        draft = 0.0
        if spec is not None:
            draft = spec[1]
            gpu += draft
        adapters = loads = 0.0
        if lora is not None:
            adapters, loads = lora
            gpu += adapters
        busy = max(gpu, cpu) if e.overlap_cpu else gpu + cpu
        duration = busy + e.step_gap_s + swap + copy + loads
        overhead = duration - (linear + attention + elementwise + comm + swap + copy + draft + adapters + loads)
        breakdown = {"linear": linear, "attention": attention, "elementwise": elementwise, "allreduce": comm,
                     "swap": swap, "copy": copy, "overhead": overhead}
        if spec is not None:
            breakdown["draft"] = draft
        if lora is not None:
            breakdown["lora"] = adapters + loads
        return StepResult(duration_s=duration, breakdown=breakdown)

    def _engine_attention(self, pre_new: int, pre_ctx: int, pairs: int, dec_seqs: int, dec_ctx: int, queries: int,
                          k_attn: float) -> float:
        """One layer's attention in an engine step: the prefills' kernel (roofline of their pairs and bytes),
        then the decodes' (their keys read at the engine's efficiency by context, and queries and outputs)."""
        per_layer = 0.0
        if pre_new:
            per_layer += max(self._attn_flops_per_pair * pairs / self._attn_peak,
                             self._attn_new_bytes * pre_new / self._attn_bw + self._attn_kv_s * pre_ctx) \
                + self.params.kernel_latency_s
        if dec_seqs:
            per_layer += (dec_ctx + dec_seqs * self._eng_half) * self._eng_kv_s + queries * self._eng_qo_s + k_attn
        return per_layer

    def execute_decode_run(self, plan: StepPlan, k: int):
        """``k`` consecutive all-decode steps (step j: every context + j) at once, each equal bit for bit
        to ``execute`` of its plan: the same formulas on an array of decode context sums."""
        seqs = len(plan.scheduled)
        ctx0 = 0
        for s in plan.scheduled:
            if s.num_new_tokens != 1 or s.num_context_tokens <= 0:
                raise ValueError("execute_decode_run needs an all-decode plan")
            ctx0 += s.num_context_tokens + 1
        if plan.blocks_to_copy or plan.blocks_to_swap_in or plan.blocks_to_swap_out:
            raise ValueError("execute_decode_run needs a plan without block movement")
        return self.execute_decode_sums(seqs, ctx0, k)

    def execute_decode_sums(self, seqs: int, ctx0: int, k: int):
        """``execute_decode_run`` from what it reads of the plan: ``seqs`` decode sequences whose
        contexts (each counting the token computed) sum to ``ctx0`` at step 0."""
        dec_ctx = ctx0 + seqs * np.arange(k, dtype=np.int64)   # exact integers, as the loop sums them
        return self._decode_prices(seqs, dec_ctx, self._size_terms(seqs))

    def execute_decode_profile(self, seqs: np.ndarray, dec_ctx: np.ndarray,
                               stretches: tuple[list[int], list[int]] | None = None):
        """``k`` all-decode steps whose batch shrinks as requests finish: step j has ``seqs[j]`` sequences
        whose contexts (each counting the token computed) sum to ``dec_ctx[j]``. Entry j equals
        ``execute_decode_sums(seqs[j], dec_ctx[j], 1)`` bit for bit: the same formulas, element by element,
        with the per-size terms looked up once per run of equal sizes (a shrinking batch: a few).
        ``stretches``: those runs, if the caller has them, as (sizes, lengths): ``seqs`` is sizes[s] repeated
        lengths[s] times."""
        if stretches is None:
            starts = [0, *((seqs[1:] != seqs[:-1]).nonzero()[0] + 1).tolist()]   # where a size begins
            stretches = seqs[starts].tolist(), np.diff([*starts, len(seqs)]).tolist()
        sizes, lengths = stretches
        terms = np.array([self._size_terms(n) for n in sizes]).T.repeat(lengths, axis=1)   # (rows)
        return self._decode_prices(seqs, dec_ctx, tuple(terms))

    def execute_decode_stretches(self, sizes: list[int], lengths: list[int],
                                 bases: list[int]) -> tuple[DecodeRun, np.ndarray]:
        """``execute_decode_profile`` of a run given as stretches of equal sizes: stretch s has ``sizes[s]``
        sequences for ``lengths[s]`` steps, and step j (counted from the run's start) the context sum
        ``bases[s] + sizes[s] * j``. Returns the prices and the sequences of each step. Compiled where
        sim/csrc is built (one call instead of a dozen numpy calls on short arrays), the same values."""
        if native is None or self._native_consts is None:
            if len(sizes) == 1:
                return self.execute_decode_sums(sizes[0], bases[0], lengths[0]), np.full(lengths[0], sizes[0])
            seqs = np.array(sizes, dtype=np.int64).repeat(lengths)
            ctx = np.array(bases, dtype=np.int64).repeat(lengths) + seqs * np.arange(len(seqs), dtype=np.int64)
            return self.execute_decode_profile(seqs, ctx, (sizes, lengths)), seqs
        k = sum(lengths)
        prices = np.empty((8, k))
        seqs = np.empty(k, dtype=np.int64)
        native.decode_prices(prices, seqs, sizes, lengths, bases, [self._size_terms(n) for n in sizes],
                             self._native_consts)
        return DecodeRun(prices[0], dict(zip(BREAKDOWN_PARTS, prices[1:]))), seqs

    def _decode_constants(self) -> tuple | None:
        """The constants of ``_decode_prices``' formulas, in the order sim/csrc/pricing.c reads them (None where an
        integer of them is not an int: numpy's arithmetic on it would differ from the compiled loop's)."""
        if not (type(self._layers) is int and type(self._attn_new_bytes) is int
                and type(self._attn_dec_new_bytes) is int):
            return None
        if self.engine is None:   # (decode steps only: a decode's attention constants)
            return ("roofline", self._layers, self._attn_dec_flops_per_pair, self._attn_peak, self._attn_dec_kv_s,
                    self._attn_dec_new_bytes, self._attn_bw, self.params.kernel_latency_s, self._attn_seq,
                    self._attn_pre_seq, self._elem_s_per_token, self._elem_fixed, self._overhead)
        e = self.engine
        return ("engine", self._layers, self._eng_half, self._eng_kv_s, self._eng_qo_s, e.sampler_s,
                e.step_gap_s, bool(e.overlap_cpu))

    def decode_work_s(self, seqs: int, ctx0: int, k: int) -> float:
        """The GPU work (linear, attention, elementwise, all-reduce: no per-step overhead) of ``k`` all-decode
        steps of ``seqs`` sequences whose contexts (each counting the token computed) sum to ``ctx0`` at step 0
        and grow by one each a step: ``execute_decode_sums``' parts, in scalars (a drafter's passes)."""
        terms = self._size_terms(seqs)
        layers = self._layers
        total = 0.0
        if self.engine is None:
            linear, comm = terms
            fixed = linear + comm + layers * (seqs * self._elem_s_per_token + self._elem_fixed)
            for j in range(k):
                ctx = ctx0 + seqs * j
                per_layer = max(self._attn_dec_flops_per_pair * ctx / self._attn_peak,
                                self._attn_dec_kv_s * ctx + self._attn_dec_new_bytes * seqs / self._attn_bw) \
                    + self.params.kernel_latency_s
                total += fixed + layers * (per_layer + seqs * self._attn_seq)
            return total
        linear, comm, elementwise, k_attn, _cpu = terms
        fixed = linear + elementwise + comm
        for j in range(k):
            ctx = ctx0 + seqs * j
            total += fixed + layers * ((ctx + seqs * self._eng_half) * self._eng_kv_s + seqs * self._eng_qo_s + k_attn)
        return total

    def gemm_s(self, tokens: int, n: int, k: int, op: str | None = None) -> float:
        """One GEMM outside the model's layers, ``[tokens, k] x [k, n]`` in the model's dtype with this
        executor's corrections (``op``: the operator whose learned correction applies; None: the generic
        one): a speculative head's fusion layer. On an engine calibration a batch within the captured sizes
        runs padded to its graph's size, the launch a graph kernel's, as the layers' GEMMs do there."""
        p = self.params
        if self.engine is not None and tokens <= self._graph_max:
            t = gemm_time_scalar(self._pad[tokens], n, k, self._gemm_peak, self._bw, self.model.dtype_bytes, p, op)
            return t + (self.engine.graph_kernel_s - p.kernel_latency_s)
        return gemm_time_scalar(tokens, n, k, self._gemm_peak, self._bw, self.model.dtype_bytes, p, op)

    def first_pass_s(self, seqs: int, drafts: int, ctx0: int) -> float:
        """The GPU work of a drafter's first pass of a step (vLLM's padded drafter batch): over the target's
        verified tokens, each of ``seqs`` sequences' last sampled token and its drafts (``drafts`` in all),
        reading contexts that sum to ``ctx0`` + ``drafts`` (``ctx0``: each context with its last sampled
        token), with a row of logits for each sequence: ``execute``'s GPU parts of such a step."""
        tokens = seqs + drafts
        ctx = ctx0 + drafts
        layers = self._layers
        if self.engine is None:
            lin, comm = self._linear(tokens)
            linear = lin + self._lm_head(seqs)
            per_layer = max(self._attn_dec_flops_per_pair * ctx / self._attn_peak,
                            self._attn_dec_kv_s * ctx + self._attn_dec_new_bytes * tokens / self._attn_bw) \
                + self.params.kernel_latency_s
            return linear + comm + layers * (tokens * self._elem_s_per_token + self._elem_fixed) \
                + layers * (per_layer + seqs * self._attn_seq)
        linear, comm, elementwise, k_attn, _cpu = self._engine_fixed(tokens, seqs, False)
        return linear + elementwise + comm \
            + layers * ((ctx + seqs * self._eng_half) * self._eng_kv_s + tokens * self._eng_qo_s + k_attn)

    def draft_work_s(self, seqs: int, drafts: int, ctx0: int, k: int) -> float:
        """A drafter's ``k`` passes of a step: the first over the verified tokens (``first_pass_s``), then
        ``k`` - 1 of one token a sequence, pass j reading every context + j (``decode_work_s``)."""
        return self.first_pass_s(seqs, drafts, ctx0) + self.decode_work_s(seqs, ctx0 + seqs, k - 1)

    def pass_terms(self, tokens: int, seqs: int) -> tuple[float, ...]:
        """``_size_terms`` of a pass over ``tokens`` tokens of ``seqs`` sequences (a row of logits each)."""
        if self.engine is None:
            lin, comm = self._linear(tokens)
            return lin + self._lm_head(seqs), comm
        return self._engine_fixed(tokens, seqs, False)

    def _size_terms(self, seqs: int) -> tuple[float, ...]:
        """The parts of a decode step that depend on its size only: (linear, allreduce) on the plain
        roofline, (linear, allreduce, elementwise, attention kernel cost, cpu) on an engine calibration."""
        if self.engine is None:
            lin, comm = self._linear(seqs)
            return lin + self._lm_head(seqs), comm
        return self._engine_fixed(seqs, seqs, False)

    def _decode_prices(self, seqs, dec_ctx: np.ndarray, terms: tuple):
        """Decode steps priced from their sizes ``seqs`` (an int or an array), context sums ``dec_ctx`` and
        ``_size_terms`` (floats or arrays): the formulas of ``execute``'s all-decode step, element by
        element."""
        zero = np.zeros(len(dec_ctx))
        if self.engine is None:
            linear, comm = terms
            per_layer = np.maximum(self._attn_dec_flops_per_pair * dec_ctx / self._attn_peak,
                                   self._attn_dec_kv_s * dec_ctx + self._attn_dec_new_bytes * seqs / self._attn_bw) \
                + self.params.kernel_latency_s
            attention = self._layers * (per_layer + seqs * self._attn_seq + (seqs - seqs) * self._attn_pre_seq)
            elementwise = self._layers * (seqs * self._elem_s_per_token + self._elem_fixed)
            duration = linear + attention + elementwise + comm + 0.0 + 0.0 + self._overhead
            overhead = zero + self._overhead
        else:
            # ``_engine_step``'s formulas less its additions of 0.0 (per-layer prefill attention, swap, copy),
            # which leave a sum of non-negative terms unchanged bit for bit
            e = self.engine
            linear, comm, elementwise, k_attn, cpu = terms
            per_layer = (dec_ctx + seqs * self._eng_half) * self._eng_kv_s + seqs * self._eng_qo_s + k_attn
            attention = self._layers * per_layer
            parts = linear + attention + elementwise + comm
            gpu = parts + e.sampler_s
            busy = np.maximum(gpu, cpu) if e.overlap_cpu else gpu + cpu
            duration = busy + e.step_gap_s
            overhead = duration - parts
        return DecodeRun(duration, {"linear": _per_step(linear, zero), "attention": attention,
                                    "elementwise": _per_step(elementwise, zero), "allreduce": _per_step(comm, zero),
                                    "swap": zero, "copy": zero, "overhead": overhead})

    def layer_linear_time(self, tokens: int, dense: bool = False) -> float:
        """Seconds of one layer's projections on ``tokens`` tokens (a mixture of experts: see
        ``_moe_mlp_time``, then its shared experts' two GEMMs and two small kernels, the activation and the sum
        into the experts' output; ``dense``: its dense layer's, the same as any layer's for a dense model)."""
        if dense and self.model.num_experts:
            return self._gemms(tokens, self._attn_shapes + self._dense_shapes)
        if not self.model.num_experts:
            return self._gemms(tokens, self._shapes)
        t = self._gemms(tokens, self._attn_shapes) + self._moe_mlp_time(tokens)
        if self._shared_shapes:
            t += self._gemms(tokens, self._shared_shapes) + SHARED_EXPERT_KERNELS * self.params.kernel_latency_s
        return t

    def _gemms(self, tokens: int, shapes: list[tuple[str, int, int]]) -> float:
        """Seconds of ``shapes``' GEMMs (operator, K, N) on ``tokens`` tokens, each weight read as stored."""
        p, b, peak = self.params, self.model.dtype_bytes, self._gemm_peak
        return sum(gemm_time_scalar(tokens, n, k, peak, self._bw, b, p, op, w)
                   for (op, k, n), w in zip(shapes, self._stored_bytes(shapes)))

    def _stored_bytes(self, shapes: list[tuple[str, int, int]], experts: bool = False) -> list[float | None]:
        """Bytes each of ``shapes``' weights takes as stored (None: the dtype's, as the activations');
        ``experts``: they are the routed experts' (``ModelSpec.weight_scope``)."""
        m = self.model
        if m.weight_dtype is None or not (experts or m.weight_scope == "all"):
            return [None] * len(shapes)
        return [m.weight_bytes_per_element(k) for _, k, _ in shapes]

    def _layer_kernels(self, dense: bool) -> int:
        """GEMM-like launches of one layer, each priced at ``kernel_latency_s`` outside a graph: its four
        projections; an expert layer's router and MOE_AUX_KERNELS small kernels too (its up and down are one
        grouped launch each), and its shared experts' two GEMMs and SHARED_EXPERT_KERNELS."""
        if dense or not self.model.num_experts:
            return len(self._shapes)
        shared = len(self._shared_shapes) + SHARED_EXPERT_KERNELS if self._shared_shapes else 0
        return len(self._shapes) + 1 + MOE_AUX_KERNELS + shared

    def _extra_eager_ops(self, dense: bool) -> int:
        """A layer's Python-dispatched ops without graphs beyond a dense layer's EAGER_OPS_PER_LAYER: latent
        attention's two more GEMMs and two more norms; an expert layer's router and small kernels, and its
        shared experts' GEMMs and small kernels."""
        latent = len(self._attn_shapes) - 2 + (2 if self.model.latent_attention else 0)
        return latent + (0 if dense or not self.model.num_experts else self._layer_kernels(False) - len(self._shapes))

    def _moe_mlp_time(self, tokens: int) -> float:
        """A mixture-of-experts MLP on ``tokens`` tokens, as vLLM's fused MoE kernel runs it:

            router   gemm(tokens, E, H)
            active   A = E x (1 - (1 - k/E)^tokens)   experts hit by tokens x k random choices (expected)
            per      tokens x k / A                   rows each active expert computes (balanced, on average)
            experts  grouped(A, per, up) + grouped(A, per, down): one launch each for up and down, every
                     active expert's weights read (``grouped_gemm_time_scalar``), the tiles at the engine's
                     ``moe_tile_eff`` of the library GEMMs' compute efficiency
            small    MOE_AUX_KERNELS launches: top-k softmax, block alignment, the sum over the k experts

        so a decode batch of a few dozen tokens reads every expert's weights (all of E x the dense MLP)
        while computing only k of them a token. The experts' part never falls as ``tokens`` grows (more
        tokens never read fewer experts). (SiLU-and-mul is priced with the elementwise kernels.)
        With expert parallelism (``hardware.expert_parallel``) the busiest GPU's, over its own experts at their
        full width (sim/expert_parallel.py ``busiest_gpu``): the slower of its most active experts and its most
        rows (as that many experts' worth of ``per`` rows, so that the rows of an expert stay the mean's and
        its tiles as many as without expert parallelism, the weights read its active experts'; rows of fewer
        than the smallest tile's still fill one)."""
        return self._moe_time(tokens, tokens)

    def _moe_time(self, tokens: int, rows: int) -> float:
        """``_moe_mlp_time`` with the router's gate over ``tokens`` tokens and the experts over ``rows`` of them
        (a data-parallel group's expert layers compute every rank's tokens: sim/executors/data_parallel.py)."""
        p, m = self.params, self.model
        e, k_top = m.num_experts, m.experts_per_token
        active = e * (1.0 - (1.0 - k_top / e) ** rows)
        per = rows * k_top / active
        # an active expert's row tiles: its rows random about ``per`` (sim/executors/expert_rows.py)
        tiles = partial(row_tiles, rows, k_top / e)
        if self._ep > 1:
            most_active, most_rows = busiest_gpu(e, k_top, self._ep, rows)
            # its rows as experts of the mean's rows (at least a tile's: fewer ride in a padded tile), reading
            # only its active experts' weights
            mean_rows = max(per, self._min_tile_rows)
            groups = max(most_active, most_rows / mean_rows)
            experts = max(self._grouped_experts(most_active, per, tiles=tiles),
                          self._grouped_experts(groups, mean_rows, most_active / groups, tiles))
        else:
            experts = self._grouped_experts(active, per, tiles=tiles)
        # (the router's gate is not quantized under W8A8: 16-bit, at the 16-bit rate)
        router = gemm_time_scalar(tokens, e, m.hidden_size, self._peak, self._bw, m.activation_bytes, p)
        return router + experts + MOE_AUX_KERNELS * p.kernel_latency_s

    def enable_lora(self, lora: Any) -> None:
        """Price LoRA serving's kernels and adapter loads in every step (sim/lora.py; ``lora``: the scenario's
        section). Steps are then priced one by one (a decode run's price does not know its adapters); the
        compiled core asks ``_lora_kernels`` once a size (sim/csrc/core/pricing.inc ``lora_kernels``)."""
        self._lora = lora
        self._lora_shapes = lora_shapes(self.model, self.hardware.tensor_parallel)
        self._lora_memo: dict[tuple[int, int, bool], float] = {}
        self.supports_decode_runs = False

    def _lora_parts(self, plan: StepPlan, graph: bool) -> tuple[float, float]:
        """(the LoRA kernels' seconds, the adapter loads' seconds) of ``plan``: none without adapters."""
        if not plan.lora_adapters:
            return 0.0, plan.lora_load_s
        key = (plan.lora_tokens, plan.lora_adapters, graph)
        hit = self._lora_memo.get(key)
        if hit is None:
            hit = self._lora_memo[key] = self._lora_kernels(plan.lora_tokens, plan.lora_adapters, graph)
        return hit, plan.lora_load_s

    def _lora_kernels(self, tokens: int, adapters: int, graph: bool) -> float:
        """Seconds of the LoRA kernels of a step whose ``tokens`` tokens name ``adapters`` adapters: for each
        wrapped projection of each layer a shrink ([rows, input] x [input, rank]) and an expand ([rows, rank] x
        [rank, output]), each one grouped launch over the adapters (``tokens / adapters`` rows each, every
        adapter's A or B read once) at the slots' rank (``max_lora_rank``), their tiles at the grouped kernels'
        ``moe_tile_eff``; in a CUDA graph each launch costs ``graph_kernel_s`` instead of its latency."""
        p, b = self.params, self.model.dtype_bytes
        rank, rows, eff = self._lora.max_lora_rank, tokens / adapters, self._moe_tile_eff
        per_layer = 0.0
        for k, n in self._lora_shapes:
            per_layer += (grouped_gemm_time_scalar(adapters, rows, rank, k, self._gemm_peak, self._bw, b, p, eff)
                          + grouped_gemm_time_scalar(adapters, rows, n, rank, self._gemm_peak, self._bw, b, p, eff))
        if graph and self.engine is not None:
            per_layer += 2 * len(self._lora_shapes) * (self.engine.graph_kernel_s - p.kernel_latency_s)
        return self._layers * per_layer

    def _grouped_experts(self, groups: float, per: float, weights_read: float = 1.0,
                         tiles: Callable[[int], float] | None = None) -> float:
        """The fused kernel's up and down launches over ``groups`` experts of ``per`` rows each (expected,
        fractional), their tiles at ``moe_tile_eff``; ``weights_read``: the share of those experts' weights
        read (the rest are the same experts' rows again); ``tiles``: an expert's expected row tiles for a
        tile height (else ceil(per / height))."""
        p, b = self.params, self.model.dtype_bytes
        (_, k_up, n_up), (_, k_down, n_down) = self._expert_shapes
        eff = self._moe_tile_eff
        stored = self._stored_bytes(self._expert_shapes, experts=True)
        if weights_read != 1.0:   # (None: the dtype's bytes)
            stored = [(b if w is None else w) * weights_read for w in stored]
        w_up, w_down = stored
        return (grouped_gemm_time_scalar(groups, per, n_up, k_up, self._gemm_peak, self._bw, b, p, eff, w_up, tiles)
                + grouped_gemm_time_scalar(groups, per, n_down, k_down, self._gemm_peak, self._bw, b, p, eff, w_down,
                                           tiles))

    def moe_kernel_time(self, tokens: int) -> float:
        """Seconds of one mixture-of-experts layer's fused kernels as vLLM's kernel benchmark times them
        (``benchmarks/kernels/benchmark_moe.py``): replayed from a CUDA graph, so each launch costs the
        engine's ``graph_kernel_s``; the router GEMM left out (the benchmark is handed its logits);
        SiLU-and-mul, which the engine prices with the fused elementwise kernels, put in (its traffic at the
        copy bandwidth and one launch). Needs the engine terms and a mixture-of-experts model."""
        m, p, e = self.model, self.params, self.engine
        if e is None or not m.num_experts:
            raise ValueError("moe_kernel_time needs the engine terms and a mixture-of-experts model")
        router = gemm_time_scalar(tokens, m.num_experts, m.hidden_size, self._peak, self._bw, m.activation_bytes, p)
        inter = m.intermediate_size // self.hardware.tensor_parallel
        silu = tokens * m.experts_per_token * 3 * inter * m.activation_bytes / (self._bw * p.memory_eff)
        launches = 2 + MOE_AUX_KERNELS   # the two grouped GEMMs and the small kernels
        return (self._moe_mlp_time(tokens) - router - launches * p.kernel_latency_s
                + (launches + 1) * e.graph_kernel_s + silu)

    def _linear(self, tokens: int) -> tuple[float, float]:
        """(linear seconds over all layers, all-reduce seconds over all layers) for ``tokens`` tokens."""
        hit = self._linear_cache.get(tokens)
        if hit is None:
            hw = self.hardware
            lin = sum(n * self.layer_linear_time(tokens, dense) for n, dense in self._layer_groups)
            comm = 2 * self._layers * float(allreduce_time(tokens * self._act_bytes, hw.tensor_parallel,
                                                           hw.interconnect_bandwidth, hw.interconnect_latency_s,
                                                           self.params))
            hit = self._linear_cache[tokens] = (lin, comm)
        return hit

    def _lm_head(self, seqs: int) -> float:
        if not self._has_lm_head:
            return 0.0
        hit = self._head_cache.get(seqs)
        if hit is None:
            # (16-bit under W8A8 too: its LM head is not quantized, ``ModelSpec.activation_bytes``)
            hit = self._head_cache[seqs] = gemm_time_scalar(seqs, self._vocab_shard, self.model.hidden_size,
                                                            self._peak, self._bw, self.model.activation_bytes,
                                                            self.params)
        return hit

    def describe(self) -> dict[str, Any]:
        """What prices the steps (a run summary's ``step_model``)."""
        out = {"executor": "cost_model", "calibration": self.calibration, "engine_terms": self.engine is not None}
        if self.derived_from is not None:
            out["derived_from"] = self.derived_from
        if self.calibrated_for is not None:
            out["calibrated_for"] = self.calibrated_for
        if self.drafter is not None:
            out.update(self.drafter.describe())
        return out

    @property
    def swap_s_per_block(self) -> float:
        """A block's time over the host link (a swap, or a load from the prefix cache's host tier)."""
        return self._swap_s_per_block

    def _operator_attention(self, pre_new: int, pre_ctx: int, pairs: int, dec_seqs: int, dec_ctx: int,
                            queries: int) -> float:
        """One layer's attention as isolated kernels: the prefills' and the decodes', each a roofline of its
        FLOPs and bytes plus a kernel's latency."""
        lat = self.params.kernel_latency_s
        per_layer = 0.0
        if pre_new:
            per_layer += max(self._attn_flops_per_pair * pairs / self._attn_peak,
                             self._attn_new_bytes * pre_new / self._attn_bw + self._attn_kv_s * pre_ctx) + lat
        if dec_seqs:
            per_layer += max(self._attn_dec_flops_per_pair * dec_ctx / self._attn_peak,
                             self._attn_dec_kv_s * dec_ctx + self._attn_dec_new_bytes * queries / self._attn_bw) \
                + lat
        return per_layer

    def execute(self, plan: StepPlan) -> StepResult:
        tokens = seqs = 0
        pairs = pre_new = pre_ctx = 0
        dec_seqs = dec_ctx = 0
        entries = plan.scheduled
        win = None
        lane_keys = 0   # (a lane's decode keys on the local-attention layers, where the model has them)
        if type(entries) is LaneEntries:   # a decode lane: its size and context sum (all contexts > 0)
            tokens = seqs = dec_seqs = len(entries.ids)
            dec_ctx = entries.ctx_sum + dec_seqs
            if self._local_layers:
                lane_keys = self._local.lane_decode_keys(entries.ctx)
            entries = entries.rest
        drafts = ver_seqs = ver_ctx = 0
        for s in entries:
            n, c = s.num_new_tokens, s.num_context_tokens
            tokens += n
            seqs += 1
            if n == 1 and c > 0:
                dec_seqs += 1
                dec_ctx += c + 1
            elif s.num_draft_tokens:   # a verification: a decode of 1 + d queries, reading c + 1 + d tokens of KV
                dec_seqs += 1
                dec_ctx += c + n
                drafts += n - 1
                ver_seqs += 1
                ver_ctx += c + 1
            else:
                pre_new += n
                pre_ctx += c
                pairs += n * c + n * (n + 1) // 2
        if self._local_layers:   # (decode keys, prefill cached tokens, prefill pairs) the local layers see
            w_dec, w_pairs, w_cached = self._local.step_stats(entries)
            win = (lane_keys + w_dec, w_cached, w_pairs)
        spec = None   # (every step of a speculating engine has a draft part, so that its table has the column)
        if self.drafter is not None:
            spec = (drafts, self.drafter.price(ver_seqs, ver_ctx, drafts))
        elif ver_seqs:
            spec = (drafts, 0.0)
        if self.engine is not None and tokens:
            swap = (len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)) * self._swap_s_per_block
            copy = len(plan.blocks_to_copy) * self._copy_s_per_block
            lora = None if self._lora is None else self._lora_parts(plan, tokens <= self._graph_max)
            return self._engine_step(tokens, seqs, dec_seqs, dec_ctx, pre_new, pre_ctx, pairs, swap, copy, spec, win,
                                     lora)
        linear = attention = elementwise = comm = 0.0
        if tokens:
            lin, comm = self._linear(tokens)
            linear = lin + self._lm_head(seqs)
            if spec is not None:   # a query and a row of logits for each draft token too
                linear += self._lm_head(seqs + drafts) - self._lm_head(seqs)
            per_layer = self._operator_attention(pre_new, pre_ctx, pairs, dec_seqs, dec_ctx, dec_seqs + drafts)
            if win is None:
                attention = self._layers * (per_layer + dec_seqs * self._attn_seq + (seqs - dec_seqs) * self._attn_pre_seq)
            else:   # the local-attention layers' attention over what they see
                per_seq = dec_seqs * self._attn_seq + (seqs - dec_seqs) * self._attn_pre_seq
                windowed = self._operator_attention(pre_new, win[1], win[2], dec_seqs, win[0], dec_seqs + drafts)
                attention = self._full_layers * (per_layer + per_seq) + self._local_layers * (windowed + per_seq)
            elementwise = self._layers * (tokens * self._elem_s_per_token + self._elem_fixed)
        swap = (len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)) * self._swap_s_per_block
        copy = len(plan.blocks_to_copy) * self._copy_s_per_block
        overhead = self._overhead if tokens else self._empty_step_s
        breakdown = {"linear": linear, "attention": attention, "elementwise": elementwise, "allreduce": comm,
                     "swap": swap, "copy": copy, "overhead": overhead}
        duration = linear + attention + elementwise + comm + swap + copy + overhead
        if spec is not None:
            breakdown["draft"] = spec[1]
            duration += spec[1]
        if self._lora is not None:   # (every step of a LoRA engine has the part, so that its table has the column)
            kernels, loads = self._lora_parts(plan, False) if tokens else (0.0, plan.lora_load_s)
            breakdown["lora"] = kernels + loads
            duration += kernels + loads
        return StepResult(duration_s=duration, breakdown=breakdown)


def make_cost_model_executor(*, model: ModelSpec, hardware: HardwareSpec, config: Any = None, kv: Any = None,
                             num_gpu_blocks: int = 0, num_cpu_blocks: int = 0, base_dir: Path | None = None,
                             scheduler: Any = None, **_: Any) -> CostModelExecutor:
    """Registry factory: params from ``config.calibration`` (a file or a shipped name); without one, the
    calibration shipped for the hardware (by its name; for a GPU without measurements, derived from one on the
    same chip), else the uncalibrated roofline. ``calibration: roofline`` asks for the uncalibrated roofline
    explicitly. A calibration made for other hardware is used as given and named in ``describe()``
    (``calibrated_for``). The engine terms follow the scheduler: CUDA graphs captured up to its batch, and
    without async scheduling (``scheduler.async_scheduling: false``) a step's CPU side not hidden."""
    ref = getattr(config, "calibration", None)
    if ref is None and shipped_calibration(hardware.name) is not None:
        ref = hardware.name
    engine = derived = other = None
    if ref and ref != "roofline":
        params, doc = load_calibration(ref, base_dir)
        engine = engine_params_of(doc, str(ref))
        derived = doc.get("derived_from")
        made_for = doc.get("hardware")
        other = made_for if made_for not in (None, hardware.name) else None
    else:
        params = default_params(hardware)
        ref = "roofline"
    overhead = getattr(config, "step_overhead_s", None)
    if overhead is not None:
        params.step_overhead_s = overhead
    if engine is not None:
        if getattr(config, "engine", True) is False:
            engine = None   # executor.engine: false prices isolated operators (the per-operator model)
        elif scheduler is not None:
            engine.graph_max_tokens = min(engine.graph_max_tokens, graph_max_tokens_for(scheduler.max_num_seqs))
            if not getattr(scheduler, "async_scheduling", True):
                engine.overlap_cpu = False   # without async scheduling a step's CPU side runs before its GPU work
    block_size = getattr(kv, "block_size", 16)
    if hardware.pipeline_parallel > 1:   # one executor a stage kind, the step priced as the pipeline runs it
        from sim.executors.pipeline import PipelineExecutor

        return PipelineExecutor.build(model, hardware, params, block_size, engine, scheduler,
                                      calibration=str(ref), derived_from=derived, calibrated_for=other)
    return CostModelExecutor(model, hardware, params, block_size=block_size, engine=engine,
                             calibration=str(ref), derived_from=derived, calibrated_for=other)
