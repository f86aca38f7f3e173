"""A model's shape from its Hugging Face ``config.json``, for models kvsim has no preset for.

    model: models/Qwen2.5-7B-Instruct/config.json      # in a scenario (relative to the scenario file)
    kvsim fidelity RUNS.csv --model Qwen/Qwen2.5-7B-Instruct=path/config.json

The keys read (the transformers names; the first present wins):

    layers             num_hidden_layers, n_layer, num_layers
    hidden size        hidden_size, n_embd, d_model
    attention heads    num_attention_heads, n_head
    KV heads           num_key_value_heads, num_kv_heads, multi_query_group_num (else = attention heads)
    head dim           head_dim (else hidden size / heads)
    latent attention   kv_lora_rank, q_lora_rank (null: none), qk_nope_head_dim, qk_rope_head_dim, v_head_dim
                       (DeepSeek-V2/V3: the head dim is qk_nope_head_dim + qk_rope_head_dim)
    MLP width          intermediate_size, ffn_dim, n_inner (else 4 x hidden size)
    vocabulary         vocab_size (padded_vocab_size)
    context            max_position_embeddings, n_positions, seq_length, max_seq_len
    tied embeddings    tie_word_embeddings (default false)
    experts            num_local_experts, num_experts or n_routed_experts, with num_experts_per_tok
    shared experts     shared_expert_intermediate_size (Qwen-MoE), or n_shared_experts x the experts' width
                       (DeepSeek)
    dense layers       first_k_dense_replace and moe_layer_freq (DeepSeek), mlp_only_layers and
                       decoder_sparse_step (Qwen-MoE): those layers' MLP is dense, of intermediate_size;
                       Llama 4's moe_layers or interleave_moe_layer_step, its dense layers of
                       intermediate_size_mlp and a shared expert on each expert layer
    chunked attention  attention_chunk_size (Llama 4), on the layers layer_types or no_rope_layers name
    sliding window     sliding_window (null, or use_sliding_window false: none), on the layers layer_types
                       names sliding_attention, else as the model type places them (``_sliding_window``)
    quantization       quantization_config (AWQ, GPTQ, Marlin, fp8, compressed-tensors: sim/hf_quantization.py)

The MLP is gated (SwiGLU: gate, up, down) unless the config names a plain one: OPT's ``ffn_dim``, GPT-2's
``n_inner``, or a model type with a two-matrix MLP (``PLAIN_MLP_TYPES``: OPT, GPT-2, GPT-NeoX, Falcon,
Phi-1/2, StarCoder2, ...). The dtype is kvsim's default (fp16) unless the config is quantized; a
scenario may set ``model.dtype``. Mixture-of-experts configs whose experts differ in width from ``intermediate_size``
(``moe_intermediate_size``) use that width for the experts, and ``intermediate_size`` for their dense layers.

Invariant: a config missing a required key, or with a value that is not a positive integer, is an error that
names the key; so is one of an architecture kvsim cannot price (``UNSUPPORTED_KEYS``: DeepSeek's sparse
attention, state-space layers; layer types other than full, sliding-window and chunked attention), and one of a
quantization it does not model (bitsandbytes, NVFP4, ...);
nothing is guessed beyond the defaults listed above.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.errors import KvsimError
from sim.hf_quantization import quantization_fields
from sim.specs import ModelSpec
from sim.yamlfile import read_text_bounded

# config keys of architectures kvsim's ModelSpec cannot price: loading one is an error rather than a model
# priced as something it is not
UNSUPPORTED_KEYS = {
    "index_topk": "DeepSeek's sparse attention (V3.2: each query attends the top-k tokens an indexer picks)",
    "ssm_state_size": "state-space (Mamba) layers",
    "mamba_d_state": "state-space (Mamba) layers",
    "layers_block_type": "hybrid attention and state-space layers",
    "full_attention_interval": "linear-attention (Gated DeltaNet) layers between full-attention ones (Qwen3-Next)",
    "linear_num_value_heads": "linear-attention (Gated DeltaNet) layers between full-attention ones (Qwen3-Next)",
}
# ``layer_types`` entries kvsim reads (chunked_attention: Llama 4's, with attention_chunk_size)
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention"}

# model types whose MLP is two matrices (up, down) with a plain activation
PLAIN_MLP_TYPES = {"opt", "gpt2", "gpt_neox", "gptj", "falcon", "bloom", "phi", "starcoder2", "gpt_bigcode",
                   "mpt", "codegen"}
MAX_CONFIG_BYTES = 1 << 20


def _first(cfg: dict[str, Any], keys: tuple[str, ...], what: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{k}: {what} must be a positive integer, got {v!r}")
            return v
    if default is None:
        raise ValueError(f"no {what} ({' or '.join(keys)})")
    return default


def spec_from_hf_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec of a parsed config.json (ValueError naming the key on a missing or bad value)."""
    if not isinstance(cfg, dict):
        raise ValueError("expected a JSON object of config keys")
    quantized = quantization_fields(cfg)   # (at the top level, also of a multimodal wrapper)
    if isinstance(cfg.get("text_config"), dict):   # a multimodal wrapper: the language model's part
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k == "tie_word_embeddings"}}
    for key, what in UNSUPPORTED_KEYS.items():
        if cfg.get(key):
            raise ValueError(f"{key}: {what} is not modelled by kvsim (a dense transformer, or a mixture of experts "
                             "with full or latent attention, is)")
    layers = _first(cfg, ("num_hidden_layers", "n_layer", "num_layers"), "layer count")
    window = _sliding_window(cfg, layers) or _chunked_attention(cfg, layers)
    hidden = _first(cfg, ("hidden_size", "n_embd", "d_model"), "hidden size")
    heads = _first(cfg, ("num_attention_heads", "n_head"), "attention head count")
    kv = _first(cfg, ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), "KV head count", heads)
    head_dim = _first(cfg, ("head_dim",), "head dim", hidden // heads)
    latent = _latent_attention(cfg) if cfg.get("kv_lora_rank") else {}
    if latent:   # a query's and key's head: its rotary and its other part
        head_dim = latent.pop("head_dim")
    expert_keys = ("num_local_experts", "num_experts", "n_routed_experts")
    moe = any(cfg.get(k) for k in expert_keys)   # (dense configs may say 0)
    experts = _first(cfg, expert_keys, "expert count") if moe else 0
    per_token = _first(cfg, ("num_experts_per_tok",), "experts per token", 0) if experts else 0
    width_keys = ("moe_intermediate_size", "intermediate_size") if experts else ("intermediate_size",)
    inter = _first(cfg, (*width_keys, "ffn_dim", "n_inner"), "MLP width", 4 * hidden)
    vocab = _first(cfg, ("vocab_size", "padded_vocab_size"), "vocabulary size")
    max_len = _first(cfg, ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len"), "context length")
    plain = str(cfg.get("model_type", "")).lower() in PLAIN_MLP_TYPES or "ffn_dim" in cfg or "n_inner" in cfg
    mixture = _mixture_layout(cfg, layers, inter) if experts else {}
    stray = next((k for k in ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace")
                  if not experts and cfg.get(k)), None)
    if stray:
        raise ValueError(f"{stray}: shared experts and dense layers describe a mixture of experts, and this config "
                         "has no experts (num_experts)")
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ValueError(f"tie_word_embeddings: expected true or false, got {tied!r}")
    try:
        return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                         head_dim=head_dim, intermediate_size=inter, vocab_size=vocab, max_model_len=max_len,
                         gated_mlp=not plain, tied_embeddings=tied, num_experts=experts,
                         experts_per_token=per_token, **mixture, **latent, **window, **quantized)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{loc + ': ' if loc else ''}{first['msg'].removeprefix('Value error, ')}") from None


def _sliding_window(cfg: dict[str, Any], layers: int) -> dict[str, int]:
    """Sliding-window attention's ModelSpec fields (none where every layer attends the whole context): the
    window (``sliding_window``) and how many layers use it. ``layer_types`` counts them where present; else
    Gemma 2 slides on every other layer (the even ones), Gemma 3 and Cohere 2 on all but every
    ``sliding_window_pattern``-th (6, 4 by default), Qwen2's on the layers from ``max_window_layers`` on,
    and every other model (Mistral-7B-v0.1, Phi-3) on all of them. A window that is switched off
    (``use_sliding_window: false``) or covers the whole context is none. ValueError naming the key on a layer
    type kvsim does not model, or sliding layers without a window."""
    types = cfg.get("layer_types")
    if isinstance(types, list):
        other = sorted({str(t) for t in types} - ATTENTION_LAYER_TYPES)
        if other:
            raise ValueError(f"layer_types: {', '.join(other)} layers are not modelled by kvsim (a transformer of "
                             "full-attention, sliding-window and chunked layers is)")
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or window is None:
        if isinstance(types, list) and "sliding_attention" in types and cfg.get("use_sliding_window") is not False:
            raise ValueError("sliding_window: layer_types names sliding_attention layers, but the config gives no "
                             "window")
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"sliding_window: the window must be a positive integer (or null), got {window!r}")
    max_len = next((cfg[k] for k in ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len")
                    if isinstance(cfg.get(k), int)), None)
    if max_len and window >= max_len:
        return {}   # no context outgrows it
    kind = str(cfg.get("model_type", "")).lower()
    if isinstance(types, list):
        sliding = sum(1 for t in types[:layers] if t == "sliding_attention")
    elif kind == "gemma2":
        sliding = (layers + 1) // 2
    elif kind in ("gemma3", "gemma3_text", "cohere2") or cfg.get("sliding_window_pattern"):
        pattern = _first(cfg, ("sliding_window_pattern",), "sliding window pattern", 4 if kind == "cohere2" else 6)
        sliding = sum(1 for i in range(layers) if (i + 1) % pattern)
    elif cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:
        first = cfg["max_window_layers"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"max_window_layers: expected a layer count, got {first!r}")
        sliding = max(0, layers - first)
    else:
        sliding = layers
    if not sliding:
        return {}
    return {"sliding_window": window} if sliding >= layers else {"sliding_window": window, "sliding_layers": sliding}


