"""kvsim's decode steps against public vLLM measurements on H100, fitted to none of them
(scripts/gpustack_benchmark_check.py: GPUStack's performance lab)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[1] / "scripts" / "gpustack_benchmark_check.py"
_spec = importlib.util.spec_from_file_location("gpustack_check", _path)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.mark.parametrize("case", ["gpt-oss-120b, ShareGPT x4", "Qwen3-8B, ShareGPT x4"])
def test_decoding_four_at_a_time_on_one_h100(monkeypatch, case):
    # 100 ShareGPT conversations four at a time on one H100: mean TPOT 8.31 ms (gpt-oss-120b, vLLM 0.10.2) and
    # 7.38 ms (Qwen3-8B, vLLM 0.11.0) measured; kvsim within 11% (7.41 ms, -10.8%, since the GEMM correction's
    # three-part mean; 7.45 ms, -10.4%, after the 2026-12-07 refit of the engine terms; -8.9% before; Qwen3-8B
    # 6.95 ms, -6%)
    model, n, prompt, output, conc, measured = check.CASES[case]
    monkeypatch.setenv("KVSIM_CHECK_INTEGRITY", "0")   # (22,000 steps of one engine: its invariants are fuzzed)
    assert check.predict(model, n, prompt, output, conc, 1)[2] == pytest.approx(measured[1][2], rel=0.11)


_fp8 = importlib.util.spec_from_file_location("fp8_check", _path.parent / "fp8_block_gemm_check.py")
fp8_check = importlib.util.module_from_spec(_fp8)
_fp8.loader.exec_module(fp8_check)


def test_a_deepseek_gemm_in_bf16_on_one_h100():
    # DeepSeek-V3's N = 2,112, K = 7,168 GEMM in bf16 on an H100 (vLLM pull request 23280, torch's GEMM, M = 1 to
    # 8,192): a shape no shipped table holds, priced within 35% at every M (its fp8 block-quantized kernels, which
    # the script also prints, run 2.4-4.5x slower than kvsim prices them: README, What is not built yet)
    bf16 = fp8_check.executor("bf16")
    n, k = fp8_check.N, fp8_check.K
    for m, rate in zip(fp8_check.M, fp8_check.MEASURED["bf16"]):
        measured = 2 * m * n * k / (rate * 1e12)
        assert bf16.gemm_s(m, n, k) == pytest.approx(measured, rel=0.35), m
