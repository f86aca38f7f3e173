"""Determinism: the same scenario and seed give byte-identical summary.json (apart from wall_time_s),
and the same requests.csv and steps.parquet, in separate processes with different hash seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False}}
SCENARIOS = {
    # poisson arrivals, shared prefixes with prefix caching, chunked prefill, a cache small enough to preempt
    "poisson_prefix": {**TINY, "seed": 11,
                       "kv_cache": {"block_size": 4, "num_gpu_blocks": 40, "prefix_caching": True,
                                    "swap_space_gb": 0.001},
                       "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 64},
                       "workload": {"synthetic": {
                           "num_requests": 60, "arrival": {"process": "poisson", "rate": 40.0},
                           "prompt_len": {"dist": "lognormal", "mean": 40, "std": 20, "min": 4, "max": 120},
                           "output_len": {"dist": "uniform", "min": 1, "max": 40},
                           "shared_prefix": {"groups": 3, "length": 16}}}},
    # gamma arrivals, priorities, swap preemption, parallel samples
    "gamma_priority_swap": {**TINY, "seed": 12,
                            "kv_cache": {"block_size": 8, "num_gpu_blocks": 12, "swap_space_gb": 0.01},
                            "scheduler": {"policy": "priority", "preemption": "swap"},
                            "workload": {"synthetic": {
                                "num_requests": 40, "arrival": {"process": "gamma", "rate": 30.0, "cv": 2.0},
                                "prompt_len": {"dist": "uniform", "min": 4, "max": 60},
                                "output_len": {"dist": "zipf", "a": 1.5, "min": 1, "max": 50},
                                "n": 2, "priority": {"dist": "uniform", "min": 0, "max": 3}}}},
    # a real trace through the quickstart model
    "azure_trace": {"seed": 0, "model": "llama-2-13b", "hardware": "a100-80gb", "output": {"plots": False},
                    "workload": {"trace": str(ROOT / "scenarios/traces/azure_llm_2023_conv.csv"), "format": "azure",
                                 "limit": 200}},
    # round robin over inline requests
    "round_robin_inline": {**TINY, "seed": 3, "kv_cache": {"block_size": 4, "num_gpu_blocks": 20},
                           "scheduler": {"policy": "round_robin", "rr_quantum_steps": 2},
                           "workload": {"requests": [{"arrival": 0.001 * i, "prompt_len": 5 + 3 * i,
                                                      "output_len": 30 - i} for i in range(8)]}},
}

DRIVER = """
import sys
from sim.cli import main
for scn, out in zip(sys.argv[1::2], sys.argv[2::2]):
    assert main(["run", scn, "--out", out, "--no-plots"]) == 0
"""


def _run_all(tmp_path: Path, tag: str, hash_seed: str) -> dict[str, Path]:
    args, outs = [], {}
    for name, data in SCENARIOS.items():
        scn = tmp_path / f"{name}.yaml"
        scn.write_text(yaml.safe_dump(data))
        outs[name] = tmp_path / f"{name}-{tag}"
        args += [str(scn), str(outs[name])]
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, KVSIM_CHECK_INTEGRITY="1")
    r = subprocess.run([sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, env=env, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return outs


def _without_wall_time(text: str) -> str:
    lines = text.splitlines(keepends=True)
    kept = [ln for ln in lines if '"wall_time_s"' not in ln]
    assert len(kept) == len(lines) - 1
    return "".join(kept)


def test_same_seed_gives_byte_identical_results_across_processes(tmp_path):
    a = _run_all(tmp_path, "a", "1")
    b = _run_all(tmp_path, "b", "2")
    for name in SCENARIOS:
        sa, sb = (a[name] / "summary.json").read_text(), (b[name] / "summary.json").read_text()
        assert _without_wall_time(sa) == _without_wall_time(sb), name
        for table in ("requests.csv", "steps.parquet"):
            assert (a[name] / table).read_bytes() == (b[name] / table).read_bytes(), f"{name}: {table}"


def test_a_different_seed_changes_a_synthetic_run():
    from sim.runner import run_scenario
    from sim.scenario import scenario_from_dict

    data = SCENARIOS["poisson_prefix"]
    one = run_scenario(scenario_from_dict(data), check_integrity=True).summary
    two = run_scenario(scenario_from_dict({**data, "seed": 99}), check_integrity=True).summary
    assert one["makespan_s"] != two["makespan_s"]
