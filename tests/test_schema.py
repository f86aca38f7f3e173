"""`kvsim schema` (the JSON Schema editors read) agrees with what kvsim accepts: every shipped scenario
validates, preset mappings that give only what differs validate, and keys or values kvsim refuses are
refused by the schema too."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from sim.errors import KvsimError
from sim.scenario import scenario_from_dict, scenario_json_schema

SCENARIOS = sorted(p for p in (Path(__file__).parents[1] / "scenarios").glob("*.yaml")
                   if "grid" not in yaml.safe_load(p.read_text()))
BASE = {"model": "tiny-llama", "hardware": "a100-80gb",
        "workload": {"synthetic": {"num_requests": 3, "prompt_len": {"dist": "fixed", "value": 8},
                                   "output_len": {"dist": "fixed", "value": 4}}}}


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = scenario_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenarios_validate(validator, path):
    assert not list(validator.iter_errors(yaml.safe_load(path.read_text())))


@pytest.mark.parametrize("part", [
    {"hardware": {"name": "h100-80gb", "tensor_parallel": 4}},
    {"hardware": {"name": "a100-80gb", "pipeline_parallel": 2}},
    {"model": {"name": "llama-2-7b", "max_model_len": 2048}},
    {"model": {"name": "gpt-oss-20b", "weight_dtype": "mxfp4", "weight_scope": "experts"}},
    {"kv_cache": {"block_size": 32}},
    {"lora": {"max_lora_rank": 64}},
])
def test_what_kvsim_accepts_validates(validator, part):
    scenario_from_dict({**BASE, **part})
    assert not list(validator.iter_errors({**BASE, **part}))


@pytest.mark.parametrize("part", [
    {"hardware": {"tensor_parallel": 4}},              # a part of a mapping needs the preset it changes
    {"model": {"name": "llama-2-7b", "max_modl_len": 2048}},
    {"kv_cache": {"blok_size": 16}},
    {"kv_cache": {"block_size": 7}},                   # (kvsim: a power of two)
    {"lora": {"max_lora_rank": 17}},                   # (kvsim: one of vLLM's ranks)
    {"scheduler": {"policy": "fifo"}},
])
def test_what_kvsim_refuses_is_refused(validator, part):
    with pytest.raises(KvsimError):
        scenario_from_dict({**BASE, **part})
    assert list(validator.iter_errors({**BASE, **part}))
