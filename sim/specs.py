"""Model and hardware specifications, their presets, and the KV-cache arithmetic.

Invariants:
- ``head_dim * num_heads`` need not equal ``hidden_size`` (it does for every preset here).
- KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes; with GQA kv_heads < heads;
  under multi-head latent attention layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes, on every GPU.
- Weight-only quantization (``weight_dtype``) narrows the layers' projection and expert weights alone: a
  [K, N] matrix takes K x N x bits / 8 bytes plus one fp16 scale per group of ``weight_group_size`` rows of
  K in each of its N columns; embeddings, LM head, norms and the router keep ``dtype``.
- Presets are immutable; a scenario may give a mapping instead, validated with ``extra="forbid"``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.executors.local_attention import LocalAttention

GiB = 1024**3
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
W8A8_DTYPES = ("fp8", "int8")   # a model dtype of 8 bits: its projections' weights and inputs (W8A8)
# weight-only quantized linear weights (AWQ, GPTQ, Marlin): bits a weight; the GEMMs dequantize them to the
# model's dtype and multiply at its rate
WEIGHT_DTYPE_BITS = {"int4": 4, "int8": 8, "fp8": 8, "mxfp4": 4}
SCALE_BYTES = 2   # one fp16 scale a group of quantized weights
# a scale's bytes where it is not fp16: MXFP4's shared exponent (e8m0), one a block of 32 elements
WEIGHT_SCALE_BYTES = {"mxfp4": 1}
MXFP4_BLOCK = 32


class ModelSpec(BaseModel):
    """The shape of a decoder-only transformer: all the simulator needs to price it and size its KV."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = "custom"
    num_layers: int = Field(gt=0, le=10_000)
    hidden_size: int = Field(gt=0, le=1 << 20)
    num_heads: int = Field(gt=0, le=1 << 16)
    num_kv_heads: int = Field(gt=0, le=1 << 16)
    head_dim: int = Field(gt=0, le=1 << 16)
    intermediate_size: int = Field(gt=0, le=1 << 22)
    vocab_size: int = Field(gt=0, le=1 << 24)
    max_model_len: int = Field(gt=0, le=1 << 24)   # (Llama 4 Scout's: 10,485,760)
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs a plain two-matrix MLP (OPT)
    tied_embeddings: bool = False
    dtype: str = "fp16"
    # the KV cache's element type; None: the model's dtype (vLLM's kv_cache_dtype "auto"). Scenarios set it with
    # kv_cache.dtype (scenario.py)
    kv_dtype: str | None = None
    # mixture of experts (Mixtral): each layer's MLP is num_experts experts of intermediate_size, a router
    # sends every token to experts_per_token of them; 0 = a dense MLP
    num_experts: int = Field(default=0, ge=0, le=1024)
    experts_per_token: int = Field(default=0, ge=0, le=1024)
    # shared experts (Qwen-MoE, DeepSeek): a gated MLP of this width beside the routed experts on every
    # mixture-of-experts layer, run by every token (DeepSeek's n_shared_experts x moe_intermediate_size,
    # Qwen's shared_expert_intermediate_size; Qwen's sigmoid gate on them, hidden to 1, is not priced); 0: none
    shared_expert_size: int = Field(default=0, ge=0, le=1 << 22)
    # layers whose MLP is a dense one of dense_intermediate_size instead of the experts (DeepSeek's
    # first_k_dense_replace, Qwen-MoE's mlp_only_layers); the other num_layers - dense_layers are mixtures
    dense_layers: int = Field(default=0, ge=0, le=10_000)
    dense_intermediate_size: int = Field(default=0, ge=0, le=1 << 22)
    # multi-head latent attention (DeepSeek-V2/V3): each layer caches one latent of kv_lora_rank plus the
    # rotary key's qk_rope_head_dim per token, on every GPU of a tensor-parallel group (vLLM does not shard
    # it); head_dim is the query's and key's head (qk_nope_head_dim + qk_rope_head_dim), v_head_dim the
    # value's; queries come through a q_lora_rank bottleneck (0: straight from the hidden state). 0: none
    kv_lora_rank: int = Field(default=0, ge=0, le=1 << 16)
    qk_rope_head_dim: int = Field(default=0, ge=0, le=1 << 16)
    v_head_dim: int = Field(default=0, ge=0, le=1 << 16)
    q_lora_rank: int = Field(default=0, ge=0, le=1 << 20)
    # sliding-window attention (Mistral-7B-v0.1, Gemma 2 and 3, gpt-oss): on ``sliding_layers`` of the layers
    # (None: all of them) a query attends only its own token and the sliding_window - 1 before it; 0: every
    # layer attends the whole context (``local_layers``)
    sliding_window: int = Field(default=0, ge=0, le=10_000_000)
    sliding_layers: int | None = Field(default=None, ge=1, le=10_000)
    # chunked local attention (Llama 4): on ``chunked_layers`` of the layers (None: all of them) a query
    # attends only the tokens of its own chunk of attention_chunk_size, up to itself; 0: none
    attention_chunk_size: int = Field(default=0, ge=0, le=10_000_000)
    chunked_layers: int | None = Field(default=None, ge=1, le=10_000)
    # how the KV cache keeps local-attention layers (a cache setting: scenarios set it with
    # kv_cache.hybrid_manager): True frees their blocks once no query sees them, as vLLM's hybrid KV cache
    # manager does (``kv_pages``); False keeps every token of every layer (--disable-hybrid-kv-cache-manager)
    hybrid_kv: bool = True
    # weight-only quantization of the projections and experts (vLLM's AWQ / GPTQ / Marlin kernels: int4 or
    # int8, or fp8 weights with fp16 activations); None: their weights are in ``dtype``. Scales: one fp16 per
    # ``weight_group_size`` rows of K in each column (0: one per column, "per channel")
    weight_dtype: str | None = None
    weight_group_size: int = Field(default=128, ge=0, le=1 << 20)
    # which weights ``weight_dtype`` covers: every projection and expert ("all"), or a mixture of experts'
    # routed experts alone ("experts": gpt-oss's MXFP4 checkpoints, whose attention, router, embeddings and
    # LM head stay in ``dtype``, as vLLM's MXFP4 method quantizes only the fused MoE layers)
    weight_scope: Literal["all", "experts"] = "all"

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.kv_dtype is not None and self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"kv_dtype must be one of {sorted(DTYPE_BYTES)}, got {self.kv_dtype!r}")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token must be 1 .. num_experts ({self.num_experts}), "
                             f"got {self.experts_per_token}")
        if self.experts_per_token and not self.num_experts:
            raise ValueError("experts_per_token needs num_experts")
        for key in ("shared_expert_size", "dense_layers"):
            if getattr(self, key) and not self.num_experts:
                raise ValueError(f"{key} needs num_experts (it describes a mixture of experts)")
        if self.dense_layers >= self.num_layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be fewer than num_layers ({self.num_layers}): "
                             "a model of dense layers only has no experts")
        if bool(self.dense_layers) != bool(self.dense_intermediate_size):
            raise ValueError("dense_layers and dense_intermediate_size go together (both set, or neither)")
        if self.kv_lora_rank:
            if not (0 < self.qk_rope_head_dim < self.head_dim) or not self.v_head_dim:
                raise ValueError(f"latent attention (kv_lora_rank {self.kv_lora_rank}) needs qk_rope_head_dim below "
                                 f"head_dim ({self.head_dim}: the rotary and the other part of a query's head) "
                                 "and v_head_dim")
        elif self.qk_rope_head_dim or self.v_head_dim or self.q_lora_rank:
            raise ValueError("qk_rope_head_dim, v_head_dim and q_lora_rank describe latent attention and need "
                             "kv_lora_rank")
        if self.sliding_layers is not None and not self.sliding_window:
            raise ValueError("sliding_layers needs sliding_window (the window those layers attend over)")
        if self.sliding_layers is not None and self.sliding_layers > self.num_layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) must be at most num_layers ({self.num_layers})")
        if self.chunked_layers is not None and not self.attention_chunk_size:
            raise ValueError("chunked_layers needs attention_chunk_size (the chunk those layers attend within)")
        if self.chunked_layers is not None and self.chunked_layers > self.num_layers:
            raise ValueError(f"chunked_layers ({self.chunked_layers}) must be at most num_layers ({self.num_layers})")
        if self.sliding_window and self.attention_chunk_size:
            raise ValueError("sliding_window and attention_chunk_size together are not modelled (a model with "
                             "both kinds of local attention)")
        if (self.sliding_window or self.attention_chunk_size) and self.latent_attention:
            raise ValueError("local attention (sliding_window, attention_chunk_size) with latent attention "
                             "(kv_lora_rank) is not modelled")
        if self.weight_dtype is not None:
            if self.weight_dtype not in WEIGHT_DTYPE_BITS:
                raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPE_BITS)} (or absent), "
                                 f"got {self.weight_dtype!r}")
            if WEIGHT_DTYPE_BITS[self.weight_dtype] >= 8 * DTYPE_BYTES[self.dtype]:
                raise ValueError(f"weight_dtype {self.weight_dtype} is not narrower than dtype {self.dtype}: "
                                 "weight-only quantization stores weights in fewer bits than the activations")
            if self.weight_dtype == "mxfp4" and self.weight_group_size != MXFP4_BLOCK:
                raise ValueError(f"weight_dtype mxfp4 shares one exponent a block of {MXFP4_BLOCK} elements: "
                                 f"weight_group_size must be {MXFP4_BLOCK}, got {self.weight_group_size}")
        if self.weight_scope == "experts" and not self.num_experts:
            raise ValueError("weight_scope experts needs num_experts (a mixture of experts' routed experts)")
        return self

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def activation_bytes(self) -> int:
        """Bytes of an activation element between the GEMMs (the residual stream, norms, rotary, SiLU, the
        all-reduces, the logits) and of every weight that is not a projection's (embeddings, LM head, norms):
        the dtype's, but 16-bit under 8-bit weights and activations (``dtype`` fp8 or int8, W8A8): vLLM's
        W8A8 linear methods quantize each GEMM's input on the fly and return the checkpoint's bf16, whose
        embeddings, LM head and norms stay unquantized."""
        return 2 if self.dtype in W8A8_DTYPES else DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V element: ``kv_dtype``'s, else the model's dtype's."""
        return DTYPE_BYTES[self.kv_dtype or self.dtype]

    @property
    def latent_attention(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank``)."""
        return self.kv_lora_rank > 0

    @property
    def latent_size(self) -> int:
        """Elements one token caches a layer under latent attention: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def local_layers(self) -> int:
        """How many layers see only part of the context: ``sliding_layers`` or ``chunked_layers``, all of them
        where only the window or chunk is given, none without one (or with one of at least ``max_model_len``:
        no context outgrows it)."""
        span = self.sliding_window or self.attention_chunk_size
        if not span or span >= self.max_model_len:
            return 0
        layers = self.sliding_layers if self.sliding_window else self.chunked_layers
        return self.num_layers if layers is None else layers

    @property
    def local_attention(self) -> LocalAttention | None:
        """What the ``local_layers`` see (a sliding window, or a chunk), as sim/executors/local_attention.py
        prices it; None where every layer attends the whole context."""
        if not self.local_layers:
            return None
        if self.sliding_window:
            return LocalAttention(self.sliding_window)
        return LocalAttention(self.attention_chunk_size, chunked=True)

    def kv_pages(self) -> tuple[int, int] | None:
        """(layers a block holds, pages a logical block takes on the local-attention layers) where the cache
        frees their blocks as vLLM's hybrid KV cache manager does (``hybrid_kv``); None where every layer
        keeps every token. vLLM groups the layers of each kind into groups of one size g: the smaller
        kind's count, or the larger's where that is under 1.5 times it (gpt-oss: 12 and 12, g = 12; Gemma-3-27B:
        10 full, 52 sliding, g = 10 and six sliding groups, the last padded); a block is a page of one group.
        kvsim keeps the full layers' table as a full-attention model's, so it pages a model whose full layers
        fill one group (all but models with 1.5 times more full layers than local ones) and that has full
        layers at all (a model whose every layer is local, Mistral-7B-v0.1's, is ``sliding_only``): the others
        keep every token."""
        sliding = self.local_layers
        full = self.num_layers - sliding
        if not self.hybrid_kv or not sliding or not full:
            return None
        small, large = min(full, sliding), max(full, sliding)
        group = large if large < 1.5 * small else small
        if -(-full // group) != 1:
            return None
        return group, -(-sliding // group)

    def sliding_only(self) -> bool:
        """Whether every layer is local and the cache keeps only what their queries see (``hybrid_kv``): vLLM's
        hybrid manager then keeps one group of all the layers, each request's blocks behind the window freed
        (sim/kv/sliding_only.py; Mistral-7B-v0.1 and its fine-tunes: every layer a 4,096-token window)."""
        return self.hybrid_kv and self.local_layers == self.num_layers > 0

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """2 x layers x kv_heads x head_dim x bytes (of ``dtype``, else the KV dtype): the K and V of one token in
        every layer; under latent attention layers x (kv_lora_rank + qk_rope_head_dim) x bytes, one latent a
        layer (for one GPU: each GPU of a group holds them all, ``kv_replicas``)."""
        nbytes = DTYPE_BYTES[dtype] if dtype else self.kv_dtype_bytes
        if self.latent_attention:
            return self.num_layers * self.latent_size * nbytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * nbytes

    def kv_bytes_per_block(self, block_size: int, dtype: str | None = None) -> int:
        """A block's bytes: ``block_size`` tokens of every layer, or under ``kv_pages`` of one group's layers."""
        pages = self.kv_pages()
        if pages is None:
            return block_size * self.kv_bytes_per_token(dtype)
        return block_size * self.kv_bytes_per_token(dtype) // self.num_layers * pages[0]

    def tensor_parallel_problem(self, tp: int, expert_parallel: bool = False) -> str | None:
        """Why ``tp`` GPUs cannot shard this model the way vLLM does (None: they can). vLLM splits the
        attention heads and the MLP's intermediate size evenly, and the KV heads evenly too, or, with more
        GPUs than KV heads, gives each GPU a copy of one (``tp`` a multiple of them). ``expert_parallel``: a
        mixture of experts' routed experts are placed whole (their width not split)."""
        if self.num_heads % tp:
            return f"{tp} does not divide {self.name}'s {self.num_heads} attention heads (vLLM shards them evenly)"
        kv = self.num_kv_heads
        if not self.latent_attention and (kv % tp if tp <= kv else tp % kv):
            return (f"{tp} GPUs cannot share {self.name}'s {kv} KV heads: vLLM splits them evenly, or with more "
                    f"GPUs than KV heads copies one to each, so the GPU count must divide {kv} or be a multiple of it")
        routed = 0 if expert_parallel and self.num_experts else self.intermediate_size
        for width, what in ((routed, "MLP intermediate size"),
                            (self.shared_expert_size, "shared experts' width"),
                            (self.dense_intermediate_size, "dense layers' MLP width")):
            if width % tp:
                return f"{tp} does not divide {self.name}'s {what} {width}"
        return None

    def kv_replicas(self, tp: int) -> int:
        """How many GPUs of a ``tp`` group hold each KV head: 1, or tp / KV heads when there are more GPUs
        than KV heads (each holds a copy of one), which multiplies the group's KV bytes per token; every GPU
        (``tp``) under latent attention, whose one latent a layer vLLM does not shard."""
        if self.latent_attention:
            return tp
        return tp // self.num_kv_heads if tp > self.num_kv_heads else 1

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_groups(self) -> list[tuple[int, bool]]:
        """(layers, dense) for each kind of layer the model has, in a fixed order: a dense model's layers all
        dense; a mixture of experts' ``num_layers - dense_layers`` expert layers, then its dense ones."""
        if not self.num_experts:
            return [(self.num_layers, True)]
        groups = [(self.num_layers - self.dense_layers, False)]
        return groups + [(self.dense_layers, True)] if self.dense_layers else groups

    def projection_matrices(self, dense: bool = False) -> list[tuple[int, int, int]]:
        """One layer's projection weights as (K, N, copies): fused QKV, output, gate and up (or up), down;
        copies = the experts of a mixture of experts (the router is not a projection), whose shared experts
        follow as another gate-and-up and down. ``dense``: a mixture of experts' dense layer (its MLP of
        ``dense_intermediate_size``); a dense model's layers are the same either way."""
        h = self.hidden_size
        attention = self.attention_matrices()
        gate = 2 if self.gated_mlp else 1
        if not self.num_experts or dense:
            width = self.dense_intermediate_size if self.num_experts else self.intermediate_size
            return attention + [(h, gate * width, 1), (width, h, 1)]
        inter, experts = self.intermediate_size, self.num_experts
        mlp = [(h, gate * inter, experts), (inter, h, experts)]
        shared = [(h, gate * self.shared_expert_size, 1), (self.shared_expert_size, h, 1)] \
            if self.shared_expert_size else []
        return attention + mlp + shared

    def attention_matrices(self, tp: int = 1) -> list[tuple[int, int, int]]:
        """One layer's attention projections as (K, N, 1) on one of ``tp`` GPUs: fused QKV and output (ceil(heads
        / tp) query heads, ceil(kv_heads / tp) KV heads); under latent attention (vLLM's names) the query's down
        projection fused with the latent's (fused_qkv_a_proj; without a q_lora_rank, kv_a_proj_with_mqa and
        q_proj), which vLLM does not shard, the query's up projection (q_b_proj), the latent's up projection
        to each head's key and value (kv_b_proj), and the output (o_proj), over the GPU's heads."""
        h, hd = self.hidden_size, self.head_dim
        heads = math.ceil(self.num_heads / tp)
        if not self.latent_attention:
            q, kv = heads * hd, math.ceil(self.num_kv_heads / tp) * hd
            return [(h, q + 2 * kv, 1), (q, h, 1)]
        query = [(h, self.q_lora_rank + self.latent_size, 1), (self.q_lora_rank, heads * hd, 1)] \
            if self.q_lora_rank else [(h, self.latent_size, 1), (h, heads * hd, 1)]
        up = (self.kv_lora_rank, heads * (hd - self.qk_rope_head_dim + self.v_head_dim), 1)
        return [*query, up, (heads * self.v_head_dim, h, 1)]

    def layer_params(self, dense: bool = False) -> int:
        """Parameters of one layer: fused QKV, output projection, MLP (every expert, the shared experts and the
        router on an expert layer), two norms (latent attention: two more, on the query's and the latent's
        bottlenecks)."""
        router = 0 if dense else self.hidden_size * self.num_experts
        norms = 2 * self.hidden_size + (self.q_lora_rank + self.kv_lora_rank if self.latent_attention else 0)
        return sum(k * n * c for k, n, c in self.projection_matrices(dense)) + router + norms

    def activated_mlp_width(self, tp: int = 1) -> int | float:
        """The MLP width one token runs through in a layer on one of ``tp`` GPUs, on average over the layers:
        the experts it is routed to plus the shared experts on an expert layer, the dense width on a dense one
        (what the activation between gate-and-up and down reads). An int where the layers are alike."""
        total = 0
        for layers, dense in self.layer_groups():
            if dense:
                total += layers * ((self.dense_intermediate_size if self.num_experts else self.intermediate_size) // tp)
            else:
                total += layers * (self.intermediate_size // tp * self.experts_per_token + self.shared_expert_size // tp)
        return total // self.num_layers if total % self.num_layers == 0 else total / self.num_layers

    def weight_bytes_per_element(self, k: int, expert: bool = True) -> float:
        """Bytes a projection weight of a [K = ``k``, N] matrix takes as stored, scales included: the dtype's
        bytes, or with ``weight_dtype`` its bits / 8 plus a scale (2 bytes; MXFP4's 1) per group of K rows,
        ceil(k / group) groups a column (a group size of 0: one scale a column). ``expert``: whether the matrix
        is a routed expert's (under ``weight_scope`` experts, only those are quantized)."""
        if self.weight_dtype is None or not (expert or self.weight_scope == "all"):
            return float(self.dtype_bytes)
        group = self.weight_group_size or k
        scale = WEIGHT_SCALE_BYTES.get(self.weight_dtype, SCALE_BYTES)
        return WEIGHT_DTYPE_BITS[self.weight_dtype] / 8 + scale * math.ceil(k / group) / k

    def num_params(self) -> int:
        """All parameters: layers, token embedding, LM head (unless tied), final norm."""
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else emb
        layers = sum(n * self.layer_params(dense) for n, dense in self.layer_groups())
        return layers + emb + head + self.hidden_size

    def activated_params(self) -> int:
        """Parameters one token runs through: ``num_params`` with a mixture of experts' routed experts counted
        only ``experts_per_token`` of ``num_experts`` (the model cards' "activated" figure: Qwen1.5-MoE-A2.7B's
        2.7B, DeepSeek-V3's 37B); a dense model's all of them."""
        if not self.num_experts:
            return self.num_params()
        h, inter, gate = self.hidden_size, self.intermediate_size, 2 if self.gated_mlp else 1
        idle = (self.num_experts - self.experts_per_token) * (gate + 1) * h * inter
        return self.num_params() - (self.num_layers - self.dense_layers) * idle

    def weight_bytes(self) -> int:
        """Bytes of every weight as stored: ``num_params`` x dtype bytes; under W8A8 (``dtype`` fp8 or int8) the
        projections and experts in it and the rest (embeddings, LM head, norms) 16-bit
        (``activation_bytes``); with ``weight_dtype`` the projections and experts (the routed experts alone
        under ``weight_scope`` experts) at its bits plus their scales (``weight_bytes_per_element``) and the
        rest in ``dtype``."""
        if self.weight_dtype is None and self.activation_bytes == self.dtype_bytes:
            return self.num_params() * self.dtype_bytes
        quantized = self.weight_dtype is not None
        bits = WEIGHT_DTYPE_BITS[self.weight_dtype] if quantized else 8 * self.dtype_bytes
        scale = WEIGHT_SCALE_BYTES.get(self.weight_dtype, SCALE_BYTES) if quantized else 0
        routed = len(self.attention_matrices())   # (the routed experts' gate-and-up and down follow attention)
        proj = proj_params = 0
        for layers, dense in self.layer_groups():
            for i, (k, n, copies) in enumerate(self.projection_matrices(dense)):
                if quantized and self.weight_scope == "experts" and (dense or not routed <= i < routed + 2):
                    continue   # (kept in the dtype with the rest)
                group = self.weight_group_size or k
                proj += layers * copies * (k * n * bits // 8 + scale * math.ceil(k / group) * n)
                proj_params += layers * copies * k * n
        return proj + (self.num_params() - proj_params) * self.activation_bytes

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """A preset by its name, or by a Hugging Face id of it ('meta-llama/Llama-3.1-8B-Instruct'; a quantized
        checkpoint's id, 'TheBloke/Llama-2-7B-AWQ', is the preset quantized that way: sim/model_ids.py)."""
        key = name.lower()
        if key in MODEL_PRESETS:
            return MODEL_PRESETS[key]
        from sim.model_ids import model_preset, quantized_model  # (it reads the presets defined here)

        preset = model_preset(name)
        spec = MODEL_PRESETS[preset] if preset is not None else quantized_model(name)
        if spec is None:
            raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(MODEL_PRESETS))} "
                           "(or a Hugging Face id of one, or a config.json path)")
        return spec


# (bandwidth in GB/s per direction, latency in seconds) of one transfer path between GPUs: a prefill/decode
# KV transfer (cluster.kv_transfer.link) or the hidden states between pipeline stages (hardware.pipeline_link)
LINK_PRESETS: dict[str, tuple[float, float]] = {
    "nvlink": (450.0, 2e-6),            # NVLink 4 (H100): 900 GB/s bidirectional per GPU
    "infiniband-400g": (50.0, 5e-6),    # NDR 400 Gb/s
    "ethernet-100g": (12.5, 20e-6),     # 100 GbE (RoCE)
}
GPUS_PER_NODE = 8   # an NVLink domain (HGX / DGX H100, A100): a replica of more GPUs spans nodes


class LinkSpec(BaseModel):
    """A transfer path given by its figures: GB/s per direction and a latency in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bandwidth_gb_s: float = Field(gt=0, le=1e9)
    latency_s: float = Field(default=0.0, ge=0, le=60)


class HardwareSpec(BaseModel):
    """One accelerator (or a tensor-parallel group of identical ones, or a pipeline of such groups) and its
    host link.

    Bandwidths are bytes/s, compute is dense fp16/bf16 FLOP/s without sparsity (``peak_flops``; ``peak_flops_fp8``
    the dense fp8 rate of GPUs with fp8 tensor cores, 0 for one without: there fp8 weights are multiplied at the
    fp16 rate, as weight-only fp8 kernels do), memory in bytes.
    With ``tensor_parallel = t`` each GPU holds 1/t of the weights and heads, and each layer adds
    all-reduces over the interconnect; with ``expert_parallel`` a mixture of experts' routed experts are
    placed whole on the t GPUs instead (sim/expert_parallel.py). With ``pipeline_parallel = p`` the layers are split into p stages, each
    on t GPUs of its own (sim/pipeline_stages.py), the hidden states crossing ``pipeline_link`` between them
    (sim/executors/pipeline.py): a replica is t x p GPUs (``gpus``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = "custom"
    hbm_bytes: int = Field(gt=0, le=1 << 50)
    hbm_bandwidth: float = Field(gt=0, le=1e18)
    peak_flops: float = Field(gt=0, le=1e21)
    peak_flops_fp8: float = Field(default=0.0, ge=0, le=1e21)
    host_link_bandwidth: float = Field(gt=0, le=1e18)
    interconnect_bandwidth: float = Field(default=0.0, ge=0, le=1e18)  # per-GPU NVLink bytes/s; 0: PCIe only
    interconnect_latency_s: float = Field(default=5e-6, ge=0, le=1.0)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    # a mixture of experts' routed experts placed whole on the tensor-parallel GPUs instead of each split over
    # them (vLLM's --enable-expert-parallel without data parallelism: sim/expert_parallel.py)
    expert_parallel: bool = False
    # between pipeline stages: a LINK_PRESETS name or {bandwidth_gb_s, latency_s}; None: NVLink where the
    # replica's GPUs fit one node (GPUS_PER_NODE), else InfiniBand 400G (``pipeline_link_figures``)
    pipeline_link: str | LinkSpec | None = None

    @field_validator("pipeline_link")
    @classmethod
    def _known_link(cls, v: str | LinkSpec | None) -> str | LinkSpec | None:
        if isinstance(v, str) and v not in LINK_PRESETS:
            raise ValueError(f"unknown link {v!r}; known: {', '.join(LINK_PRESETS)} or {{bandwidth_gb_s, latency_s}}")
        return v

    @property
    def gpus(self) -> int:
        """The GPUs of one replica: tensor_parallel x pipeline_parallel."""
        return self.tensor_parallel * self.pipeline_parallel

    def pipeline_link_figures(self) -> tuple[float, float]:
        """(bytes per second, seconds) of the link between pipeline stages."""
        link = self.pipeline_link
        if link is None:
            link = "nvlink" if self.gpus <= GPUS_PER_NODE else "infiniband-400g"
        if isinstance(link, str):
            bw, lat = LINK_PRESETS[link]
        else:
            bw, lat = link.bandwidth_gb_s, link.latency_s
        return bw * 1e9, lat

    @classmethod
    def from_name(cls, name: str) -> HardwareSpec:
        key = name.lower()
        if key not in HARDWARE_PRESETS:
            raise KeyError(f"unknown hardware preset {name!r}; known: {', '.join(sorted(HARDWARE_PRESETS))}")
        return HARDWARE_PRESETS[key]


def complete_from_preset(value, spec: type[ModelSpec] | type[HardwareSpec]):
    """A mapping whose ``name`` is a preset of ``spec`` (any case) as that preset's fields updated by the
    mapping's own, under the preset's name (``hardware: {name: H100-80GB, tensor_parallel: 4}``: the
    h100-80gb preset at TP 4, with its shipped calibration); anything else as it is (pydantic validators,
    before the mapping is checked field by field)."""
    preset = preset_named(value.get("name"), spec) if isinstance(value, dict) else None
    return value if preset is None else {**preset.model_dump(), **value, "name": preset.name}


def preset_named(name: Any, spec: type[ModelSpec] | type[HardwareSpec]) -> ModelSpec | HardwareSpec | None:
    """The preset of ``spec`` called ``name`` (any case), or None when ``name`` is no such preset."""
    if not isinstance(name, str):
        return None
    try:
        return spec.from_name(name)
    except KeyError:
        return None


def check_preset(value, spec: type[ModelSpec] | type[HardwareSpec]):
    """A preset name must name a preset of ``spec`` (else ValueError listing the known ones); a mapping or
    a spec passes through (pydantic validators of scenario keys that take either)."""
    if isinstance(value, str):
        try:
            spec.from_name(value)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
    return value


def group_kv_bytes_per_block(model: ModelSpec, hardware: HardwareSpec, block_size: int) -> int:
    """The bytes one KV block takes over a tensor-parallel group: the model's, times the copies of each KV
    head when the group has more GPUs than KV heads (``ModelSpec.kv_replicas``)."""
    return model.kv_bytes_per_block(block_size) * model.kv_replicas(hardware.tensor_parallel)


def kv_capacity_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: int | None = None,
    draft_weight_bytes: int = 0,
    draft_block_bytes: int = 0,
    lora_bytes: int = 0,
    data_parallel: int = 1,
) -> int:
    """Blocks that fit: (HBM x utilization x TP - weights - activation reserve) / (block bytes x KV replicas);
    over pipeline stages, the tightest stage's count (sim/pipeline_stages.py).
    A speculative drafter's weights (``draft_weight_bytes``) count with the weights, and its KV of a block's
    tokens (``draft_block_bytes``, over the group) with each block; LoRA adapter slots (``lora_bytes``, over the
    group: sim/lora.py) with the weights too.

    The activation reserve defaults to 5% of the usable HBM (vLLM profiles a dummy forward pass
    instead; its peak for a 13B model at 2k batched tokens is a few percent of an 80 GB card).
    Raises ValueError when the weights alone do not fit.
    """
    if hardware.pipeline_parallel > 1:   # each stage its own weights and its layers' KV (no drafter there)
        from sim.pipeline_stages import pipeline_capacity_blocks

        return pipeline_capacity_blocks(model, hardware, block_size, gpu_memory_utilization, activation_reserve_bytes)
    usable = hardware.hbm_bytes * gpu_memory_utilization * hardware.tensor_parallel
    reserve = activation_reserve(usable, activation_reserve_bytes)
    weights = rank_weight_bytes(model, hardware, data_parallel) + draft_weight_bytes + lora_bytes
    free = usable - weights - reserve - (expert_placement_excess(model, hardware) if data_parallel == 1 else 0)
    if free <= 0:
        what = "model weights" if not draft_weight_bytes else "model and draft weights"
        what += " and LoRA slots" if lora_bytes else ""
        raise ValueError(
            f"{what} ({weights / GiB:.1f} GiB) do not fit in "
            f"{hardware.tensor_parallel} x {hardware.name} at gpu_memory_utilization={gpu_memory_utilization}"
        )
    return math.floor(free / (group_kv_bytes_per_block(model, hardware, block_size) + draft_block_bytes))


def expert_placement_excess(model: ModelSpec, hardware: HardwareSpec) -> int:
    """HBM of a tensor-parallel group that an uneven placement of experts leaves unused (every GPU's cache is
    sized by the one holding the most experts: sim/expert_parallel.py); 0 without expert parallelism."""
    if not hardware.expert_parallel or not model.num_experts or hardware.tensor_parallel == 1:
        return 0
    from sim.expert_parallel import weight_excess_bytes  # (it reads ModelSpec, defined here)

    return weight_excess_bytes(model, hardware.tensor_parallel)


def rank_weight_bytes(model: ModelSpec, hardware: HardwareSpec, data_parallel: int = 1) -> int:
    """Bytes of weights on a tensor-parallel group that is one of ``data_parallel`` ranks (vLLM's
    ``--data-parallel-size``): attention, dense layers, shared experts, embeddings and LM head whole on each
    rank, the routed experts shared by the D x T GPUs: split evenly, 1/D of them a rank, or with
    ``hardware.expert_parallel`` placed whole, each GPU keeping room for the fullest one's ceil(E / (D x T))
    experts (sim/expert_parallel.py). ``model.weight_bytes()`` for one rank, or a dense model."""
    if data_parallel == 1 or not model.num_experts:
        return model.weight_bytes()
    from sim.expert_parallel import expert_bytes  # (it reads ModelSpec, defined here)

    layers, one = model.num_layers - model.dense_layers, expert_bytes(model)
    routed = one * model.num_experts * layers
    tp = hardware.tensor_parallel
    if hardware.expert_parallel:
        share = tp * math.ceil(model.num_experts / (data_parallel * tp)) * one * layers
    else:
        share = routed / data_parallel
    return round(model.weight_bytes() - routed + share)


def activation_reserve(usable: float, activation_reserve_bytes: int | None) -> float:
    """The bytes kept for activations out of ``usable`` HBM: as given, else 5% of it."""
    return 0.05 * usable if activation_reserve_bytes is None else activation_reserve_bytes


def hbm_budget(model: ModelSpec, hardware: HardwareSpec, block_size: int, num_blocks: int,
               gpu_memory_utilization: float = 0.9, activation_reserve_bytes: int | None = None,
               draft_weight_bytes: int = 0, draft_block_bytes: int = 0, lora_bytes: int = 0,
               data_parallel: int = 1) -> dict[str, int]:
    """Where a tensor-parallel group's HBM goes when its cache is sized from it (``kv_capacity_blocks``):
    the weights, the activation reserve, ``num_blocks`` KV blocks, and the rest (what
    ``gpu_memory_utilization`` leaves out and what is too small for a block). Bytes over the group; the
    four parts sum to ``hbm_bytes``. A speculative drafter's weights are in ``weights_bytes`` and its KV in
    ``kv_cache_bytes`` (each also given alone, ``draft_weights_bytes`` and ``draft_kv_cache_bytes``); LoRA
    adapter slots in ``weights_bytes`` (and alone, ``lora_slots_bytes``). ``data_parallel``: one rank's
    (``rank_weight_bytes``)."""
    if hardware.pipeline_parallel > 1:
        from sim.pipeline_stages import pipeline_hbm_budget

        return pipeline_hbm_budget(model, hardware, block_size, num_blocks, gpu_memory_utilization,
                                   activation_reserve_bytes)
    total = hardware.hbm_bytes * hardware.tensor_parallel
    weights = rank_weight_bytes(model, hardware, data_parallel) + draft_weight_bytes + lora_bytes
    reserve = round(activation_reserve(total * gpu_memory_utilization, activation_reserve_bytes))
    kv = num_blocks * (group_kv_bytes_per_block(model, hardware, block_size) + draft_block_bytes)
    out = {"gpus": hardware.tensor_parallel, "hbm_bytes": total, "weights_bytes": weights,
           "activation_reserve_bytes": reserve, "kv_cache_bytes": kv, "unused_bytes": total - weights - reserve - kv}
    if draft_weight_bytes or draft_block_bytes:
        out["draft_weights_bytes"] = draft_weight_bytes
        out["draft_kv_cache_bytes"] = num_blocks * draft_block_bytes
    if lora_bytes:
        out["lora_slots_bytes"] = lora_bytes
    return out


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, max_len: int,
           head_dim: int | None = None, **kw) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                     head_dim=head_dim or hidden // heads, intermediate_size=inter, vocab_size=vocab,
                     max_model_len=max_len, **kw)


