"""Presets read without pydantic (the GPU box) equal the simulator's own."""

import pytest

from backend.shapes import ModelShape, _presets_from_source, hardware_for_device


def test_presets_from_source_match_sim_specs():
    specs = pytest.importorskip("sim.specs")
    models, hardware = _presets_from_source()
    assert set(models) == set(specs.MODEL_PRESETS) and set(hardware) == set(specs.HARDWARE_PRESETS)
    for name, spec in specs.MODEL_PRESETS.items():
        assert ModelShape.of(models[name]) == ModelShape.of(spec)
    for name, hw in specs.HARDWARE_PRESETS.items():
        assert hardware[name].hbm_bandwidth == hw.hbm_bandwidth and hardware[name].peak_flops == hw.peak_flops


def test_llama3_8b_shape_and_device_guess():
    models, _ = _presets_from_source()
    s = ModelShape.of(models["llama-3-8b"])
    assert (s.num_heads, s.num_kv_heads, s.head_dim, s.q_size, s.kv_size) == (32, 8, 128, 4096, 1024)
    assert hardware_for_device("NVIDIA H200")[0] == "h200-141gb"
    assert hardware_for_device("NVIDIA H100 80GB HBM3")[0] == "h100-80gb"
    assert hardware_for_device("NVIDIA A100-SXM4-40GB")[0] == "a100-40gb"
    assert hardware_for_device("Some Future GPU") is None
