"""kvsim kv-size --model NAME|CONFIG.json --seq-len N [--dtype fp16] [--block-size 16] [--weight-dtype int4]
[--hardware NAME [--tensor-parallel T] [--pipeline-parallel P] [--expert-parallel] [--data-parallel D]
[--max-loras N [--max-lora-rank R]]
[--gpu-memory-utilization U] [--draft-model NAME | --eagle | --eagle3]]
[--json]:
the KV arithmetic of a preset or
of a Hugging Face config.json (sim/hf_config.py), as a scenario's ``model`` takes them; with ``--hardware``,
how many blocks, tokens and sequences of ``--seq-len`` fit beside the weights (as a scenario sizes its cache:
sim.specs.kv_capacity_blocks); with ``--data-parallel D``, for one rank of a data-parallel engine of a mixture
of experts (its share of the experts) and for its D ranks together."""

from __future__ import annotations

import argparse
import json

from pydantic import ValidationError

from sim.errors import KvsimError
from sim.hf_config import is_config_path, load_hf_config
from sim.limits import MAX_TOKENS
from sim.lora import LoraConfig, gpu_lora_bytes, lora_problem
from sim.specs import (
    DTYPE_BYTES,
    WEIGHT_DTYPE_BITS,
    GiB,
    HardwareSpec,
    ModelSpec,
    group_kv_bytes_per_block,
    hbm_budget,
    kv_capacity_blocks,
)
from sim.speculative import SpeculativeConfig, draft_model_problem, drafter_bytes