def _mixture_layout(cfg: dict[str, Any], layers: int, expert_width: int) -> dict[str, int]:
    """A mixture of experts' shared experts and dense layers as ModelSpec fields (ValueError naming the key):
    the shared experts' width (Qwen's ``shared_expert_intermediate_size``; DeepSeek's ``n_shared_experts`` x
    the experts' width), and the layers whose MLP is dense, of ``intermediate_size``: DeepSeek's first
    ``first_k_dense_replace`` and those past them not on a multiple of ``moe_layer_freq``; Qwen's
    ``mlp_only_layers`` and those not ending a run of ``decoder_sparse_step``; Llama 4's (``intermediate_size_mlp``
    beside the experts' ``intermediate_size``: ``_llama4_layout``)."""
    if cfg.get("intermediate_size_mlp"):
        return _llama4_layout(cfg, layers, expert_width)
    out: dict[str, int] = {}
    if cfg.get("shared_expert_intermediate_size"):
        out["shared_expert_size"] = _first(cfg, ("shared_expert_intermediate_size",), "shared experts' width")
    elif cfg.get("n_shared_experts"):
        out["shared_expert_size"] = _first(cfg, ("n_shared_experts",), "shared expert count") * expert_width
    first_dense = _first(cfg, ("first_k_dense_replace",), "dense layer count") if cfg.get("first_k_dense_replace") else 0
    freq = _first(cfg, ("moe_layer_freq",), "expert layer frequency", 1)
    sparse_step = _first(cfg, ("decoder_sparse_step",), "expert layer step", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ValueError(f"mlp_only_layers: expected a list of layer indices, got {only!r}")
    experts = sum(1 for i in range(layers)
                  if i >= first_dense and i % freq == 0 and (i + 1) % sparse_step == 0 and i not in only)
    if experts == 0:
        key = next(k for k in ("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers")
                   if cfg.get(k))
        raise ValueError(f"{key}: no layer is left a mixture of experts")
    if experts < layers:
        out["dense_layers"] = layers - experts
        out["dense_intermediate_size"] = _first(cfg, ("intermediate_size",), "dense layers' MLP width", expert_width)
    return out


def _llama4_layout(cfg: dict[str, Any], layers: int, expert_width: int) -> dict[str, int]:
    """Llama 4's mixture: every expert layer has a shared expert as wide as an expert; the expert layers are
    ``moe_layers`` (else every ``interleave_moe_layer_step``-th, the last of each step), the others dense, of
    ``intermediate_size_mlp``."""
    out = {"shared_expert_size": expert_width}
    moe = cfg.get("moe_layers")
    if moe is None:
        step = _first(cfg, ("interleave_moe_layer_step",), "expert layer step", 1)
        moe = list(range(step - 1, layers, step))
    if not isinstance(moe, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in moe):
        raise ValueError(f"moe_layers: expected a list of layer indices, got {moe!r}")
    experts = len({i for i in moe if 0 <= i < layers})
    if experts == 0:
        raise ValueError("moe_layers: no layer is a mixture of experts")
    if experts < layers:
        out["dense_layers"] = layers - experts
        out["dense_intermediate_size"] = _first(cfg, ("intermediate_size_mlp",), "dense layers' MLP width")
    return out


def _latent_attention(cfg: dict[str, Any]) -> dict[str, int]:
    """Multi-head latent attention's fields (DeepSeek-V2/V3, Kimi-K2): the latent's and the query's ranks
    (``q_lora_rank`` null: queries straight from the hidden state), the rotary and other parts of a query's
    and key's head, the value's head (ValueError naming a missing or bad key)."""
    rope = _first(cfg, ("qk_rope_head_dim",), "rotary head dim")
    return {"kv_lora_rank": _first(cfg, ("kv_lora_rank",), "latent rank"), "qk_rope_head_dim": rope,
            "head_dim": _first(cfg, ("qk_nope_head_dim",), "non-rotary head dim") + rope,
            "v_head_dim": _first(cfg, ("v_head_dim",), "value head dim"),
            "q_lora_rank": _first(cfg, ("q_lora_rank",), "query rank") if cfg.get("q_lora_rank") is not None else 0}


def _chunked_attention(cfg: dict[str, Any], layers: int) -> dict[str, int]:
    """Llama 4's chunked local attention as ModelSpec fields: ``attention_chunk_size`` on the layers
    ``layer_types`` names chunked_attention, else those ``no_rope_layers`` marks 1 (the RoPE layers; the NoPE
    ones attend the whole context), else all but every ``no_rope_layer_interval``-th (4: the last of each four
    global, as Llama 4 has it); none where the chunk covers the context. ValueError naming a bad key."""
    chunk = cfg.get("attention_chunk_size")
    types = cfg.get("layer_types")
    if chunk is None:
        if isinstance(types, list) and "chunked_attention" in types:
            raise ValueError("attention_chunk_size: layer_types names chunked_attention layers, but the config gives "
                             "no chunk")
        return {}
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ValueError(f"attention_chunk_size: the chunk must be a positive integer (or null), got {chunk!r}")
    max_len = cfg.get("max_position_embeddings")
    if isinstance(max_len, int) and chunk >= max_len:
        return {}
    rope = cfg.get("no_rope_layers")
    if isinstance(types, list) and "chunked_attention" in types:
        chunked = sum(1 for t in types[:layers] if t == "chunked_attention")
    elif isinstance(rope, list) and rope:
        if not all(v in (0, 1) for v in rope):
            raise ValueError(f"no_rope_layers: expected a 0 or 1 a layer, got {rope!r}")
        chunked = sum(rope[:layers])
    else:
        interval = _first(cfg, ("no_rope_layer_interval",), "NoPE layer interval", 4)
        chunked = sum(1 for i in range(layers) if (i + 1) % interval)
    if not chunked:
        return {}
    return {"attention_chunk_size": chunk} if chunked >= layers else {"attention_chunk_size": chunk,
                                                                      "chunked_layers": chunked}


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The ModelSpec of a config.json file; KvsimError naming the file (and the key) on any problem."""
    path = Path(path)
    text = read_text_bounded(path, "model config.json", MAX_CONFIG_BYTES)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise KvsimError(f"{path}:{e.lineno}", f"not valid JSON: {e.msg}") from None
    try:
        return spec_from_hf_config(cfg, name or path.parent.name or "custom")
    except ValueError as e:
        raise KvsimError(str(path), str(e)) from None


def is_config_path(value: Any) -> bool:
    """Whether a scenario's ``model`` string names a config file rather than a preset."""
    return isinstance(value, str) and value.lower().endswith(".json")
