"""The Triton kernels compile for sm_90 (no GPU needed) and load K/V with 16-byte vectors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch", [90])  # sm_80 passes too (python -m backend.aot_check --arch 80)
def test_kernels_compile_for_gpu_and_vectorize(arch):
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no ahead-of-time compile API")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "backend.aot_check", "--arch", str(arch)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"sm_{arch}")]
    assert len(lines) == 6
    for name in ("_decode_split_kernel", "_prefill_kernel"):
        assert all("16-byte loads=0 " not in ln for ln in lines if name in ln)