def add_parser(sub) -> None:
    p = sub.add_parser("kv-size", help="KV-cache bytes per token, per block and per sequence (and what fits)")
    p.add_argument("--model", required=True, help="model preset name, or a Hugging Face config.json path")
    p.add_argument("--seq-len", type=int, required=True, help="tokens in the sequence")
    p.add_argument("--dtype", default="fp16", help="KV dtype: " + ", ".join(DTYPE_BYTES))
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--weight-dtype", help="weight-only quantization of the projections: " + ", ".join(WEIGHT_DTYPE_BITS))
    p.add_argument("--hardware", help="a hardware preset: also the blocks, tokens and sequences that fit")
    p.add_argument("--tensor-parallel", type=int, default=1, help="with --hardware: GPUs in the group")
    p.add_argument("--pipeline-parallel", type=int, default=1,
                   help="with --hardware: pipeline stages, each a tensor-parallel group (the tightest stage decides)")
    p.add_argument("--expert-parallel", action="store_true",
                   help="with --hardware: a mixture of experts' experts placed whole on the GPUs (an uneven "
                        "placement sizes every GPU's cache by the fullest)")
    p.add_argument("--data-parallel", type=int, default=1, metavar="D",
                   help="with --hardware: the group is one of D ranks of a data-parallel engine of a mixture of experts "
                        "(vLLM's --data-parallel-size), which share the experts: one rank's cache, and all D ranks'")
    p.add_argument("--max-loras", type=int, help="with --hardware: LoRA adapter slots (vLLM's --max-loras), their "
                                                 "weights beside the model's")
    p.add_argument("--max-lora-rank", type=int, default=16, help="with --max-loras: the slots' rank (default 16)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="with --hardware: share of HBM used")
    drafter = p.add_mutually_exclusive_group()
    drafter.add_argument("--draft-model", help="with --hardware: a speculative draft model (preset or Hugging Face "
                                               "id) beside the target: its weights and its KV in every block")
    drafter.add_argument("--eagle", action="store_true", help="with --hardware: an EAGLE head beside the target")
    drafter.add_argument("--eagle3", action="store_true", help="with --hardware: an EAGLE-3 head beside the target "
                                                               "(its own LM head of 32,000 tokens)")
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="a sliding-window model's layers keep every token (else blocks leaving the window are freed)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=main)


def kv_size(model: ModelSpec, seq_len: int, dtype: str, block_size: int) -> dict:
    """The KV arithmetic of one sequence of ``seq_len`` tokens; under window pages (``ModelSpec.kv_pages``)
    a block is a page of one group of layers and a sequence holds its full layers' pages and its window's."""
    per_token = model.kv_bytes_per_token(dtype)
    blocks = pages_per_sequence(model, seq_len, block_size)
    window = _window_sizes(model, seq_len, dtype)
    block = model.kv_bytes_per_block(block_size, dtype)
    return {
        "model": model.name, "dtype": dtype, "seq_len": seq_len, "block_size": block_size,
        "num_layers": model.num_layers, "num_kv_heads": 1 if model.latent_attention else model.num_kv_heads,
        "head_dim": model.latent_size if model.latent_attention else model.head_dim,
        "bytes_per_token": per_token,
        "bytes_per_block": block,
        "bytes_per_sequence": window.get("bytes_per_sequence_kept", per_token * seq_len),
        "blocks_per_sequence": blocks,
        "bytes_per_sequence_paged": blocks * block,
        "weight_bytes": model.weight_bytes(),
        "params": model.num_params(), "activated_params": model.activated_params(),
        "weight_dtype": model.weight_dtype or model.dtype,
        **{k: v for k, v in window.items() if k != "bytes_per_sequence_kept"},
    }


def pages_per_sequence(model: ModelSpec, seq_len: int, block_size: int) -> int:
    """Blocks a sequence of ``seq_len`` tokens holds once its last token is computed: its table, and under
    window pages those of what its next query sees (sim/kv/window_pages.py); where every layer is local, the
    blocks its last query sees alone (sim/kv/sliding_only.py)."""
    table = -(-seq_len // block_size)
    pages = model.kv_pages()
    if pages is None and not model.sliding_only():
        return table
    first = model.local_attention.first_visible(seq_len - 1) // block_size
    return table - first if pages is None else table + pages[1] * (table - first)


def _window_sizes(model: ModelSpec, seq_len: int, dtype: str) -> dict:
    """A local-attention model's kind (sliding_window or chunked), span and layers, the pages' group, and the
    bytes a sequence's KV takes with every token of every layer kept (vLLM's --disable-hybrid-kv-cache-manager)
    and kept on the local layers only for what the next query sees (its hybrid manager, to the token);
    nothing for other models."""
    local = model.local_attention
    if local is None:
        return {}
    per_layer = model.kv_bytes_per_token(dtype) // model.num_layers
    seen = seq_len - local.first_visible(seq_len - 1)
    layers = model.local_layers
    window_only = per_layer * ((model.num_layers - layers) * seq_len + layers * seen)
    pages = model.kv_pages()
    return {"local_attention": "chunked" if local.chunked else "sliding_window", "local_span": local.span,
            "local_layers": layers, "layers_per_block": pages[0] if pages else model.num_layers,
            "bytes_per_sequence_all_layers": per_layer * model.num_layers * seq_len,
            "bytes_per_sequence_window_only": window_only,
            "bytes_per_sequence_kept": window_only if pages or model.sliding_only()
            else per_layer * model.num_layers * seq_len}


def capacity(model: ModelSpec, hardware: HardwareSpec, seq_len: int, block_size: int, utilization: float,
             drafter: SpeculativeConfig | None = None, lora: LoraConfig | None = None, data_parallel: int = 1) -> dict:
    """What fits on ``hardware`` (its tensor-parallel group) beside the weights (and a speculative ``drafter``'s
    weights and KV, sim/speculative.py; LoRA adapter slots, sim/lora.py): KV blocks (a block over the group, KV
    heads copied where the group has more GPUs than KV heads), tokens, and whole sequences of ``seq_len`` tokens
    (each its blocks, none shared). ``data_parallel`` > 1: the group is one of that many ranks of a
    data-parallel engine (sim/cluster/data_parallel.py), holding its share of the experts; ``data_parallel``
    gives the ranks' blocks, tokens and sequences together."""
    draft = (0, 0) if drafter is None else drafter_bytes(drafter, model, hardware, block_size)
    slots = 0 if lora is None else gpu_lora_bytes(model, hardware.tensor_parallel, lora)
    blocks = kv_capacity_blocks(model, hardware, block_size, utilization, None, *draft, lora_bytes=slots,
                                data_parallel=data_parallel)
    out = _fits(model, hardware, seq_len, block_size, utilization, blocks, draft, slots, data_parallel)
    if data_parallel > 1:
        out["data_parallel"] = {"ranks": data_parallel, "kv_blocks": data_parallel * out["kv_blocks"],
                                "kv_tokens": data_parallel * out["kv_tokens"],
                                "sequences": data_parallel * out["sequences"]}
    return out


def _fits(model: ModelSpec, hardware: HardwareSpec, seq_len: int, block_size: int, utilization: float, blocks: int,
          draft: tuple[int, int], slots: int, data_parallel: int) -> dict:
    """``capacity``'s figures of one group holding ``blocks`` blocks."""
    return {"hardware": hardware.name, "tensor_parallel": hardware.tensor_parallel,
            **({"pipeline_parallel": hardware.pipeline_parallel} if hardware.pipeline_parallel > 1 else {}),
            **({"expert_parallel": True} if hardware.expert_parallel else {}),
            "gpu_memory_utilization": utilization, "group_bytes_per_block": group_kv_bytes_per_block(
                model, hardware, block_size) + draft[1],
            "kv_blocks": blocks, "kv_tokens": blocks * seq_len // pages_per_sequence(model, seq_len, block_size)
            if model.kv_pages() or model.sliding_only() else blocks * block_size,
            "sequences": blocks // pages_per_sequence(model, seq_len, block_size),
            "hbm_budget": hbm_budget(model, hardware, block_size, blocks, utilization, None, *draft, lora_bytes=slots,
                                     data_parallel=data_parallel)}


def _drafter(args: argparse.Namespace, model: ModelSpec) -> SpeculativeConfig | None:
    """The speculative drafter that ``--draft-model``, ``--eagle`` or ``--eagle3`` names (None: none)."""
    if args.eagle or args.eagle3:
        return SpeculativeConfig(method="eagle" if args.eagle else "eagle3", num_speculative_tokens=1,
                                 acceptance_rate=1.0)
    if args.draft_model is None:
        return None
    try:
        draft = ModelSpec.from_name(args.draft_model)
    except KeyError as e:
        raise KvsimError("--draft-model", e.args[0]) from None
    why = draft_model_problem(draft, model, args.tensor_parallel)
    if why:
        raise KvsimError("--draft-model", why)
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=1, acceptance_rate=1.0, model=draft)


def _lora(args: argparse.Namespace, model: ModelSpec, hardware: HardwareSpec) -> LoraConfig | None:
    """The LoRA slots ``--max-loras`` and ``--max-lora-rank`` ask for (None: none)."""
    if args.max_loras is None:
        return None
    why = lora_problem(model)
    if why:
        raise KvsimError("--max-loras", why)
    if hardware.pipeline_parallel > 1:
        raise KvsimError("--max-loras", "LoRA with pipeline stages is not modelled")
    try:
        return LoraConfig(max_loras=args.max_loras, max_lora_rank=args.max_lora_rank)
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--max-loras" if err["loc"] and err["loc"][0] == "max_loras" else "--max-lora-rank"
        raise KvsimError(flag, err["msg"].removeprefix("Value error, ")) from None


def _model(args: argparse.Namespace) -> ModelSpec:
    if is_config_path(args.model):
        model = load_hf_config(args.model)   # (KvsimError naming the file and the key)
    else:
        try:
            model = ModelSpec.from_name(args.model)
        except KeyError as e:
            raise KvsimError("--model", e.args[0]) from None
    if args.dtype not in DTYPE_BYTES:
        raise KvsimError("--dtype", f"unknown dtype {args.dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    update = {"kv_dtype": args.dtype, "hybrid_kv": not args.disable_hybrid_kv_cache_manager}
    if args.weight_dtype is not None:
        update["weight_dtype"] = args.weight_dtype
        if args.weight_dtype == "mxfp4":   # (gpt-oss's: a mixture of experts' experts, exponents a 32)
            if not model.num_experts:
                raise KvsimError("--weight-dtype", f"mxfp4 quantizes a mixture of experts' experts; {model.name} "
                                 "has none (int4 or int8 quantize every projection)")
            update.update(weight_group_size=32, weight_scope="experts")
    try:
        return ModelSpec(**{**model.model_dump(), **update})
    except ValidationError as e:
        raise KvsimError("--weight-dtype", e.errors()[0]["msg"].removeprefix("Value error, ")) from None


def _hardware(args: argparse.Namespace, model: ModelSpec) -> HardwareSpec:
    try:
        preset = HardwareSpec.from_name(args.hardware)
    except KeyError as e:
        raise KvsimError("--hardware", e.args[0]) from None
    if not 1 <= args.tensor_parallel <= 1024:
        raise KvsimError("--tensor-parallel", f"must be 1 .. 1024, got {args.tensor_parallel}")
    if args.expert_parallel:
        from sim.expert_parallel import expert_parallel_problem

        why = expert_parallel_problem(model, args.tensor_parallel)
        if why:
            raise KvsimError("--expert-parallel", why)
    why = model.tensor_parallel_problem(args.tensor_parallel, args.expert_parallel)
    if why:
        raise KvsimError("--tensor-parallel", why)
    if not 1 <= args.pipeline_parallel <= min(64, model.num_layers):
        raise KvsimError("--pipeline-parallel", f"must be 1 .. {min(64, model.num_layers)} (a stage needs one of "
                         f"{model.name}'s {model.num_layers} layers), got {args.pipeline_parallel}")
    if args.pipeline_parallel > 1 and (args.draft_model is not None or args.eagle or args.eagle3):
        raise KvsimError("--pipeline-parallel", "a speculative drafter with pipeline stages is not modelled")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise KvsimError("--gpu-memory-utilization", f"must be in (0, 1], got {args.gpu_memory_utilization}")
    hw = HardwareSpec(**{**preset.model_dump(), "tensor_parallel": args.tensor_parallel,
                         "pipeline_parallel": args.pipeline_parallel, "expert_parallel": args.expert_parallel})
    if args.data_parallel != 1:
        _check_data_parallel(args, model, hw)
    return hw


def _check_data_parallel(args: argparse.Namespace, model: ModelSpec, hw: HardwareSpec) -> None:
    """``--data-parallel`` as a scenario's ``cluster.data_parallel`` takes it (sim/cluster/data_parallel.py)."""
    from sim.cluster.data_parallel import group_problem

    if args.data_parallel < 1:
        raise KvsimError("--data-parallel", f"must be at least 1, got {args.data_parallel}")
    problem = group_problem(model, hw, args.data_parallel)
    if problem is not None:
        raise KvsimError("--data-parallel", problem[1])
    for there, flag in ((hw.pipeline_parallel > 1, "--pipeline-parallel"), (args.max_loras is not None, "--max-loras"),
                        (args.draft_model is not None or args.eagle or args.eagle3, "a speculative drafter")):
        if there:
            raise KvsimError("--data-parallel", f"a data-parallel group with {flag} is not modelled")


def main(args: argparse.Namespace) -> int:
    model = _model(args)
    if not 0 < args.seq_len <= MAX_TOKENS:
        raise KvsimError("--seq-len", f"must be 1 .. {MAX_TOKENS:,}, got {args.seq_len}")
    if args.block_size <= 0 or args.block_size > 1024 or args.block_size & (args.block_size - 1):
        raise KvsimError("--block-size", f"must be a power of two from 1 to 1024, got {args.block_size}")
    info = kv_size(model, args.seq_len, args.dtype, args.block_size)
    if args.hardware is not None:
        hw = _hardware(args, model)
        try:
            info["fits"] = capacity(model, hw, args.seq_len, args.block_size, args.gpu_memory_utilization,
                                    _drafter(args, model), _lora(args, model, hw), args.data_parallel)
        except ValueError as e:   # the weights alone do not fit
            raise KvsimError("--hardware", str(e)) from None
    elif args.data_parallel != 1:
        raise KvsimError("--data-parallel", "needs --hardware (each rank's cache is what its GPUs leave)")
    elif args.max_loras is not None:
        raise KvsimError("--max-loras", "needs --hardware (the adapter slots take room from the cache that fits there)")
    elif args.draft_model is not None or args.eagle or args.eagle3:
        raise KvsimError("--draft-model" if args.draft_model is not None else "--eagle3" if args.eagle3 else "--eagle",
                         "needs --hardware (the drafter takes room from the cache that fits there)")
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [
        ("KV per token", info["bytes_per_token"]),
        (f"KV per {args.block_size}-token block", info["bytes_per_block"]),
        (f"KV per {args.seq_len}-token sequence", info["bytes_per_sequence"]),
        (f"  paged ({info['blocks_per_sequence']} blocks)", info["bytes_per_sequence_paged"]),
        (f"model weights ({info['weight_dtype']})", info["weight_bytes"]),
    ]
    if model.latent_attention:
        print(f"{model.name}: {model.num_layers} layers x a latent of {model.kv_lora_rank} + {model.qk_rope_head_dim} "
              f"(rotary key) x {DTYPE_BYTES[args.dtype]} bytes ({args.dtype}), on every GPU of a group")
    else:
        print(f"{model.name}: {model.num_layers} layers x {model.num_kv_heads} KV heads x {model.head_dim} "
              f"head_dim x {DTYPE_BYTES[args.dtype]} bytes ({args.dtype}) x 2 (K and V)")
    for name, b in rows:
        print(f"  {name:<34} {b:>18,d} bytes  {b / GiB:>10.3f} GiB  {b / 1e9:>10.3f} GB")
    if "local_attention" in info:
        kind = "chunked attention, chunks of" if info["local_attention"] == "chunked" else "sliding window:"
        print(f"  {kind} {info['local_span']:,} tokens on {info['local_layers']} of {model.num_layers} layers; "
              "their attention reads what a query sees")
        alone, whole = info["bytes_per_sequence_window_only"], info["bytes_per_sequence_all_layers"]
        if model.kv_pages() or model.sliding_only():
            print(f"  their blocks leave the cache when no query sees them (vLLM's hybrid KV cache manager): a block holds "
                  f"{info['layers_per_block']} layers, a {args.seq_len:,}-token sequence {alone / 1e9:.3f} GB of KV "
                  f"against {whole / 1e9:.3f} GB with every token kept (--disable-hybrid-kv-cache-manager)")
        else:
            why = ("kvsim pages only models whose full-attention layers fill one group of layers" if model.hybrid_kv
                   else "--disable-hybrid-kv-cache-manager")
            print(f"  every layer keeps every token ({why}): {whole / 1e9:.3f} GB a {args.seq_len:,}-token sequence, "
                  f"against {alone / 1e9:.3f} GB with what a query sees alone (vLLM's hybrid KV cache manager)")
    if model.num_experts:
        print(f"  parameters: {info['params'] / 1e9:,.2f} B, {info['activated_params'] / 1e9:,.2f} B a token "
              f"({model.experts_per_token} of {model.num_experts} experts)")
    fits = info.get("fits")
    if fits:
        shape = (f"{fits['pipeline_parallel']} stages of {fits['tensor_parallel']}" if "pipeline_parallel" in fits
                 else f"{fits['tensor_parallel']}")
        whole = " (experts placed whole)" if fits.get("expert_parallel") else ""
        print(f"on {shape} x {fits['hardware']}{whole} at gpu_memory_utilization "
              f"{fits['gpu_memory_utilization']:g} (5% of it kept for activations): {fits['kv_blocks']:,} blocks, "
              f"{fits['kv_tokens']:,} tokens, {fits['sequences']:,} sequences of {args.seq_len:,} tokens")
        if "data_parallel" in fits:
            d = fits["data_parallel"]
            print(f"  (one of {d['ranks']} data-parallel ranks, holding 1/{d['ranks']} of the experts; the "
                  f"{d['ranks']} ranks: {d['kv_blocks']:,} blocks, {d['kv_tokens']:,} tokens, {d['sequences']:,} "
                  f"sequences)")
        b = fits["hbm_budget"]
        print(f"  of its {b['hbm_bytes'] / 1e9:.2f} GB: weights {b['weights_bytes'] / 1e9:.2f}, activation reserve "
              f"{b['activation_reserve_bytes'] / 1e9:.2f}, KV cache {b['kv_cache_bytes'] / 1e9:.2f}, unused "
              f"{b['unused_bytes'] / 1e9:.2f} GB")
        if "lora_slots_bytes" in b:
            print(f"  of the weights, {args.max_loras} LoRA slots of rank {args.max_lora_rank}: "
                  f"{b['lora_slots_bytes'] / 1e9:.2f} GB")
        if "draft_weights_bytes" in b:
            print(f"  the drafter's part: weights {b['draft_weights_bytes'] / 1e9:.2f} GB, its KV in the blocks "
                  f"{b['draft_kv_cache_bytes'] / 1e9:.2f} GB")
    return 0
