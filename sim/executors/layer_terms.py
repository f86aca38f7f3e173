"""One layer of a model on one GPU of its tensor-parallel group, as the cost model prices it: its GEMMs'
shapes and its attention's constants.

Invariants: shapes are (operator, K, N) under Vidur's operator names, so the learned GEMM correction applies
to each; the attention's constants of a prefill and of a decode are the same numbers for every model but
those with multi-head latent attention (``ModelSpec.kv_lora_rank``), whose prefill attends keys and values
up-projected from the latent and whose decode attends the latent itself (vLLM's MLA backends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.specs import ModelSpec


def linear_shapes(model: ModelSpec, tp: int) -> list[tuple[str, int, int]]:
    """(operator, K inputs, N outputs) of one layer's GEMMs on one TP shard: the attention's
    (``attention_shapes``), then the MLP's; a mixture of experts' up and down are one expert's."""
    return [*attention_shapes(model, tp), *mlp_shapes(model, model.intermediate_size, tp)]


def attention_shapes(model: ModelSpec, tp: int) -> list[tuple[str, int, int]]:
    """(operator, K, N) of one layer's attention projections on one TP shard (``ModelSpec.attention_matrices``:
    fused QKV and output; under latent attention the query's and latent's down projections, unsharded, the
    query's up projection, the latent's up projection and the output); the last is the output projection.
    The latent's up projection runs on every token: on a prefill's as kv_b_proj, on a decode's as the two
    per-head products it is absorbed into (the query's key part into the latent, the attention's output back
    to the heads' values), the same FLOPs and weights."""
    matrices = model.attention_matrices(tp)
    return [("attn_post_proj" if i == len(matrices) - 1 else "attn_pre_proj", k, n)
            for i, (k, n, _) in enumerate(matrices)]


def mlp_shapes(model: ModelSpec, width: int, tp: int) -> list[tuple[str, int, int]]:
    """(operator, K, N) of a dense MLP of ``width`` on one TP shard: gate and up (or up), down."""
    inter = width // tp
    return [("mlp_up_proj", model.hidden_size, inter * (2 if model.gated_mlp else 1)),
            ("mlp_down_proj", inter, model.hidden_size)]


@dataclass(frozen=True, slots=True)
class AttentionTerms:
    """One layer's attention on one GPU: FLOPs a (query, key) pair and bytes a new and a cached token, a
    prefill's and a decode's; ``up_flops``: FLOPs a cached token of a prefill's context costs besides its
    bytes; the widths of the elementwise kernels around it (the rotary embedding's, the KV-cache write's,
    latent attention's bottleneck norms')."""

    flops_per_pair: float
    new_bytes: int
    kv_bytes: int
    up_flops: float
    dec_flops_per_pair: float
    dec_new_bytes: int
    dec_kv_bytes: int
    rope_width: int
    kv_write_width: int
    bottleneck_width: int


def attention_terms(model: ModelSpec, tp: int) -> AttentionTerms:
    """The attention constants of ``model`` on one of ``tp`` GPUs, b the dtype's bytes, kvb the cache's:

        multi-head:  4 hd x heads FLOPs a pair; a new token's Q and O (b) and K and V (kvb); a cached
                     token's K and V (kvb); a decode's the same
        latent:      a prefill attends keys of hd and values of dv a head: 2 heads (hd + dv) FLOPs a pair;
                     a new token's Q, K, V and O (b) and its latent stored (kvb); a cached token's latent
                     read (kvb), up-projected (2 x rank FLOPs an element of its heads' non-rotary keys and
                     values), its K and V written and read back (b). A decode attends every head's query
                     (lat wide) against one latent a token, its output rank wide: 2 heads (lat + rank) FLOPs
                     a pair, a cached token's latent (kvb), the query and output (b) and the latent stored
    """
    b, kvb = model.dtype_bytes, model.kv_dtype_bytes
    heads = math.ceil(model.num_heads / tp)
    if not model.latent_attention:
        q = heads * model.head_dim
        kv = math.ceil(model.num_kv_heads / tp) * model.head_dim
        flops = 4.0 * model.head_dim * heads
        new, cached = b * 2 * q + kvb * 2 * kv, kvb * 2 * kv
        return AttentionTerms(flops, new, cached, 0.0, flops, new, cached, q + kv, 2 * kv, 0)
    hd, dv, rank, lat, rope = model.head_dim, model.v_head_dim, model.kv_lora_rank, model.latent_size, \
        model.qk_rope_head_dim
    return AttentionTerms(
        flops_per_pair=2.0 * heads * (hd + dv), new_bytes=b * 2 * heads * (hd + dv) + kvb * lat,
        kv_bytes=2 * b * heads * (hd + dv) + kvb * lat, up_flops=2.0 * rank * heads * (hd - rope + dv),
        dec_flops_per_pair=2.0 * heads * (lat + rank), dec_new_bytes=b * heads * (lat + rank) + kvb * lat,
        dec_kv_bytes=kvb * lat, rope_width=heads * rope + rope, kv_write_width=lat,
        bottleneck_width=model.q_lora_rank + rank)
