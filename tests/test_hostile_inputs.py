"""Hostile inputs beyond tests/bad_inputs: memory bombs, overflowing numbers, odd files. Each ends in exit 2
with one line naming the file, the line (when the input has one) and the key, quickly and without output."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from sim.cli import main as kvsim_main
from sim.limits import MAX_BLOCKS, MAX_REQUESTS, MAX_TOKENS

BASE = {
    "model": "tiny-llama", "hardware": "a100-80gb",
    "kv_cache": {"block_size": 4, "num_gpu_blocks": 32, "swap_space_gb": 0.001},
    "output": {"plots": False},
    "workload": {"synthetic": {"num_requests": 3, "prompt_len": {"dist": "fixed", "value": 8},
                               "output_len": {"dist": "fixed", "value": 4}}},
}


def _run(capsys, *argv: str) -> tuple[int, str]:
    t0 = time.monotonic()
    try:
        code = kvsim_main(list(argv))
    except SystemExit as e:
        code = e.code
    assert time.monotonic() - t0 < 30, "a refusal must come up front, not after a long run"
    err = capsys.readouterr().err
    return code, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scn.yaml"
    path.write_text(text)
    return path


def _line_of(path: Path, fragment: str) -> int:
    return 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if fragment in line)


# (override of BASE in YAML text, the key the error must name, a fragment of the reason)
NUMERIC = [
    ("seed: -1", "seed", "greater than or equal to 0"),
    ("seed: 100000000000000000000", "seed", "less than or equal to"),
    ("kv_cache: {block_size: 4, num_gpu_blocks: 1000000000000}", "kv_cache.num_gpu_blocks", f"{MAX_BLOCKS}"),
    ("kv_cache: {block_size: 4, swap_space_gb: .inf}", "kv_cache.swap_space_gb", "finite"),
    ("kv_cache: {block_size: 4, activation_reserve_gb: 1e300}", "kv_cache.activation_reserve_gb", "less than"),
    ("kv_cache: {block_size: 4, gpu_memory_utilization: .nan}", "kv_cache.gpu_memory_utilization", "finite"),
    ("hardware: {hbm_bytes: 10, hbm_bandwidth: .inf, peak_flops: 1, host_link_bandwidth: 1}",
     "hardware.hbm_bandwidth", "finite"),
]
WORKLOAD = [
    ("{num_requests: 1000000000, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 4}}",
     "workload.synthetic.num_requests", f"{MAX_REQUESTS}"),
    ("{num_requests: 1000000000000000000000000000000, prompt_len: {dist: fixed, value: 8}, "
     "output_len: {dist: fixed, value: 4}}", "workload.synthetic.num_requests", "less than or equal"),
    ("{num_requests: 3, prompt_len: {dist: fixed, value: 100000000000000000000}, output_len: {dist: fixed, value: 4}}",
     "workload.synthetic.prompt_len.value", f"{MAX_TOKENS}"),
    ("{num_requests: 3, arrival: {process: poisson, rate: 5e-324}, prompt_len: {dist: fixed, value: 8}, "
     "output_len: {dist: fixed, value: 4}}", "workload.synthetic.arrival.rate", "greater than or equal"),
    ("{num_requests: 3, arrival: {process: poisson, rate: .inf}, prompt_len: {dist: fixed, value: 8}, "
     "output_len: {dist: fixed, value: 4}}", "workload.synthetic.arrival.rate", "finite"),
]


def _numeric_case_text(head: str) -> str:
    data = dict(BASE)
    key = head.split(":")[0]
    data.pop(key, None)
    return head + "\n" + yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("head, key, reason", NUMERIC, ids=[c[1] + "-" + c[0][-12:] for c in NUMERIC])
def test_numbers_beyond_bounds_name_the_key_and_line(tmp_path, capsys, head, key, reason):
    path = _scenario(tmp_path, _numeric_case_text(head))
    code, err = _run(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {path}:1: {key}: ") and reason in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("synthetic, key, reason", WORKLOAD, ids=[c[1] for c in WORKLOAD])
def test_workload_bounds_name_the_key_and_line(tmp_path, capsys, synthetic, key, reason):
    data = {k: v for k, v in BASE.items() if k != "workload"}
    path = _scenario(tmp_path, yaml.safe_dump(data, sort_keys=False) + f"workload:\n  synthetic: {synthetic}\n")
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {path}:") and f": {key}: " in line and reason in line, line


def test_time_scale_inf_is_refused(tmp_path, capsys):
    path = _scenario(tmp_path, yaml.safe_dump(BASE, sort_keys=False) + "")
    text = path.read_text().replace("workload:\n", "workload:\n  time_scale: .inf\n")
    path.write_text(text)
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and f"{path}:{_line_of(path, 'time_scale')}: workload.time_scale:" in line and "finite" in line


def test_duplicate_key_names_its_second_line(tmp_path, capsys):
    text = yaml.safe_dump(BASE, sort_keys=False) + "model: llama-2-7b\n"
    path = _scenario(tmp_path, text)
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and line == f"error: {path}:{len(text.splitlines())}: model: key given twice in one mapping"


def test_duplicate_nested_key(tmp_path, capsys):
    path = _scenario(tmp_path, "model: tiny-llama\nkv_cache:\n  block_size: 4\n  block_size: 8\nworkload: {}\n")
    code, err = _run(capsys, "run", str(path))
    assert code == 2 and _one_line(err) == f"error: {path}:4: block_size: key given twice in one mapping"


def test_alias_bomb_is_refused_quickly(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    path = _scenario(tmp_path, "\n".join(lines) + "\n")
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and str(path) in line and ("alias" in line)


def test_many_aliases_are_refused(tmp_path, capsys):
    path = _scenario(tmp_path, "a: &a 1\nb: [" + ", ".join(["*a"] * 150) + "]\n")
    code, err = _run(capsys, "run", str(path))
    assert code == 2 and "more than 100 aliases" in _one_line(err)


def test_dev_zero_is_not_read(capsys):
    code, err = _run(capsys, "run", "/dev/zero")
    assert code == 2 and _one_line(err) == (
        "error: /dev/zero: not a regular file (a device, pipe or socket), not a scenario file")


def test_huge_scenario_file_is_refused_before_reading(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB of NUL bytes, no disk used
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {path}: 3,221,225,472 bytes; a scenario file may be at most")


def test_huge_sparse_trace_is_refused_before_reading(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    with trace.open("wb") as f:
        f.truncate(2 << 30)
    data = {k: v for k, v in BASE.items() if k != "workload"}
    data["workload"] = {"trace": "t.csv", "format": "csv"}
    path = _scenario(tmp_path, yaml.safe_dump(data))
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {trace}: the trace is 2,147,483,648 bytes") and len(line) < 300
    code, err = _run(capsys, "trace-info", str(trace))
    assert code == 2 and "the trace is 2,147,483,648 bytes" in _one_line(err)


def test_trace_token_counts_beyond_int64_name_the_row(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_len,output_len\n0,8,4\n1,10000000000000000000,4\n")
    data = {k: v for k, v in BASE.items() if k != "workload"}
    data["workload"] = {"trace": "t.csv", "format": "csv"}
    path = _scenario(tmp_path, yaml.safe_dump(data))
    code, err = _run(capsys, "run", str(path))
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {trace}:3: column prompt_len: token count") and "limit" in line
    code, err = _run(capsys, "trace-info", str(trace))
    assert code == 2 and f"{trace}:3: column prompt_len" in _one_line(err)


def test_set_one_hardware_field_on_a_preset(tmp_path, capsys):
    path = _scenario(tmp_path, yaml.safe_dump(BASE, sort_keys=False))
    code, _ = _run(capsys, "run", str(path), "--set", "hardware.tensor_parallel=2", "--set",
                   "model.num_layers=4")
    assert code == 0
    code, err = _run(capsys, "run", str(path), "--set", "hardware.tensor_parallel=1000")
    assert code == 2 and "hardware.tensor_parallel: Input should be less than or equal to 64 (from --set)" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_not_read(tmp_path, capsys):
    fifo = tmp_path / "scn.yaml"
    os.mkfifo(fifo)
    code, err = _run(capsys, "run", str(fifo))
    assert code == 2 and "not a regular file" in _one_line(err)


@pytest.mark.parametrize("args, fragment", [
    (["--seq-len", "1" + "0" * 30], "--seq-len: must be 1 .. 10,000,000"),
    (["--seq-len", "100", "--block-size", "4096"], "--block-size: must be a power of two from 1 to 1024"),
])
def test_kv_size_bounds(capsys, args, fragment):
    code, err = _run(capsys, "kv-size", "--model", "llama-2-7b", *args)
    assert code == 2 and _one_line(err) == f"error: {fragment}, got {args[-1]}"
