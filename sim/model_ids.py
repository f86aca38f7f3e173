"""Hugging Face model ids as kvsim's presets: 'meta-llama/Llama-2-7b-hf' is llama-2-7b, and a quantized
checkpoint named by its method ('TheBloke/Llama-2-7B-AWQ') is its preset quantized that way. Scenarios
(``model: Qwen/Qwen2.5-7B-Instruct``: ``ModelSpec.from_name``) and measured runs files (sim/fidelity/runs.py)
name models so.

Invariant: an id maps to a preset only through the suffixes below being dropped; anything else is None
(the caller asks for a config.json), never a guess at a nearby model.
"""

from __future__ import annotations

import re

from sim.specs import MODEL_PRESETS, ModelSpec


def model_preset(name: str) -> str | None:
    """'meta-llama/Llama-2-7b-hf' -> 'llama-2-7b'; 'codellama/CodeLlama-34b-Instruct-hf' -> 'codellama-34b';
    'mistralai/Mixtral-8x7B-v0.1' -> 'mixtral-8x7b'; 'Meta-Llama-3.1-8B-Instruct' -> 'llama-3.1-8b';
    'mistralai/Mistral-Small-24B-Instruct-2501' -> 'mistral-small-24b'; 'Qwen/Qwen3-14B-Base' -> 'qwen3-14b';
    'deepseek-ai/DeepSeek-V3-0324' -> 'deepseek-v3'; 'mistralai/Mistral-7B-Instruct-v0.1' -> 'mistral-7b-v0.1'
    (v0.1's sliding window), 'mistralai/Mistral-7B-Instruct-v0.3' -> 'mistral-7b'; 'google/gemma-3-27b-it' ->
    'gemma-3-27b'."""
    key = name.strip().split("/")[-1].lower().removeprefix("meta-")
    for _ in range(3):   # e.g. CodeLlama-34b-Instruct-hf, Mixtral-8x7B-Instruct-v0.1
        for suffix in ("-hf", "-instruct", "-chat", "-base", "-it", "-pt"):
            key = key.removesuffix(suffix)
        if key in MODEL_PRESETS:   # (before a version is dropped: DeepSeek-V3 is a preset, "deepseek" none)
            return key
        versioned = re.sub(r"-(instruct|chat|base|it)(-v\d+(\.\d+)*)$", r"\2", key)   # Mistral-7B-Instruct-v0.1
        if versioned in MODEL_PRESETS:
            return versioned
        key = re.sub(r"-v\d+(\.\d+)*$", "", key)   # a release suffix: -v0.1
        key = re.sub(r"-\d{4}$", "", key)             # a release date: -2501
    return key if key in MODEL_PRESETS else None


# quantized checkpoints named by their method (hugging-quants, TheBloke, Qwen, RedHatAI / neuralmagic): the
# suffix of the model id, and the ModelSpec fields vLLM serves them with (sim/hf_quantization.py); the
# group size is the methods' default, 128
QUANTIZED_SUFFIXES = [
    (r"-(awq|gptq)(-int4)?$", "int4", {"weight_dtype": "int4"}),
    (r"-gptq-int8$", "int8", {"weight_dtype": "int8"}),
    (r"-quantized\.w4a16$", "int4", {"weight_dtype": "int4"}),
    (r"-quantized\.w8a16$", "int8", {"weight_dtype": "int8"}),
    (r"-quantized\.w8a8$", "w8a8", {"dtype": "int8", "kv_dtype": "fp16"}),
    (r"-fp8(-dynamic)?$", "fp8", {"dtype": "fp8", "kv_dtype": "fp16"}),
]


def quantized_model(name: str) -> ModelSpec | None:
    """'hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4' -> llama-3.1-8b with int4 weights; 'Qwen/Qwen3-8B-FP8'
    -> qwen3-8b in fp8 (weights and activations; the KV cache 16-bit, as vLLM keeps it): a preset's model
    quantized as the id's suffix says (None: no such suffix, or no preset under it)."""
    key = name.strip().split("/")[-1].lower()
    for pattern, tag, fields in QUANTIZED_SUFFIXES:
        base = re.sub(pattern, "", key)
        if base != key:
            preset = model_preset(base)
            if preset is None:
                return None
            return ModelSpec(**{**MODEL_PRESETS[preset].model_dump(), **fields, "name": f"{preset}-{tag}"})
    return None

