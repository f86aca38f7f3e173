"""scripts/gpu_check.sh in its CPU mode (quick), so the device check does not rot."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("KVSIM_IN_GPU_CHECK") == "1",
    reason="the full GPU check is run by hand on a GPU machine (and must not run itself)",
)


def test_gpu_check_cpu_mode(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stdout
    steps = dict(line.split()[:2] for line in (out / "steps.txt").read_text().splitlines())
    assert steps == {"attention_bench": "0", "profile": "0"}
    bench = list(csv.DictReader((out / "attention_bench.csv").open()))
    assert {r["kind"] for r in bench} == {"decode", "prefill"}
    assert all(float(r["max_err"]) < 1e-4 for r in bench)
    assert len((out / "profile_tiny-llama.csv").read_text().splitlines()) == 1 + 2 * 6
