"""A Hugging Face config's ``quantization_config``, as the ModelSpec fields that price it (sim/hf_config.py).

What vLLM serves such a checkpoint with, and what kvsim makes of it:

    quant_method                    weights           activations    kvsim
    awq, gptq (and their marlin     4 or 8 bit ints   dtype          weight_dtype int4 / int8, the config's
    variants, marlin)               in groups                        group_size (-1: one scale a column)
    fp8                             fp8               fp8 (dynamic)  dtype fp8 (W8A8), KV in the config's dtype
    compressed-tensors              from config_groups: int 4/8 weights alone (w4a16, w8a16), fp8 weights
                                    alone, fp8 weights and activations (dtype fp8), int8 weights and
                                    activations (dtype int8); kv_cache_scheme fp8: an fp8 KV cache
    mxfp4 (gpt-oss)                 the routed        dtype          weight_dtype mxfp4, one e8m0 exponent a
                                    experts in fp4                   32 elements, weight_scope experts (vLLM's
                                                                     MXFP4 method quantizes only fused MoE
                                                                     layers), dtype the config's (bf16)

vLLM keeps the KV cache in the model's dtype unless told otherwise (``--kv-cache-dtype auto``), so a W8A8
checkpoint's KV stays 16-bit: ``kv_dtype`` is set to the config's ``torch_dtype`` (bf16 or fp16).
Invariant: anything else (bitsandbytes, GGUF, NVFP4, 2- or 3-bit weights, schemes that differ
between layer groups) is a ValueError naming the key: kvsim does not price a model as something it is not.
"""

from __future__ import annotations

from typing import Any

WEIGHT_ONLY_METHODS = {"awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"}
KNOWN = sorted(WEIGHT_ONLY_METHODS | {"fp8", "compressed-tensors", "mxfp4"})


def quantization_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ModelSpec fields of the config's ``quantization_config`` ({} where it has none)."""
    q = cfg.get("quantization_config")
    if q is None:
        return {}
    if not isinstance(q, dict):
        raise ValueError("quantization_config: expected a mapping")
    method = str(q.get("quant_method", "")).lower()
    if method in WEIGHT_ONLY_METHODS:
        # (AutoAWQ's own names, w_bit and q_group_size, where a config carries those)
        return _int_weights(q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size", 128)),
                            "quantization_config")
    if method == "fp8":
        return {"dtype": "fp8", "kv_dtype": _activation_dtype(cfg)}
    if method == "compressed-tensors":
        return _compressed_tensors(q, cfg)
    if method == "mxfp4":
        if not any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
            raise ValueError("quantization_config.quant_method: mxfp4 quantizes a mixture of experts' experts, "
                             "and this config has none")
        return {"weight_dtype": "mxfp4", "weight_group_size": 32, "weight_scope": "experts",
                "dtype": _activation_dtype(cfg)}
    raise ValueError(f"quantization_config.quant_method: {method or 'none'!r} is not modelled by kvsim "
                     f"({', '.join(KNOWN)} are)")


def _activation_dtype(cfg: dict[str, Any]) -> str:
    """The 16-bit dtype the checkpoint computes in (``torch_dtype``, or ``dtype`` in newer configs)."""
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float16").lower()
    return "bf16" if name in ("bfloat16", "bf16") else "fp16"


def _int_weights(bits: Any, group: Any, where: str) -> dict[str, Any]:
    """Weight-only integer weights of ``bits`` bits, one scale a ``group`` rows (-1 or None: a column)."""
    if bits not in (4, 8) or isinstance(bits, bool):
        raise ValueError(f"{where}.bits: {bits!r}-bit weights are not modelled by kvsim (4 or 8 are)")
    if group is None or group == -1:
        group = 0
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise ValueError(f"{where}.group_size: expected a positive integer or -1, got {group!r}")
    return {"weight_dtype": f"int{bits}", "weight_group_size": group}


def _compressed_tensors(q: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError("quantization_config.config_groups: expected a mapping of schemes")
    schemes = []
    for name, scheme in groups.items():
        if not isinstance(scheme, dict) or not isinstance(scheme.get("weights"), dict):
            raise ValueError(f"quantization_config.config_groups.{name}.weights: expected a mapping")
        w, a = scheme["weights"], scheme.get("input_activations")
        schemes.append(((w.get("type"), w.get("num_bits"), w.get("strategy"), w.get("group_size")),
                        None if not isinstance(a, dict) else (a.get("type"), a.get("num_bits"))))
    if any(s != schemes[0] for s in schemes):
        raise ValueError("quantization_config.config_groups: layers quantized in different schemes are not "
                         "modelled by kvsim (one scheme for every projection is)")
    (wtype, wbits, strategy, group), act = schemes[0]
    where = f"quantization_config.config_groups.{next(iter(groups))}"
    out: dict[str, Any]
    if act is None and wtype == "int":
        out = _int_weights(wbits, group if strategy == "group" else -1, f"{where}.weights")
    elif act is None and (wtype, wbits) == ("float", 8):
        out = {"weight_dtype": "fp8", "weight_group_size": group if strategy == "group" and group else 0}
    elif act == (wtype, wbits) and (wtype, wbits) in (("float", 8), ("int", 8)):
        out = {"dtype": "fp8" if wtype == "float" else "int8", "kv_dtype": _activation_dtype(cfg)}
    else:
        raise ValueError(f"{where}: {wbits}-bit {wtype} weights with "
                         f"{'no' if act is None else f'{act[1]}-bit {act[0]}'} quantized activations are not "
                         "modelled by kvsim (int4 or int8 weights alone, fp8 weights alone, or fp8 or int8 "
                         "weights and activations are)")
    kv = q.get("kv_cache_scheme")
    if isinstance(kv, dict):
        if (kv.get("type"), kv.get("num_bits")) != ("float", 8):
            raise ValueError("quantization_config.kv_cache_scheme: only an fp8 KV cache is modelled by kvsim")
        out["kv_dtype"] = "fp8"
    return out