# Model presets: numbers from each model's config.json on the Hugging Face Hub
# (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, intermediate_size,
# vocab_size, max_position_embeddings).
MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-2-7b-hf config.json
    "llama-2-7b": _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    # meta-llama/Llama-2-13b-hf config.json
    "llama-2-13b": _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    # meta-llama/Llama-2-70b-hf config.json (GQA, 8 KV heads)
    "llama-2-70b": _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    # meta-llama/Meta-Llama-3-70B config.json
    "llama-3-70b": _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    # meta-llama/Llama-3.1-8B config.json (128k context via rope scaling)
    "llama-3.1-8b": _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    # meta-llama/Llama-3.1-70B config.json
    "llama-3.1-70b": _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    # meta-llama/Llama-3.1-405B(-Instruct) config.json: 126 layers, hidden 16384, 128 heads, 8 KV heads
    "llama-3.1-405b": _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
    # mistralai/Mistral-7B-Instruct-v0.2 config.json (full attention)
    "mistral-7b": _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
    # mistralai/Mistral-7B-v0.1 config.json: the same shapes, every layer attending a 4,096-token sliding window
    "mistral-7b-v0.1": _llama("mistral-7b-v0.1", 32, 4096, 32, 8, 14336, 32000, 32768, sliding_window=4096),
    # facebook/opt-13b config.json: ffn_dim 20480, ReLU MLP, 2048 positions, tied embeddings
    "opt-13b": _llama("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, gated_mlp=False, tied_embeddings=True),
    # codellama/CodeLlama-34b-Instruct-hf config.json
    "codellama-34b": _llama("codellama-34b", 48, 8192, 64, 8, 22016, 32000, 16384),
    # Qwen/Qwen-72B config.json: 80 layers, hidden 8192, 64 heads (no GQA), intermediate_size 49152
    # counts gate+up together, so each projection is 24576 wide; vocab 152064; seq_length 32768
    "qwen-72b": _llama("qwen-72b", 80, 8192, 64, 64, 24576, 152064, 32768),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts of 14336, 2 a token (num_local_experts,
    # num_experts_per_tok), 32k context
    "mixtral-8x7b": _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, num_experts=8, experts_per_token=2),
    # meta-llama/Llama-3.3-70B-Instruct: the Llama-3.1-70B shapes
    "llama-3.3-70b": _llama("llama-3.3-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    # deepseek-ai/DeepSeek-R1-Distill-Llama-8B and -70B config.json: Llama-3.1-8B's and Llama-3.3-70B's shapes
    "deepseek-r1-distill-llama-8b": _llama("deepseek-r1-distill-llama-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    "deepseek-r1-distill-llama-70b": _llama("deepseek-r1-distill-llama-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    # meta-llama/Llama-3.2-1B(-Instruct) and -3B config.json: tied embeddings
    "llama-3.2-1b": _llama("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, tied_embeddings=True),
    "llama-3.2-3b": _llama("llama-3.2-3b", 28, 3072, 24, 8, 8192, 128256, 131072, tied_embeddings=True),
    # codellama/CodeLlama-7b-Instruct-hf and -13b config.json (Llama-2 shapes, 32,016 tokens, 16k context)
    "codellama-7b": _llama("codellama-7b", 32, 4096, 32, 32, 11008, 32016, 16384),
    "codellama-13b": _llama("codellama-13b", 40, 5120, 40, 40, 13824, 32016, 16384),
    # Qwen/Qwen2.5-*-Instruct config.json (max_position_embeddings 32768; the QKV biases are not priced);
    # the 1.5B and 3B tie their embeddings
    "qwen2.5-1.5b": _llama("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, 32768, tied_embeddings=True),
    "qwen2.5-3b": _llama("qwen2.5-3b", 36, 2048, 16, 2, 11008, 151936, 32768, tied_embeddings=True),
    "qwen2.5-7b": _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
    "qwen2.5-14b": _llama("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, 32768),
    "qwen2.5-32b": _llama("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, 32768),
    "qwen2.5-72b": _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 32768),
    # Qwen/Qwen2.5-Coder-*-Instruct config.json: the Qwen2.5 models' shapes, vocabularies and context
    "qwen2.5-coder-1.5b": _llama("qwen2.5-coder-1.5b", 28, 1536, 12, 2, 8960, 151936, 32768, tied_embeddings=True),
    "qwen2.5-coder-3b": _llama("qwen2.5-coder-3b", 36, 2048, 16, 2, 11008, 151936, 32768, tied_embeddings=True),
    "qwen2.5-coder-7b": _llama("qwen2.5-coder-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
    "qwen2.5-coder-14b": _llama("qwen2.5-coder-14b", 48, 5120, 40, 8, 13824, 152064, 32768),
    "qwen2.5-coder-32b": _llama("qwen2.5-coder-32b", 64, 5120, 40, 8, 27648, 152064, 32768),
    # mistralai/Mistral-Small-24B-Instruct-2501 config.json: head_dim 128 (not 5120 / 32)
    "mistral-small-24b": _llama("mistral-small-24b", 40, 5120, 32, 8, 32768, 131072, 32768, head_dim=128),
    # microsoft/phi-4 config.json (Phi3ForCausalLM: a fused, gated gate/up projection)
    "phi-4": _llama("phi-4", 40, 5120, 40, 10, 17920, 100352, 16384),
    # ibm-granite/granite-3.1-8b-instruct config.json (its embedding, attention and residual multipliers
    # change no shape); tied embeddings
    "granite-3.1-8b": _llama("granite-3.1-8b", 40, 4096, 32, 8, 12800, 49155, 131072, tied_embeddings=True),
    # ibm-granite/granite-3.0-8b-instruct (4,096 positions), granite-3.3-8b-instruct (49,159 tokens) and the
    # 2B models of 3.1 and 3.3 config.json: the same layer shapes, tied embeddings
    "granite-3.0-8b": _llama("granite-3.0-8b", 40, 4096, 32, 8, 12800, 49155, 4096, tied_embeddings=True),
    "granite-3.3-8b": _llama("granite-3.3-8b", 40, 4096, 32, 8, 12800, 49159, 131072, tied_embeddings=True),
    "granite-3.1-2b": _llama("granite-3.1-2b", 40, 2048, 32, 8, 8192, 49155, 131072, tied_embeddings=True),
    "granite-3.3-2b": _llama("granite-3.3-2b", 40, 2048, 32, 8, 8192, 49159, 131072, tied_embeddings=True),
    # Qwen/Qwen3-*B config.json (head_dim 128 everywhere, so the 4B's and 32B's query width is not the hidden
    # size; max_position_embeddings 40960; the per-head QK norms are not priced); the 4B ties its embeddings
    "qwen3-4b": _llama("qwen3-4b", 36, 2560, 32, 8, 9728, 151936, 40960, head_dim=128, tied_embeddings=True),
    "qwen3-8b": _llama("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960, head_dim=128),
    "qwen3-14b": _llama("qwen3-14b", 40, 5120, 40, 8, 17408, 151936, 40960, head_dim=128),
    "qwen3-32b": _llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960, head_dim=128),
    # Qwen/Qwen3-30B-A3B config.json: 128 experts of moe_intermediate_size 768, 8 a token
    "qwen3-30b-a3b": _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 768, 151936, 40960, head_dim=128, num_experts=128,
                            experts_per_token=8),
    # Qwen/Qwen1.5-MoE-A2.7B and Qwen/Qwen2-57B-A14B config.json: experts of moe_intermediate_size on every
    # layer (decoder_sparse_step 1, no mlp_only_layers) beside a shared expert of
    # shared_expert_intermediate_size (its sigmoid gate, a hidden-to-1 projection, and the QKV biases are
    # not priced); "14.3B parameters in total and 2.7B activated" and "57B, 14B activated" (the model cards)
    "qwen1.5-moe-a2.7b": _llama("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 1408, 151936, 8192, num_experts=60,
                                experts_per_token=4, shared_expert_size=5632),
    # deepseek-ai/DeepSeek-V2-Lite and DeepSeek-V3 config.json: multi-head latent attention (kv_lora_rank 512,
    # qk_rope_head_dim 64, qk_nope_head_dim 128 -> head_dim 192, v_head_dim 128; V3's queries through a
    # q_lora_rank of 1536, V2-Lite's straight from the hidden state), experts of moe_intermediate_size beside
    # n_shared_experts of the same width, the first first_k_dense_replace layers dense (intermediate_size);
    # "15.7B" and "671B" parameters (the model cards; V3's multi-token-prediction layer, loaded only to draft,
    # left out). V3 ships fp8 weights (block-quantized, dynamic activations) and serves a 16-bit KV cache;
    # DeepSeek-R1 has V3's shapes
    "deepseek-v2-lite": _llama("deepseek-v2-lite", 27, 2048, 16, 16, 1408, 102400, 163840, head_dim=192,
                               num_experts=64, experts_per_token=6, shared_expert_size=2 * 1408, dense_layers=1,
                               dense_intermediate_size=10944, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    **{name: _llama(name, 61, 7168, 128, 128, 2048, 129280, 163840, head_dim=192, num_experts=256,
                    experts_per_token=8, shared_expert_size=2048, dense_layers=3, dense_intermediate_size=18432,
                    kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536, dtype="fp8",
                    kv_dtype="fp16")
       for name in ("deepseek-v3", "deepseek-r1")},
    "qwen2-57b-a14b": _llama("qwen2-57b-a14b", 28, 3584, 28, 4, 2560, 151936, 131072, num_experts=64,
                             experts_per_token=8, shared_expert_size=20480),
    # deepseek-ai/DeepSeek-V3.1 config.json: DeepSeek-V3's shapes (a later release of the same model)
    "deepseek-v3.1": _llama("deepseek-v3.1", 61, 7168, 128, 128, 2048, 129280, 163840, head_dim=192,
                            num_experts=256, experts_per_token=8, shared_expert_size=2048, dense_layers=3,
                            dense_intermediate_size=18432, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128,
                            q_lora_rank=1536, dtype="fp8", kv_dtype="fp16"),
    # moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's architecture with 64 query heads, 384 experts of
    # 2,048 (8 a token) beside one shared expert, the first layer dense (18,432), a vocabulary of 163,840,
    # block-fp8 weights as it ships them; "1T total parameters, 32B activated" (the model card)
    "kimi-k2": _llama("kimi-k2", 61, 7168, 64, 64, 2048, 163840, 131072, head_dim=192, num_experts=384,
                      experts_per_token=8, shared_expert_size=2048, dense_layers=1, dense_intermediate_size=18432,
                      kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536, dtype="fp8",
                      kv_dtype="fp16"),
    # Qwen/Qwen3-235B-A22B config.json: 128 experts of moe_intermediate_size 1,536 (8 a token) on every layer,
    # 64 query heads of 128 over 4 KV heads; "235B total, 22B activated" (the model card)
    "qwen3-235b-a22b": _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 1536, 151936, 40960, head_dim=128,
                              num_experts=128, experts_per_token=8),
    # zai-org/GLM-4.5 and GLM-4.5-Air config.json: 160 or 128 experts (8 a token) beside one shared expert of
    # the same width, the first 3 or 1 layers dense, 96 query heads of 128 over 8 KV heads (rotary on half of
    # each head, partial_rotary_factor 0.5, and the QKV biases are not priced); their multi-token-prediction
    # layer (num_nextn_predict_layers), loaded only to draft, is left out: "355B total / 32B active" and "106B /
    # 12B" (the model cards)
    "glm-4.5": _llama("glm-4.5", 92, 5120, 96, 8, 1536, 151552, 131072, head_dim=128, num_experts=160,
                      experts_per_token=8, shared_expert_size=1536, dense_layers=3, dense_intermediate_size=12288),
    "glm-4.5-air": _llama("glm-4.5-air", 46, 4096, 96, 8, 1408, 151552, 131072, head_dim=128, num_experts=128,
                          experts_per_token=8, shared_expert_size=1408, dense_layers=1, dense_intermediate_size=10944),
    # mistralai/Mixtral-8x22B-v0.1 config.json: 8 experts of 16,384, 2 a token; "141B parameters, 39B active"
    "mixtral-8x22b": _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, num_experts=8,
                            experts_per_token=2),
    # google/gemma-2-9b and -27b config.json: a gated GELU MLP, tied embeddings, every other layer (the even
    # ones) attending a 4,096-token sliding window, 8,192 positions (the soft-capped logits change no shape)
    "gemma-2-9b": _llama("gemma-2-9b", 42, 3584, 16, 8, 14336, 256000, 8192, head_dim=256, tied_embeddings=True,
                         sliding_window=4096, sliding_layers=21),
    "gemma-2-27b": _llama("gemma-2-27b", 46, 4608, 32, 16, 36864, 256000, 8192, head_dim=128, tied_embeddings=True,
                          sliding_window=4096, sliding_layers=23),
    # google/gemma-3-4b-it, -12b-it and -27b-it config.json (text_config; the vision tower is not priced):
    # five of every six layers attend a 1,024-token sliding window (sliding_window_pattern 6), tied embeddings
    "gemma-3-4b": _llama("gemma-3-4b", 34, 2560, 8, 4, 10240, 262208, 131072, head_dim=256, tied_embeddings=True,
                         sliding_window=1024, sliding_layers=29),
    "gemma-3-12b": _llama("gemma-3-12b", 48, 3840, 16, 8, 15360, 262208, 131072, head_dim=256, tied_embeddings=True,
                          sliding_window=1024, sliding_layers=40),
    "gemma-3-27b": _llama("gemma-3-27b", 62, 5376, 32, 16, 21504, 262208, 131072, head_dim=128, tied_embeddings=True,
                          sliding_window=1024, sliding_layers=52),
    # openai/gpt-oss-20b and -120b config.json: 32 or 128 experts of 2,880, 4 a token, every other layer (the
    # even ones) attending a 128-token sliding window, 64 query heads of 64 over 8 KV heads, untied
    # embeddings; the experts in MXFP4 (one e8m0 exponent a 32 elements), the rest in bf16, as the checkpoints
    # ship and vLLM serves them (its attention sinks, biases and clamped SwiGLU change no shape); "21B
    # parameters with 3.6B active" and "117B, 5.1B active" (the model card)
    **{name: _llama(name, layers, 2880, 64, 8, 2880, 201088, 131072, head_dim=64, num_experts=experts,
                    experts_per_token=4, sliding_window=128, sliding_layers=layers // 2, dtype="bf16",
                    weight_dtype="mxfp4", weight_group_size=32, weight_scope="experts")
       for name, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128))},
    # meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E config.json (text_config; the vision tower is not
    # priced): 16 or 128 experts of 8,192, one a token, beside a shared expert of 8,192 on every expert layer
    # (Maverick's every other layer, interleave_moe_layer_step 2; the others dense, intermediate_size_mlp
    # 16,384); three of every four layers (the RoPE ones) attend within chunks of 8,192 tokens, the fourth the
    # whole context; "109B" / "400B" parameters, "17B active" (the model card, the vision tower included)
    "llama-4-scout-17b-16e": _llama("llama-4-scout-17b-16e", 48, 5120, 40, 8, 8192, 202048, 10485760, head_dim=128,
                                    num_experts=16, experts_per_token=1, shared_expert_size=8192,
                                    attention_chunk_size=8192, chunked_layers=36),
    "llama-4-maverick-17b-128e": _llama("llama-4-maverick-17b-128e", 48, 5120, 40, 8, 8192, 202048, 1048576,
                                        head_dim=128, num_experts=128, experts_per_token=1, shared_expert_size=8192,
                                        dense_layers=24, dense_intermediate_size=16384, attention_chunk_size=8192,
                                        chunked_layers=36),
    # A toy shape for running the real backend on a CPU: 2 layers, hidden 256, 4 heads, 2 KV heads
    "tiny-llama": _llama("tiny-llama", 2, 256, 4, 2, 512, 1024, 4096),
    # A toy of Gemma's layout for tests and fuzzing: 4 layers, the first three attending a 64-token sliding window
    "tiny-gemma": _llama("tiny-gemma", 4, 256, 4, 2, 512, 1024, 4096, head_dim=64, tied_embeddings=True,
                         sliding_window=64, sliding_layers=3),
    # A toy of DeepSeek's layout for tests and fuzzing: 4 layers, the first dense; latent attention (a latent of
    # 64 + a rotary key of 16, heads of 48 = 32 + 16, values of 32, queries through a rank of 96); 8 experts
    # of 128, 2 a token, beside a shared expert of 128
    "tiny-deepseek": _llama("tiny-deepseek", 4, 256, 4, 4, 128, 1024, 4096, head_dim=48, num_experts=8,
                            experts_per_token=2, shared_expert_size=128, dense_layers=1, dense_intermediate_size=512,
                            kv_lora_rank=64, qk_rope_head_dim=16, v_head_dim=32, q_lora_rank=96),
}

# Hardware presets: vendor datasheets. Dense (no sparsity) fp16/bf16 and fp8 tensor FLOP/s; one direction of
# the host link (PCIe x16); NVLink per-GPU bandwidth per direction.
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    # NVIDIA A100 datasheet (SXM 40GB): 1,555 GB/s HBM2, 312 TFLOPS fp16, PCIe Gen4 32 GB/s, NVLink 600 GB/s
    "a100-40gb": HardwareSpec(name="a100-40gb", hbm_bytes=40 * GiB, hbm_bandwidth=1555e9, peak_flops=312e12,
                              host_link_bandwidth=32e9, interconnect_bandwidth=300e9),
    # NVIDIA A100 datasheet (SXM 80GB): 2,039 GB/s HBM2e
    "a100-80gb": HardwareSpec(name="a100-80gb", hbm_bytes=80 * GiB, hbm_bandwidth=2039e9, peak_flops=312e12,
                              host_link_bandwidth=32e9, interconnect_bandwidth=300e9),
    # NVIDIA H100 datasheet (SXM): 3.35 TB/s HBM3, 989 TFLOPS bf16 and 1,979 fp8 dense, PCIe Gen5 64 GB/s,
    # NVLink 900 GB/s
    "h100-80gb": HardwareSpec(name="h100-80gb", hbm_bytes=80 * GiB, hbm_bandwidth=3.35e12, peak_flops=989e12,
                              peak_flops_fp8=1979e12, host_link_bandwidth=64e9, interconnect_bandwidth=450e9),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, same compute as H100 SXM
    "h200-141gb": HardwareSpec(name="h200-141gb", hbm_bytes=141 * 10**9, hbm_bandwidth=4.8e12,
                               peak_flops=989e12, peak_flops_fp8=1979e12, host_link_bandwidth=64e9,
                               interconnect_bandwidth=450e9),
    # NVIDIA L40S datasheet: 48 GB GDDR6 at 864 GB/s, 362 TFLOPS fp16 and 733 fp8 dense, PCIe Gen4, no NVLink
    "l40s": HardwareSpec(name="l40s", hbm_bytes=48 * 10**9, hbm_bandwidth=864e9, peak_flops=362e12,
                         peak_flops_fp8=733e12, host_link_bandwidth=32e9, interconnect_bandwidth=0.0),
    # A generic host CPU, for running the real backend's reference path; calibrate before trusting it
    "cpu": HardwareSpec(name="cpu", hbm_bytes=16 * GiB, hbm_bandwidth=20e9, peak_flops=2e11,
                        host_link_bandwidth=20e9, interconnect_bandwidth=0.0),
}
