"""A decoder stack of a ModelSpec's shape with random (seeded) weights, over the paged KV cache.

Per layer: RMSNorm -> fused QKV -> rotary embedding -> store K/V -> paged attention -> output
projection (+ residual) -> RMSNorm -> SwiGLU (fused gate/up, down) or a two-matrix ReLU MLP
(+ residual). After the layers: final RMSNorm and the LM head over each sequence's last token.
Weights are scaled by 1/sqrt(fan_in) so activations stay O(1) in fp16. Only ``num_layers`` layers
are built (the runner scales their time to the model's depth). The token order of a batch is::

    [ prefill/extend tokens of seq 0 | seq 1 | ... | one decode token per decode seq ... ]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend import reference
from backend.shapes import ModelShape


@dataclass(slots=True)
class AttnBatch:
    """Attention metadata of one step (all tensors on the model's device)."""

    slot_mapping: torch.Tensor           # [N] int64: cache slot of every new token
    num_prefill_tokens: int              # the first rows of the batch are prefill/extend tokens
    prefill_cu_seqlens: torch.Tensor | None   # [P + 1] int32
    prefill_context_lens: torch.Tensor | None  # [P] int32: cached tokens before this step
    prefill_block_tables: torch.Tensor | None  # [P, W] int32
    prefill_max_new: int
    decode_context_lens: torch.Tensor | None   # [Dn] int32: context including the new token
    decode_block_tables: torch.Tensor | None   # [Dn, W] int32
    last_token_index: torch.Tensor       # [num_seqs] int64: rows whose logits are computed


Lap = Callable[[str], None]  # called after each operator with its name


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves (GPT-NeoX / Llama layout): x [N, heads, D], cos/sin [N, 1, D/2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class DecoderModel:
    """Random-weight decoder: ``forward(tokens, positions, batch, kv, lap)`` returns last-token logits."""

    def __init__(self, shape: ModelShape, num_layers: int, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> None:
        self.shape = shape
        self.device = device
        self.dtype = dtype
        self.num_layers = num_layers
        self.scale = shape.head_dim ** -0.5
        gen = torch.Generator(device=device).manual_seed(seed)
        h, q, kv, inter = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size

        def w(out: int, inp: int) -> torch.Tensor:
            t = torch.randn(out, inp, generator=gen, device=device, dtype=torch.float32)
            return (t * inp ** -0.5).to(dtype)

        self.embed = w(shape.vocab_size, h) * (h ** 0.5)
        self.lm_head = w(shape.vocab_size, h)
        self.final_norm = torch.ones(h, device=device, dtype=dtype)
        up = 2 * inter if shape.gated_mlp else inter
        self.layers = [
            {"qkv": w(q + 2 * kv, h), "o": w(h, q), "up": w(up, h), "down": w(h, inter),
             "norm1": torch.ones(h, device=device, dtype=dtype), "norm2": torch.ones(h, device=device, dtype=dtype)}
            for _ in range(num_layers)
        ]
        half = shape.head_dim // 2
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=device, dtype=torch.float32) / half))
        if device.type == "cuda":
            import backend.kernels as ops
        else:
            ops = reference
        self.ops = ops

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, b: AttnBatch) -> torch.Tensor:
        ops = self.ops
        ops.store_kv(k, v, k_cache, v_cache, b.slot_mapping)
        n_pre = b.num_prefill_tokens
        parts = []
        if n_pre:
            parts.append(ops.paged_prefill_attention(
                q[:n_pre], k_cache, v_cache, b.prefill_block_tables, b.prefill_cu_seqlens,
                b.prefill_context_lens, self.scale, **({"max_new_tokens": b.prefill_max_new}
                                                       if ops is not reference else {})))
        if n_pre < q.shape[0]:
            parts.append(ops.paged_decode_attention(q[n_pre:], k_cache, v_cache, b.decode_block_tables,
                                                    b.decode_context_lens, self.scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, batch: AttnBatch,
                k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], lap: Lap) -> torch.Tensor:
        s = self.shape
        n = tokens.shape[0]
        x = self.embed[tokens]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        lap("embed")
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer["norm1"])
            lap("norm")
            qkv = F.linear(h, layer["qkv"])
            lap("attn_pre_proj")
            q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
            q = _rope(q.reshape(n, s.num_heads, s.head_dim), cos, sin)
            k = _rope(k.reshape(n, s.num_kv_heads, s.head_dim), cos, sin)
            v = v.reshape(n, s.num_kv_heads, s.head_dim)
            lap("rope")
            attn = self._attention(q, k, v, k_caches[i], v_caches[i], batch)
            lap("attention")
            x = x + F.linear(attn.reshape(n, s.q_size), layer["o"])
            lap("attn_post_proj")
            h = _rms_norm(x, layer["norm2"])
            lap("norm")
            up = F.linear(h, layer["up"])
            lap("mlp_up_proj")
            if s.gated_mlp:
                gate, u = up.chunk(2, dim=-1)
                act = F.silu(gate) * u
            else:
                act = F.relu(up)
            lap("mlp_act")
            x = x + F.linear(act, layer["down"])
            lap("mlp_down_proj")
        logits = F.linear(_rms_norm(x[batch.last_token_index], self.final_norm), self.lm_head)
        lap("lm_head")
        return logits
