"""Weight-only quantization (``model.weight_dtype``: AWQ, GPTQ, Marlin) and quantized Hugging Face configs:
the weights' bytes and the KV capacity they leave by hand, GEMMs priced on the bytes they read, the configs
read as vLLM serves them, and what kvsim refuses."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from result_compare import assert_same, off_and_on

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.roofline import CostParams, grouped_gemm_time_scalar
from sim.hf_config import spec_from_hf_config
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import GiB, HardwareSpec, ModelSpec, kv_capacity_blocks

ROOT = Path(__file__).resolve().parents[1]
IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0,
             allreduce_eff=1.0)
H100 = HardwareSpec.from_name("h100-80gb")
L7 = ModelSpec.from_name("llama-2-7b")
L7_INT4 = ModelSpec(**{**L7.model_dump(), "weight_dtype": "int4"})
# Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf) with TheBloke/Llama-2-7B-AWQ's quantization_config
LLAMA_2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 32, "max_position_embeddings": 4096, "vocab_size": 32000,
              "tie_word_embeddings": False, "torch_dtype": "float16"}
AWQ = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm"}

# One Llama-2-7B layer's projections (K x N): QKV 4096 x 12288 = 50,331,648, output 4096 x 4096 = 16,777,216,
# gate and up 4096 x 22016 = 90,177,536, down 11008 x 4096 = 45,088,768: 202,375,168 weights.
# In int4: 101,187,584 bytes; scales, one fp16 per 128 rows of K a column: 32 x 12288 + 32 x 4096 + 32 x 22016
# + 86 x 4096 = 1,581,056 scales, 3,162,112 bytes. 32 layers: 3,339,190,272 bytes.
# The rest in fp16: embeddings and LM head 2 x 32000 x 4096, two norms of 4096 a layer, the final norm:
# 262,410,240 weights, 524,820,480 bytes.
L7_INT4_BYTES = 3_339_190_272 + 524_820_480


def test_int4_weights_and_their_scales_by_hand():
    assert L7_INT4.weight_bytes() == L7_INT4_BYTES == 3_864_010_752
    assert L7.weight_bytes() == 2 * 6_738_415_616   # fp16: every weight 2 bytes (6.74 B parameters)
    # int8, one scale a column (GPTQ group_size -1): 6,476,005,376 bytes + 2 x (12288 + 4096 + 22016 + 4096) x 32
    int8 = ModelSpec(**{**L7.model_dump(), "weight_dtype": "int8", "weight_group_size": 0})
    assert int8.weight_bytes() == 6_476_005_376 + 2_719_744 + 524_820_480
    # Mixtral-8x7B: every expert's weights are quantized, the router (4096 x 8) is not. A layer: QKV 4096 x
    # 6144 and output 4096 x 4096, 8 experts of gate and up 4096 x 28672 and down 14336 x 4096:
    # 1,451,229,184 weights, 725,614,592 bytes in int4; scales 32 x 6144 + 32 x 4096 + 8 x 32 x 28672
    # + 8 x 112 x 4096 = 11,337,728, 22,675,456 bytes. The rest in fp16: (4096 x 8 + 2 x 4096) x 32
    # + 2 x 32000 x 4096 + 4096 = 263,458,816 weights.
    mix = ModelSpec(**{**ModelSpec.from_name("mixtral-8x7b").model_dump(), "weight_dtype": "int4"})
    assert mix.weight_bytes() == 32 * (725_614_592 + 22_675_456) + 2 * 263_458_816


def test_w8a8_projections_in_8_bits_the_rest_and_the_activations_in_16():
    """fp8 or int8 weights and activations (``dtype``: Llama-2-7B-FP8, -quantized.w8a8): the projections take a
    byte a weight; the embeddings, LM head and norms stay bf16 in the checkpoint (262,410,240 weights, 2 bytes);
    the activations between the GEMMs are bf16 too (vLLM's W8A8 GEMMs return it), so a step's all-reduces,
    elementwise kernels and LM head cost what the fp16 model's do, and only its projections change."""
    for dtype in ("fp8", "int8"):
        w8a8 = ModelSpec(**{**L7.model_dump(), "dtype": dtype, "kv_dtype": "fp16"})
        assert w8a8.weight_bytes() == 32 * 202_375_168 + 524_820_480
    tp4 = H100.model_copy(update={"tensor_parallel": 4})
    fp16 = CostModelExecutor(L7, tp4, CostParams(**IDEAL))
    fp8 = CostModelExecutor(ModelSpec(**{**L7.model_dump(), "dtype": "fp8", "kv_dtype": "fp16"}), tp4, CostParams(**IDEAL))
    for tokens in (1, 4096):
        assert fp8._linear(tokens)[1] == fp16._linear(tokens)[1]   # all-reduces: 4096 x 2 bytes a token
        assert fp8._linear(tokens)[0] < fp16._linear(tokens)[0]    # (the projections: fp8 bytes and rate)
    assert fp8._elem_s_per_token == fp16._elem_s_per_token and fp8._lm_head(8) == fp16._lm_head(8)


def test_the_cache_gets_the_memory_the_weights_no_longer_take():
    # H100: 80 GiB x 0.9 usable, 5% of it reserved for activations; 16-token blocks of 2 x 32 x 32 x 128 x 2 x 16
    # = 8,388,608 bytes: (77,309,411,328 x 0.95 - weights) / 8,388,608
    assert kv_capacity_blocks(L7_INT4, H100, 16) == 8294   # (73,443,940,761.6 - 3,864,010,752) / 8,388,608
    assert kv_capacity_blocks(L7, H100, 16) == 7148        # (73,443,940,761.6 - 13,476,831,232) / 8,388,608
    assert 80 * GiB * 0.9 == 77_309_411_328


def test_a_decode_gemm_reads_the_quantized_weights_and_a_large_one_computes_at_the_fp16_rate():
    ideal = CostParams(**IDEAL)
    exe = CostModelExecutor(L7_INT4, H100, ideal)
    # one token: memory-bound; the weights and scales (3,339,190,272 / 32 = 104,349,696 bytes a layer) plus the
    # fp16 activations in and out, 2 x (4096 + 12288 + 4096 + 4096 + 4096 + 22016 + 11008 + 4096) = 131,584
    assert exe.layer_linear_time(1) == pytest.approx((104_349_696 + 131_584) / 3.35e12, rel=1e-3)
    # fp16: 2 x 202,375,168 + 131,584 bytes, about 3.9x the time
    assert CostModelExecutor(L7, H100, ideal).layer_linear_time(1) == pytest.approx(
        (2 * 202_375_168 + 131_584) / 3.35e12, rel=1e-3)
    # 8,192 tokens: compute-bound, dequantized to fp16 and multiplied at its rate (989 TFLOP/s), not at fp8's
    assert exe.layer_linear_time(8192) == pytest.approx(2 * 8192 * 202_375_168 / 989e12, rel=1e-9)
    # the LM head is not quantized: the same time as the fp16 model's
    assert exe._lm_head(4) == CostModelExecutor(L7, H100, ideal)._lm_head(4)


def test_a_quantized_expert_launch_reads_each_active_experts_narrow_weights():
    # two experts' gate and up (4096 x 28672) for one token each: 2 x (0.515625 x 4096 x 28672 + 2 x (4096 + 28672))
    # bytes at 3.35 TB/s (int4, one 2-byte scale per 128 weights: 0.5 + 2 / 128 bytes a weight)
    t = grouped_gemm_time_scalar(2, 1, 28672, 4096, 989e12, 3.35e12, 2, CostParams(**IDEAL), weight_bytes=0.515625)
    assert t == pytest.approx(2 * (0.515625 * 4096 * 28672 + 2 * (4096 + 28672)) / 3.35e12, rel=1e-9)


@pytest.mark.parametrize("quant, fields", [
    (AWQ, {"weight_dtype": "int4", "weight_group_size": 128, "dtype": "fp16", "kv_dtype": None}),
    # TheBloke/Llama-2-7B-GPTQ, and an int8 GPTQ with one scale a column
    ({"bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "sym": True, "quant_method": "gptq"},
     {"weight_dtype": "int4", "weight_group_size": 128}),
    ({"bits": 8, "group_size": -1, "quant_method": "gptq"}, {"weight_dtype": "int8", "weight_group_size": 0}),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True}, {"weight_dtype": "int4",
                                                                               "weight_group_size": 64}),
    # Qwen3-8B-FP8 style: fp8 weights and dynamically quantized fp8 activations; vLLM's KV stays bf16
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
     {"dtype": "fp8", "kv_dtype": "fp16", "weight_dtype": None}),
    # llm-compressor checkpoints: w4a16 (int4 weights alone), FP8 dynamic with an fp8 KV cache, w8a8 int8
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None,
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}},
     {"weight_dtype": "int4", "weight_group_size": 128}),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "input_activations": {"dynamic": True, "num_bits": 8, "type": "float", "strategy": "token"},
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}},
     {"dtype": "fp8", "kv_dtype": "fp8", "weight_dtype": None}),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "input_activations": {"num_bits": 8, "type": "int", "dynamic": True},
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}},
     {"dtype": "int8", "kv_dtype": "fp16"}),
])
def test_quantized_configs_are_read_as_vllm_serves_them(quant, fields):
    spec = spec_from_hf_config({**LLAMA_2_7B, "quantization_config": quant}, "q")
    assert {k: getattr(spec, k) for k in fields} == fields


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method: 'bitsandbytes' is not modelled"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits: 3-bit weights are not modelled"),
    ({"quant_method": "awq", "bits": 4, "group_size": "x"}, "group_size: expected a positive integer"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {   # NVFP4
        "weights": {"num_bits": 4, "type": "float", "group_size": 16},
        "input_activations": {"num_bits": 4, "type": "float"}}}}, "4-bit float weights"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}},
        "group_1": {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}}, "different schemes"),
    ("awq", "quantization_config: expected a mapping"),
])
def test_quantizations_kvsim_does_not_model_are_refused_naming_the_key(quant, message):
    with pytest.raises(ValueError, match=message):
        spec_from_hf_config({**LLAMA_2_7B, "quantization_config": quant}, "q")


