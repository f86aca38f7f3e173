"""A run's summary says what priced its steps (``step_model``): the executor, the calibration it resolved
(a shipped one found by the hardware's name, a file, or the uncalibrated roofline) and whether the engine
terms were on; a cluster whose pools price differently says so per role."""

from __future__ import annotations

import shutil

import pytest

from sim import run_scenario, scenario_from_dict
from sim.executors.cost_model import shipped_calibration
from sim.specs import HardwareSpec

REQUESTS = {"requests": [{"prompt_len": 40, "output_len": 3}, {"prompt_len": 70, "output_len": 2, "arrival": 0.01}]}
A100 = {"executor": "cost_model", "calibration": "a100-80gb", "engine_terms": True}


def _summary(tmp_path=None, **keys) -> dict:
    data = {"model": "llama-2-7b", "hardware": "a100-80gb", "workload": REQUESTS, "output": {"plots": False}, **keys}
    return run_scenario(scenario_from_dict(data, base_dir=tmp_path or ".")).summary


@pytest.mark.parametrize("keys, expected", [
    ({}, A100),   # no executor key: the hardware's shipped calibration, engine terms on
    ({"hardware": {"name": "A100-80GB", "tensor_parallel": 2}}, A100),   # a mapping naming the preset
    ({"executor": {"engine": False}}, {**A100, "engine_terms": False}),
    # another GPU's calibration, as asked: named, with the hardware it was made for
    ({"executor": {"calibration": "h100-80gb"}}, {**A100, "calibration": "h100-80gb", "calibrated_for": "h100-80gb"}),
    ({"executor": {"calibration": "roofline"}}, {**A100, "calibration": "roofline", "engine_terms": False}),
    # a hardware of another name has no shipped calibration: the uncalibrated roofline, said so
    ({"hardware": {**HardwareSpec.from_name("a100-80gb").model_dump(), "name": "my-a100"}},
     {**A100, "calibration": "roofline", "engine_terms": False}),
])
def test_the_summary_names_what_priced_the_steps(keys, expected):
    assert _summary(**keys)["step_model"] == expected


def test_a_calibration_file_is_named_as_the_scenario_gave_it(tmp_path):
    shutil.copy(shipped_calibration("h100-80gb"), tmp_path / "mine.json")
    got = _summary(tmp_path, executor={"calibration": "mine.json"})["step_model"]
    assert got == {"executor": "cost_model", "calibration": "mine.json", "engine_terms": True,
                   "calibrated_for": "h100-80gb"}   # (the file says it was made for the H100)


def test_a_cluster_says_it_per_role_when_its_pools_differ():
    same = _summary(cluster={"replicas": 2})["step_model"]
    assert same == A100
    split = _summary(cluster={"prefill": {"replicas": 1, "hardware": "h100-80gb"}, "decode": {"replicas": 1}})
    assert split["step_model"] == {"prefill": {**A100, "calibration": "h100-80gb"}, "decode": A100}
