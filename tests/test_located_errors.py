"""Errors found after a scenario is loaded name the key's line in its file (Scenario.key_error, runner.located_errors)."""

import pytest

from sim.errors import KvsimError
from sim.runner import _scenario_key, located_errors
from sim.scenario import load_scenario

TEXT = """model: tiny-llama
hardware: a100-80gb
kv_cache: {block_size: 4, num_gpu_blocks: 32}
workload:
  synthetic:
    num_requests: 3
    prompt_len: {dist: fixed, value: 8}
    output_len: {dist: fixed, value: 4}
executor:
  kind: cost_model
"""


@pytest.fixture
def scenario_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(TEXT)
    return f


def test_a_key_missing_from_the_file_is_placed_at_its_mapping(scenario_file):
    scn = load_scenario(scenario_file)
    # executor.device is not in the file: the executor mapping's line, 9; kind is on line 10
    assert str(scn.key_error("executor.device", "x")) == f"{scenario_file}:9: executor.device: x"
    assert str(scn.key_error("executor.kind", "y")) == f"{scenario_file}:10: executor.kind: y"
    assert str(scn.key_error("workload.synthetic.prompt_len", "z")) == f"{scenario_file}:7: workload.synthetic.prompt_len: z"


def test_a_key_set_on_the_command_line_names_the_file_alone(scenario_file):
    scn = load_scenario(scenario_file, ["executor.calibration=x.json"])
    assert str(scn.key_error("executor.calibration", "w")) == f"{scenario_file}: executor.calibration: w (from --set)"
    assert str(scn.key_error("executor.calibration", "w", name_flag=False)) == f"{scenario_file}: executor.calibration: w"


def test_which_errors_are_relocated(scenario_file):
    src = str(scenario_file)
    assert _scenario_key("executor.device", src) == "executor.device"
    assert _scenario_key(f"{src}: kv_cache", src) == "kv_cache"
    assert _scenario_key(f"{src}: cluster.decode", src) == "cluster.decode"
    assert _scenario_key("executor", src) is None          # a bare section: a run's failure, not a key's
    assert _scenario_key("engine", src) is None            # not a scenario key
    assert _scenario_key("--slo", src) is None
    assert _scenario_key("other.yaml: kv_cache", src) is None
    scn = load_scenario(scenario_file)
    with pytest.raises(KvsimError) as e, located_errors(scn):
        raise KvsimError(f"{src}: kv_cache", "no room")
    assert str(e.value) == f"{src}:3: kv_cache: no room"
    with pytest.raises(KvsimError) as e, located_errors(scn):
        raise KvsimError("engine", "livelock")
    assert str(e.value) == "engine: livelock"
