"""Calibration: the formulas by hand, the fitter on synthetic data with known answers, the file formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.errors import KvsimError
from sim.executors.calibrate import fit_baseline, mape, predict
from sim.executors.cost_model import load_calibration, make_cost_model_executor
from sim.executors.fit import nelder_mead
from sim.executors.measurements import read_measurements
from sim.executors.roofline import CostParams, allreduce_time, gemm_time, gemm_time_scalar
from sim.scenario import ExecutorConfig
from sim.specs import HardwareSpec, ModelSpec


def test_nelder_mead_finds_a_quadratic_minimum():
    x, fx = nelder_mead(lambda v: float((v[0] - 3) ** 2 + 2 * (v[1] + 1) ** 2), np.zeros(2), iters=500)
    assert x == pytest.approx([3, -1], abs=1e-3) and fx < 1e-6


def test_tile_and_wave_quantization_by_hand():
    # one SM, one 128x128 tile shape at efficiency 1, no memory term: M=129 rows need 2 row tiles,
    # N=130 columns 2 column tiles -> 4 tiles -> 4 waves of 2 x 128 x 128 x K FLOPs.
    p = CostParams(tiles=[[128, 128, 1.0]], num_sms=1, memory_eff=1e9, kernel_latency_s=0.0)
    t = gemm_time(129, 130, 10, peak=1e6, bandwidth=1.0, dtype_bytes=2, params=p)
    assert t == pytest.approx(4 * 2 * 128 * 128 * 10 / 1e6)
    # peak is the whole chip's: with 3 SMs the 4 tiles take 2 waves, which issue the work of 6 tiles
    p.num_sms = 3
    assert gemm_time(129, 130, 10, 1e6, 1.0, 2, p) == pytest.approx(6 * 2 * 128 * 128 * 10 / 1e6)  # 1.966 s
    # a 64x64 tile at half efficiency: 3 x 3 = 9 tiles = 3 full waves: 9 x 2 x 64 x 64 x 10 / (1e6 x 0.5)
    p.tiles = [[128, 128, 1.0], [64, 64, 0.5]]
    assert gemm_time(129, 130, 10, 1e6, 1.0, 2, p) == pytest.approx(1.47456)  # the faster tile wins


def test_partial_wave_cost():
    # 4 tiles on 3 SMs: 1 full wave and a partial one (1/3 full). wave_quant q prices the partial wave at
    # q x a full wave + (1 - q) x its real share: waves = q x 2 + (1 - q) x 4/3
    p = CostParams(tiles=[[128, 128, 1.0]], num_sms=3, memory_eff=1e9, kernel_latency_s=0.0)
    one_wave = 3 * 2 * 128 * 128 * 10 / 1e6
    for q, waves in [(1.0, 2.0), (0.0, 4 / 3), (0.25, 0.25 * 2 + 0.75 * 4 / 3)]:
        p.wave_quant = q
        assert gemm_time(129, 130, 10, 1e6, 1.0, 2, p) == pytest.approx(waves * one_wave)
        assert gemm_time_scalar(129, 130, 10, 1e6, 1.0, 2, p) == pytest.approx(waves * one_wave)
    # fewer tiles than SMs: split-K, whatever q
    p.num_sms, p.wave_quant = 8, 1.0
    assert gemm_time(129, 130, 10, 1e6, 1.0, 2, p) == pytest.approx(4 / 8 * 8 * 2 * 128 * 128 * 10 / 1e6)


def test_allreduce_ring_and_table():
    p = CostParams(allreduce_eff=1.0)
    # ring over 4 GPUs: 2 x 3/4 x 1e6 bytes / 1e11 B/s + 6 hops x 1 us
    assert allreduce_time(1e6, 4, 1e11, 1e-6, p) == pytest.approx(1.5e6 / 1e11 + 6e-6)
    assert allreduce_time(1e6, 1, 1e11, 1e-6, p) == 0.0
    p.allreduce_table = {"4": [[1000.0, 1e-5], [3000.0, 3e-5]]}
    assert allreduce_time(2000.0, 4, 1e11, 1e-6, p) == pytest.approx(2e-5)   # interpolated
    assert allreduce_time(6000.0, 4, 1e11, 1e-6, p) == pytest.approx(6e-5)   # extrapolated at the last bandwidth


def _synthetic_vidur(path: Path, ce: float, me: float, lat: float) -> None:
    """A Vidur-format table whose projection times follow the plain roofline with known parameters."""
    hw = HardwareSpec.from_name("a100-80gb")
    toks = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    h, inter, heads = 4096, 11008, 32
    cols: dict[str, object] = {"n_head": heads, "n_kv_head": heads, "n_embd": h, "n_expanded_embd": inter,
                               "vocab_size": 32000, "use_gated_mlp": True, "num_tokens": toks,
                               "num_tensor_parallel_workers": 1}
    for op, k, n in [("attn_pre_proj", h, 3 * h), ("attn_post_proj", h, h), ("mlp_up_proj", h, 2 * inter),
                     ("mlp_down_proj", inter, h)]:
        t = np.maximum(2 * toks * n * k / (hw.peak_flops * ce), 2 * (k * n + toks * k + toks * n)
                       / (hw.hbm_bandwidth * me)) + lat
        cols[f"time_stats.{op}.median"] = t * 1e3  # ms
    pd.DataFrame(cols).to_csv(path, index=False)


def test_baseline_fit_recovers_known_parameters(tmp_path: Path):
    path = tmp_path / "a100_Fake-7b_mlp.csv"
    _synthetic_vidur(path, ce=0.62, me=0.81, lat=7e-6)
    df = read_measurements([path])
    assert set(df.operator) == {"attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"}
    p = fit_baseline(df, HardwareSpec.from_name("a100-80gb"))
    assert p.compute_eff == pytest.approx(0.62, rel=0.02)
    assert p.memory_eff == pytest.approx(0.81, rel=0.02)
    assert p.kernel_latency_s == pytest.approx(7e-6, rel=0.1)
    assert mape(predict(df, HardwareSpec.from_name("a100-80gb"), p), df.time_s.to_numpy()) < 0.005


def test_profile_csv_format_and_bad_files(tmp_path: Path):
    good = tmp_path / "p.csv"
    good.write_text("model,device,kind,batch_size,num_tokens,context_len,operator,time_ms\n"
                    "tiny-llama,cpu,decode,8,8,64,mlp_up_proj,0.25\n"
                    "tiny-llama,cpu,decode,8,8,64,step,3.5\n")
    df = read_measurements([good])
    assert list(df.operator) == ["mlp_up_proj", "step"] and df.time_s.iloc[1] == pytest.approx(3.5e-3)
    assert df.hidden.iloc[0] == 256 and df.inter.iloc[0] == 512
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(KvsimError, match="unrecognised columns"):
        read_measurements([bad])
    unknown = tmp_path / "u.csv"
    unknown.write_text(good.read_text().replace("tiny-llama", "no-such-model"))
    with pytest.raises(KvsimError, match="no-such-model"):
        read_measurements([unknown])


def test_calibration_files_by_path_and_by_name(tmp_path: Path):
    params, doc = load_calibration("a100-80gb")  # shipped
    assert doc["hardware"] == "a100-80gb" and params.tiles
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.json").write_text(json.dumps({"params": {"step_overhead_s": 0.001}}))
    p, _ = load_calibration("sub/c.json", base_dir=tmp_path)
    assert p.step_overhead_s == 0.001
    with pytest.raises(KvsimError, match="no calibration file"):
        load_calibration("nope.json", base_dir=tmp_path)
    exe = make_cost_model_executor(model=ModelSpec.from_name("llama-2-7b"), hardware=HardwareSpec.from_name("a100-80gb"),
                                   config=ExecutorConfig(calibration="sub/c.json", step_overhead_s=0.004),
                                   kv=None, num_gpu_blocks=1, num_cpu_blocks=0, base_dir=tmp_path)
    assert exe.params.step_overhead_s == 0.004  # the scenario's explicit overhead wins


def test_scalar_gemm_matches_vectorised():
    params, _ = load_calibration("h100-80gb")
    m = np.array([1, 7, 64, 65, 129, 500, 4096])
    for p in (params, CostParams(), CostParams(smooth_p=2.0)):
        vec = gemm_time(m, 3072, 4096, 989e12, 3.35e12, 2, p)
        assert [gemm_time_scalar(int(x), 3072, 4096, 989e12, 3.35e12, 2, p) for x in m] == pytest.approx(vec)