@pytest.mark.parametrize("fields, message", [
    ({"weight_dtype": "int3"}, "weight_dtype must be one of"),
    ({"dtype": "fp8", "weight_dtype": "fp8"}, "not narrower than dtype fp8"),
    ({"weight_group_size": -1}, "weight_group_size"),
])
def test_bad_weight_settings_are_refused(fields, message):
    with pytest.raises(KvsimError, match=message):
        scenario_from_dict({"model": {**L7.model_dump(), **fields},
                            "workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}})


def test_the_gpu_backend_refuses_quantized_weights():
    from backend.executor import make_gpu_executor

    with pytest.raises(KvsimError, match="model.weight_dtype"):
        make_gpu_executor(model=L7_INT4, hardware=H100, config=None, kv=None, num_gpu_blocks=1, num_cpu_blocks=0)


def _kvsim(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True, text=True)


def test_an_awq_config_runs_with_the_cache_and_the_decode_speed_of_its_int4_weights(tmp_path):
    for name, cfg in (("awq", {**LLAMA_2_7B, "quantization_config": AWQ}), ("fp16", LLAMA_2_7B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    light = ("hardware: h100-80gb\nworkload: {synthetic: {num_requests: 40, arrival: {process: poisson, rate: 2.0},\n"
             "  prompt_len: {dist: fixed, value: 300}, output_len: {dist: fixed, value: 64}}}\n")
    tpot = {}
    for name in ("awq", "fp16"):
        (tmp_path / f"{name}.yaml").write_text(f"model: {name}/config.json\n" + light)
        r = _kvsim("run", str(tmp_path / f"{name}.yaml"), "--no-plots", "--out", str(tmp_path / f"out_{name}"))
        assert r.returncode == 0, r.stderr
        summary = json.loads((tmp_path / f"out_{name}" / "summary.json").read_text())
        assert summary["num_finished"] == 40
        tpot[name] = summary["tpot_s"]["mean"]
        assert summary["num_gpu_blocks"] == {"awq": 8294, "fp16": 7148}[name]   # by hand, above
    # at light load a decode step is mostly the weights' read: a quarter of the bytes, well under the fp16 time
    assert tpot["awq"] < 0.75 * tpot["fp16"]
    bnb = tmp_path / "bnb.json"
    bnb.write_text(json.dumps({**LLAMA_2_7B, "quantization_config": {"quant_method": "bitsandbytes"}}))
    r = _kvsim("run", "scenarios/quickstart.yaml", "--set", f"model={bnb}", "--no-plots")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and str(bnb) in lines[0] and "bitsandbytes" in lines[0]


@pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")
def test_a_quantized_model_runs_the_same_in_the_core_and_the_simpy_loop(monkeypatch):
    data = {"model": {**L7.model_dump(), "weight_dtype": "int4"}, "hardware": "h100-80gb",
            "kv_cache": {"num_gpu_blocks": 300}, "scheduler": {"max_num_seqs": 32, "chunked_prefill": True},
            "workload": {"synthetic": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 40.0},
                                       "prompt_len": {"dist": "uniform", "min": 20, "max": 900},
                                       "output_len": {"dist": "uniform", "min": 1, "max": 300}}},
            "output": {"plots": False}}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled", lambda: run_scenario(
        scenario_from_dict(copy.deepcopy(data), source="<test>"), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_preemptions"] > 0


@pytest.mark.parametrize("model_id, name, fields", [
    ("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", "llama-3.1-8b-int4", {"weight_dtype": "int4"}),
    ("TheBloke/Llama-2-7B-AWQ", "llama-2-7b-int4", {"weight_dtype": "int4", "weight_group_size": 128}),
    ("TheBloke/Llama-2-7B-GPTQ", "llama-2-7b-int4", {"weight_dtype": "int4"}),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "qwen2.5-7b-int8", {"weight_dtype": "int8"}),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "llama-3.1-8b-int4", {"weight_dtype": "int4"}),
    ("Qwen/Qwen3-8B-FP8", "qwen3-8b-fp8", {"dtype": "fp8", "kv_dtype": "fp16", "weight_dtype": None}),
    ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "llama-3.3-70b-fp8", {"dtype": "fp8", "kv_dtype": "fp16"}),
    ("neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8", "llama-3.1-70b-w8a8", {"dtype": "int8"}),
])
def test_runs_files_name_quantized_checkpoints_as_the_hub_does(model_id, name, fields):
    from sim.fidelity.runs import quantized_model

    spec = quantized_model(model_id)
    assert spec.name == name and {k: getattr(spec, k) for k in fields} == fields
    assert spec.num_layers == ModelSpec.from_name(name.rsplit("-", 1)[0]).num_layers
    assert quantized_model("acme/Giant-9000-AWQ") is None and quantized_model("meta-llama/Llama-2-7b-hf") is None


def test_a_measured_run_of_a_quantized_checkpoint_is_replayed_quantized_unless_its_config_is_given(tmp_path):
    from sim.fidelity.runs import read_runs

    runs = tmp_path / "runs.csv"
    runs.write_text((ROOT / "sim/data/ground_truth/vllm_h100_runs.csv").read_text().replace(
        "meta-llama/Llama-2-7b-hf", "TheBloke/Llama-2-7B-AWQ"))
    seven = [s for s in read_runs(runs) if s.run.startswith("llama-2-7b")]
    assert len(seven) == 2 and all(s.model_spec == L7_INT4.model_copy(update={"name": "llama-2-7b-int4"})
                                   for s in seven)
    given = ModelSpec(**{**L7.model_dump(), "weight_dtype": "int8", "name": "mine"})
    assert all(s.model_spec == given for s in read_runs(runs, models={"thebloke/llama-2-7b-awq": given})
               if s.run.startswith("llama-2-7b"))
