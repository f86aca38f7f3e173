"""Settings that cannot take effect together are refused with one line naming the key and its line, never
silently ignored; output.dir is the default results folder of kvsim run."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.cli import main as kvsim_main

BASE = {
    "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 64, "swap_space_gb": 0.001},
    "scheduler": {"batching": "continuous"},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 4, "prompt_len": {"dist": "fixed", "value": 8},
                               "output_len": {"dist": "fixed", "value": 4}}},
}

CASES = [
    ({"scheduler": {"batching": "static", "policy": "round_robin"}}, "scheduler.policy", "round_robin needs"),
    ({"scheduler": {"batching": "static", "policy": "longest_prefix_first"}}, "scheduler.policy",
     "longest_prefix_first needs"),
    ({"scheduler": {"batching": "static", "chunked_prefill": True}}, "scheduler.chunked_prefill",
     "static batching prefills"),
    ({"scheduler": {"batching": "static"}, "kv_cache": {"block_size": 4, "num_gpu_blocks": 64, "prefix_caching": True}},
     "kv_cache.prefix_caching", "needs scheduler.batching: continuous"),
    ({"kv_cache": {"block_size": 4, "num_gpu_blocks": 64, "prefix_caching": True, "allocator": "contiguous-max"}},
     "kv_cache.prefix_caching", "needs kv_cache.allocator: paged"),
]


@pytest.mark.parametrize("change, key, reason", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_unsupported_combination_names_key_and_line(tmp_path, capsys, change, key, reason):
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}, sort_keys=False, default_flow_style=False))
    leaf = key.split(".")[-1]
    line = 1 + next(i for i, t in enumerate(path.read_text().splitlines()) if t.strip().startswith(f"{leaf}:"))
    code = kvsim_main(["run", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {path}:{line}: {key}: {reason}"), err


def test_combination_from_set_says_so(tmp_path, capsys):
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(BASE))
    code = kvsim_main(["run", str(path), "--set", "scheduler.batching=static", "--set",
                       "scheduler.chunked_prefill=true"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {path}: scheduler.chunked_prefill: ") and err.endswith("(from --set)")


def test_output_dir_is_the_default_out(tmp_path, capsys):
    sub = tmp_path / "scenarios"
    sub.mkdir()
    path = sub / "scn.yaml"
    path.write_text(yaml.safe_dump({**BASE, "output": {"plots": False, "dir": "../results/one"}}))
    assert kvsim_main(["run", str(path)]) == 0
    summary = json.loads((tmp_path / "results" / "one" / "summary.json").read_text())
    assert summary["num_finished"] == 4
    assert kvsim_main(["run", str(path), "--out", str(tmp_path / "other")]) == 0  # --out wins
    assert (tmp_path / "other" / "summary.json").exists()
