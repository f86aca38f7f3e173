"""Calibrations of GPUs without measurements of their own (H200, A100 40GB): derived from the measured GPU
on the same chip, read as its calibration, priced against the GPU's own bandwidth; a scenario on them gets
them by default and says so; bad derived files are clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.errors import KvsimError
from sim.executors.cost_model import load_calibration, make_cost_model_executor, shipped_calibration
from sim.executors.roofline import DEFAULT_NUM_SMS, gemm_time_scalar
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import HARDWARE_PRESETS, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
DERIVED = {"h200-141gb": "h100-80gb", "a100-40gb": "a100-80gb"}


@pytest.mark.parametrize("target", sorted(DERIVED))
def test_a_derived_calibration_is_its_source_on_the_same_chip(target):
    source = DERIVED[target]
    doc = json.loads(shipped_calibration(target).read_text())
    assert doc["derived_from"] == source and "params" not in doc
    t, s = HARDWARE_PRESETS[target], HARDWARE_PRESETS[source]   # the same chip: only the memory differs
    assert (t.peak_flops, t.peak_flops_fp8, t.interconnect_bandwidth) == (s.peak_flops, s.peak_flops_fp8,
                                                                         s.interconnect_bandwidth)
    assert DEFAULT_NUM_SMS[target] == DEFAULT_NUM_SMS[source]
    params, read = load_calibration(target)
    src_params, src_doc = load_calibration(source)
    assert params.to_dict() == src_params.to_dict() and read["engine"] == src_doc["engine"]
    assert (read["hardware"], read["derived_from"]) == (target, source)


def test_h200_gemms_run_at_h100_rates_against_h200_bandwidth():
    params, _ = load_calibration("h200-141gb")
    h100, h200 = HARDWARE_PRESETS["h100-80gb"], HARDWARE_PRESETS["h200-141gb"]

    def t(hw, m, n, k):
        return gemm_time_scalar(m, n, k, hw.peak_flops, hw.hbm_bandwidth, 2, params, "mlp_up_proj")

    # a prefill GEMM (4,096 x 8,192 x 28,672: 1.9 PFLOP, arithmetic intensity ~3,000) is compute-bound: the
    # same tensor cores take the same time, within the memory term's share of the smooth max (a few percent)
    big = t(h200, 4096, 28672, 8192) / t(h100, 4096, 28672, 8192)
    assert 0.97 < big <= 1.0
    # a decode GEMV reads the 470 MB weight: at least 470 MB / 4.8 TB/s = 98 us on the H200, and faster
    # than on the H100 by at most the bandwidth ratio 3.35 / 4.8 = 0.698 (its fixed latency does not scale)
    gemv = t(h200, 1, 28672, 8192)
    assert gemv >= 28672 * 8192 * 2 / 4.8e12
    assert 3.35 / 4.8 <= gemv / t(h100, 1, 28672, 8192) < 0.75


def _scenario(hardware: str, **executor) -> dict:
    return {"name": "derived", "model": "llama-3-8b", "hardware": hardware, "frontend": {"enabled": False},
            "output": {"plots": False}, "executor": {"kind": "cost_model", **executor},
            "workload": {"synthetic": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 2.0},
                                       "prompt_len": {"dist": "fixed", "value": 300},
                                       "output_len": {"dist": "fixed", "value": 60}}}}


def test_a_scenario_on_an_h200_gets_the_derived_calibration_by_default():
    h200 = run_scenario(scenario_from_dict(_scenario("h200-141gb"))).summary
    assert h200["step_model"] == {"executor": "cost_model", "calibration": "h200-141gb", "engine_terms": True,
                                  "derived_from": "h100-80gb"}
    h100 = run_scenario(scenario_from_dict(_scenario("h100-80gb"))).summary
    roof = run_scenario(scenario_from_dict(_scenario("h200-141gb", calibration="roofline"))).summary
    # the H200 decodes faster than the H100 (more bandwidth, the same kernels), by at most the bandwidth
    # ratio; the uncalibrated roofline it got before priced it slower than the calibrated H100
    ratio = h200["tpot_s"]["mean"] / h100["tpot_s"]["mean"]
    assert 3.35 / 4.8 < ratio < 1.0
    assert roof["tpot_s"]["mean"] > h100["tpot_s"]["mean"]


def test_a_calibration_made_for_other_hardware_is_named_in_the_summary():
    s = run_scenario(scenario_from_dict(_scenario("h200-141gb", calibration="a100-80gb"))).summary
    assert s["step_model"]["calibration"] == "a100-80gb" and s["step_model"]["calibrated_for"] == "a100-80gb"
    same = run_scenario(scenario_from_dict(_scenario("a100-80gb", calibration="a100-80gb"))).summary
    assert "calibrated_for" not in same["step_model"]


@pytest.mark.parametrize(("doc", "says"), [
    ({"derived_from": "h100-80gb", "params": {}}, "no params of its own"),
    ({"derived_from": "b200"}, "no shipped calibration named 'b200'"),
    ({"derived_from": "h200-141gb"}, "'h200-141gb' is derived itself"),
])
def test_bad_derived_files_are_clear_errors(tmp_path, doc, says):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"format": "kvsim-calibration/1", "hardware": "x", **doc}))
    with pytest.raises(KvsimError, match=says):
        load_calibration(str(path))
    model = ModelSpec.from_name("llama-3-8b")
    with pytest.raises(KvsimError):
        make_cost_model_executor(model=model, hardware=HARDWARE_PRESETS["h100-80gb"],
                                 config=type("C", (), {"calibration": str(path)})())


def test_the_script_refuses_two_different_chips():
    r = subprocess.run([sys.executable, "scripts/derive_calibration.py", "l40s", "--from", "h100-80gb"], cwd=ROOT,
                       capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "not the same chip" in r.stderr
    assert shipped_calibration("l40s") is None   # (it stays on the uncalibrated roofline)


def test_a_new_models_points_over_a_derived_base_make_a_calibration_of_its_own(tmp_path):
    """kvsim calibrate --base h200-141gb: the file it writes holds params (the derived base's, read as the
    H100's, plus the new points) and loads as a calibration of the H200 of its own."""
    from sim.cli import main as cli_main

    raw = __import__("pandas").read_csv(ROOT / "sim/data/vidur/h100_Llama-2-7b-hf_mlp.csv")
    few = tmp_path / "h100_Llama-2-7b-hf_mlp.csv"
    raw[raw.num_tokens.isin([1, 64, 512])].to_csv(few, index=False)
    out = tmp_path / "new.json"
    assert cli_main(["calibrate", "--base", "h200-141gb", "--measurements", str(few), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "derived_from" not in doc and doc["base"] == "h200-141gb" and doc["hardware"] == "h200-141gb"
    params, _ = load_calibration(str(out))
    assert params.gemm_correction["local"]   # the new points, by shape
