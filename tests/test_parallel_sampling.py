"""KV memory saved by parallel sampling against n independent sequences."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim.runner as runner
from sim.scenario import load_scenario, scenario_from_dict

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def _run(scn, monkeypatch):
    made = []
    orig = runner.make_kv_manager
    monkeypatch.setattr(runner, "make_kv_manager", lambda *a, **k: made.append(orig(*a, **k)) or made[-1])
    res = runner.run_scenario(scn)
    return res, made[-1].sharing_summary(scn.model_spec.kv_bytes_per_block(scn.kv_cache.block_size))


def test_saving_of_one_request_by_hand(monkeypatch):
    scn = scenario_from_dict({
        "model": "tiny-llama", "hardware": "cpu", "kv_cache": {"block_size": 16, "num_gpu_blocks": 64, "swap_space_gb": 0},
        "workload": {"requests": [{"arrival": 0.0, "prompt_len": 20, "output_len": 5, "n": 3}]},
        "output": {"plots": False},
    })
    _, sh = _run(scn, monkeypatch)
    # physical / unshared blocks after each of the 5 steps: 2/6 after the prefill (forked: 3 tables
    # sharing blocks 0 and 1), then 4/6 four times (block 0 shared, each sequence with its own block 1)
    assert sh["kv_sharing_saving"] == pytest.approx(1 - (2 + 4 * 4) / (6 + 6 * 4))
    assert sh["kv_bytes_peak"] == 4 * scn.model_spec.kv_bytes_per_block(16)
    assert sh["kv_bytes_unshared_peak"] == 6 * scn.model_spec.kv_bytes_per_block(16)


def test_shipped_scenario_saving_grows_with_n(monkeypatch):
    savings = []
    for n in (2, 4, 6):
        scn = load_scenario(SCENARIOS / "parallel_sampling.yaml",
                            [f"workload.synthetic.n={n}", "workload.synthetic.num_requests=30",
                             "kv_cache.num_gpu_blocks=1500"])
        res, sh = _run(scn, monkeypatch)
        assert res.summary["num_finished"] == 30
        savings.append(sh["kv_sharing_saving"])
    # the prompt (mean 161 tokens) is shared, outputs (mean 338) are not: roughly
    # (n - 1) x 161 / (n x 499), 16% at n = 2 and 27% at n = 6 (the paper: 16.2% to 30.5% on ShareGPT)
    assert savings[0] < savings[1] < savings[2]
    assert 0.08 < savings[0] < 0.3 and 0.15 < savings[2] < 0.45
