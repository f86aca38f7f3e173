"""Issue 14 for ``kvsim calibrate`` and ``kvsim validate``: bad measurement files and output paths exit 2
with one line ``error: <file>:<line>: <what>`` (or ``error: <path>: <what>``), no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.executors.validation import shipped_vidur

HEADER = "model,device,kind,batch_size,num_tokens,context_len,operator,time_ms\n"
GOOD = "tiny-llama,cpu,decode,8,8,64,mlp_up_proj,0.25\n"
VIDUR = shipped_vidur("a100")[0]


def _vidur_with(tmp: Path, row: int, column: str, value: str) -> Path:
    """The first 5 rows of a shipped Vidur table with one cell replaced (row 0 is CSV line 2)."""
    lines = VIDUR.read_text().splitlines()[:6]
    cols = lines[0].split(",")
    cells = lines[row + 1].split(",")
    cells[cols.index(column)] = value
    lines[row + 1] = ",".join(cells)
    path = tmp / "m.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


CASES = {
    # name: (file text or builder, expected "<where>: <what>" fragments)
    "non_numeric_time": (lambda t: _vidur_with(t, 2, "time_stats.mlp_up_proj.median", "fast"),
                         ["m.csv:4:", "column time_stats.mlp_up_proj.median", "'fast' is not a finite number"]),
    "nan_tokens": (lambda t: _vidur_with(t, 0, "num_tokens", "nan"),
                   ["m.csv:2:", "column num_tokens", "missing value"]),
    "empty_cell": (lambda t: _vidur_with(t, 3, "n_embd", ""), ["m.csv:5:", "column n_embd", "missing value"]),
    "inf_profile_time": (HEADER + GOOD + "tiny-llama,cpu,decode,8,8,64,step,inf\n",
                         ["m.csv:3:", "column time_ms", "'inf' is not a finite number"]),
    "blank_line": (HEADER + GOOD + "\n" + GOOD, ["m.csv:3:", "missing value"]),
    "latin1": (HEADER.encode() + GOOD.encode() + "tiny-llama,cpu,d\xe9code,8,8,64,step,1\n".encode("latin-1"),
               ["m.csv:3:", "not UTF-8", "column 17"]),
    "header_only": (HEADER, ["m.csv:2:", "header only"]),
    "empty_file": ("", ["m.csv:1:", "empty file"]),
}


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True)


def _one_line(r: subprocess.CompletedProcess, fragments: list[str]) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def _make(tmp_path: Path, spec) -> Path:
    if callable(spec):
        return spec(tmp_path)
    path = tmp_path / "m.csv"
    if isinstance(spec, bytes):
        path.write_bytes(spec)
    else:
        path.write_text(spec)
    return path


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("command", ["calibrate", "validate"])
def test_bad_measurements_exit_2_with_file_and_line(tmp_path: Path, name: str, command: str):
    spec, fragments = CASES[name]
    path = _make(tmp_path, spec)
    out = tmp_path / "out.json"
    if command == "calibrate":
        args = ["calibrate", "--hardware", "a100-80gb", "--measurements", str(path), "--out", str(out)]
    else:
        args = ["validate", "--calibration", "a100-80gb", "--measurements", str(path), "--plot", str(out)]
    _one_line(_run(args), [str(tmp_path), *fragments])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]  # nothing written


def test_calibrate_out_is_a_directory(tmp_path: Path):
    (tmp_path / "d").mkdir()
    r = _run(["calibrate", "--hardware", "a100-80gb", "--measurements", str(VIDUR), "--out", str(tmp_path / "d")])
    _one_line(r, [f"error: {tmp_path / 'd'}: --out is a directory"])
    assert list((tmp_path / "d").iterdir()) == []


def test_calibrate_from_base_out_is_a_directory(tmp_path: Path):
    r = _run(["calibrate", "--base", "a100-80gb", "--measurements", str(VIDUR), "--out", str(tmp_path)])
    _one_line(r, [f"error: {tmp_path}: --out is a directory"])
    assert list(tmp_path.iterdir()) == []


def test_validate_plot_is_a_directory(tmp_path: Path):
    r = _run(["validate", "--calibration", "a100-80gb", "--measurements", str(VIDUR), "--plot", str(tmp_path)])
    _one_line(r, [f"error: {tmp_path}: --plot is a directory"])


def test_measurements_is_a_directory(tmp_path: Path):
    r = _run(["validate", "--calibration", "a100-80gb", "--measurements", str(tmp_path)])
    _one_line(r, [f"error: {tmp_path}: is a directory"])


def test_loo_without_hardware_and_calibrate_without_hardware(tmp_path: Path):
    _one_line(_run(["validate", "--loo"]), ["error: --hardware: required with --loo"])
    _one_line(_run(["calibrate", "--measurements", str(VIDUR), "--out", str(tmp_path / "c.json")]),
              ["error: --hardware: required"])
    assert list(tmp_path.iterdir()) == []


def test_calibrate_refuses_measurements_taken_on_another_kind_of_device(tmp_path: Path):
    # a CPU profile says nothing of a GPU's kernels (and a GPU table nothing of the CPU's)
    cpu = tmp_path / "cpu.csv"
    cpu.write_text(HEADER + GOOD)
    out = tmp_path / "c.json"
    for hardware in (["--hardware", "h100-80gb"], ["--base", "a100-80gb"]):
        r = _run(["calibrate", *hardware, "--measurements", str(cpu), "--out", str(out)])
        _one_line(r, [f"error: {cpu}: measured on the CPU, not on ", "kvsim profile --device cuda"])
    r = _run(["calibrate", "--hardware", "cpu", "--measurements", str(VIDUR), "--out", str(out)])
    _one_line(r, [f"error: {VIDUR}: measured on device cuda, not on cpu"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.csv"]
    r = _run(["calibrate", "--hardware", "cpu", "--measurements", str(cpu), "--out", str(out)])
    assert r.returncode == 0 and out.is_file(), r.stderr


def test_loo_needs_two_models():
    r = _run(["validate", "--loo", "--hardware", "a100-80gb", "--measurements", str(VIDUR)])
    _one_line(r, ["error: --measurements: leave-one-model-out needs projection rows of at least two models, found 1"])


def _calibration_with(tmp: Path, edit) -> Path:
    """The shipped H100 calibration with ``edit`` applied to its ``params.gemm_correction``."""
    import json

    from sim.executors.cost_model import shipped_calibration

    doc = json.loads(shipped_calibration("h100-80gb").read_text())
    edit(doc["params"]["gemm_correction"])
    path = tmp / "calib.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, what", [
    # 38 features: 5 logs, 3 for each of 7 tiles, 3 row fills, 3 moduli of M, N and K modulo 128, 4 operators
    (lambda c: c["trees"]["feature"][3].__setitem__(0, 99), "trees: tree 3 node 0: feature 99 (of 38)"),
    (lambda c: c["trees"]["features"].reverse(), "trees: their features are not gemm_features.FEATURE_NAMES"),
    (lambda c: c["trees"]["right"][0].__setitem__(0, 10_000), "trees: tree 0 node 0"),
    (lambda c: c["trees"].pop("split"), "'split'"),
    (lambda c: c["curves"][0].pop(), "curves: a curve of 258 points on a grid of 259 token counts"),
])
def test_malformed_correction_exits_2_naming_file_and_key(tmp_path: Path, edit, what: str):
    calib = _calibration_with(tmp_path, edit)
    r = subprocess.run([sys.executable, "-m", "sim.cli", "run", "scenarios/quickstart.yaml", "--set",
                        f"executor.calibration={calib}", "--set", "workload.limit=5", "--no-plots"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f"{calib}: params.gemm_correction:" in r.stderr and what in r.stderr
