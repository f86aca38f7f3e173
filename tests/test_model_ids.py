"""Hugging Face model ids name presets in scenarios, overrides and kv-size (sim/model_ids.py through
ModelSpec.from_name): a preset's own id, and a quantized checkpoint's id as the preset quantized that way."""

from __future__ import annotations

import pytest

from sim.errors import KvsimError
from sim.runner import gpu_blocks
from sim.scenario import scenario_from_dict
from sim.specs import ModelSpec

WORK = {"requests": [{"prompt_len": 5, "output_len": 2}]}


@pytest.mark.parametrize("model_id, preset", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"), ("LLAMA-2-7B", "llama-2-7b"),
    # a version named by a preset of its own is that one (v0.1's sliding window; v0.2 and v0.3 are mistral-7b)
    ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1"), ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-v0.1"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"), ("google/gemma-3-27b-it", "gemma-3-27b"),
    ("google/gemma-2-9b-it", "gemma-2-9b"), ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama-4-scout-17b-16e"),
])
def test_a_presets_hub_id_is_the_preset(model_id, preset):
    assert ModelSpec.from_name(model_id) is ModelSpec.from_name(preset)
    scn = scenario_from_dict({"model": model_id, "hardware": "h100-80gb", "workload": WORK})
    assert scn.model_spec is ModelSpec.from_name(preset)


def test_a_quantized_checkpoints_id_is_its_preset_quantized_in_a_scenario_a_mapping_and_an_override():
    # Llama-2-7B in int4 on an H100: 8,294 blocks of 16 tokens (tests/test_weight_quantization.py, by hand)
    scn = scenario_from_dict({"model": "TheBloke/Llama-2-7B-AWQ", "hardware": "h100-80gb", "workload": WORK})
    assert scn.model_spec.weight_dtype == "int4" and gpu_blocks(scn) == 8294
    # a mapping named by the id starts from the quantized preset and changes one field
    scn = scenario_from_dict({"model": {"name": "TheBloke/Llama-2-7B-AWQ", "max_model_len": 2048},
                              "hardware": "h100-80gb", "workload": WORK})
    assert (scn.model_spec.weight_dtype, scn.model_spec.max_model_len, scn.model_spec.num_layers) == ("int4", 2048, 32)
    for override in ("model=Qwen/Qwen3-8B-FP8", "model.name=Qwen/Qwen3-8B-FP8"):
        scn = scenario_from_dict({"model": "llama-2-7b", "hardware": "h100-80gb", "workload": WORK},
                                 overrides=[override])
        assert (scn.model_spec.name, scn.model_spec.dtype, scn.model_spec.kv_dtype) == ("qwen3-8b-fp8", "fp8", "fp16")


def test_an_id_of_no_preset_is_refused_naming_the_ways_to_give_a_model():
    with pytest.raises(KvsimError, match="unknown model preset 'acme/Giant-9000-AWQ'.*Hugging Face id of one, or a "
                                         "config.json path"):
        scenario_from_dict({"model": "acme/Giant-9000-AWQ", "workload": WORK})


@pytest.mark.parametrize("overrides", [
    ["model=TheBloke/Llama-2-7B-AWQ", "model.weight_group_size=64"],
    ["model.weight_group_size=64", "model.name=TheBloke/Llama-2-7B-AWQ"],
    ["model.name=TheBloke/Llama-2-7B-AWQ", "model.weight_group_size=64"],
])
def test_a_field_of_a_quantized_checkpoint_overrides_in_either_order(overrides):
    # groups of 64 rows: 64 x 12288 + 64 x 4096 + 64 x 22016 + 172 x 4096 = 3,162,112 scales a layer, 202,375,168
    # bytes over 32 layers; with the int4 weights (3,238,002,688) and the fp16 rest (524,820,480): 3,965,198,336
    # bytes, leaving (73,443,940,761.6 - 3,965,198,336) / 8,388,608 = 8,282 blocks on an H100
    scn = scenario_from_dict({"model": "llama-2-7b", "hardware": "h100-80gb", "workload": WORK}, overrides=overrides)
    assert scn.model_spec.weight_bytes() == 3_965_198_336 and gpu_blocks(scn) == 8282
