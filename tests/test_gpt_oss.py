"""gpt-oss: MXFP4 experts beside bf16 attention (``weight_scope: experts``), the presets against the model card
and its config, the experts' bytes in a decode by hand, and a run on one H100 with its window pages."""

from __future__ import annotations

import pytest

from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.roofline import CostParams
from sim.hf_config import spec_from_hf_config
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.specs import HardwareSpec, ModelSpec

H100 = HardwareSpec.from_name("h100-80gb")
IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0)
# openai/gpt-oss-20b config.json (the keys that matter)
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
               "intermediate_size": 2880, "num_attention_heads": 64, "num_hidden_layers": 24,
               "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
               "sliding_window": 128, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "layer_types": ["sliding_attention", "full_attention"] * 12,
               "quantization_config": {"quant_method": "mxfp4",
                                       "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"]}}


def test_presets_against_the_card():
    # 20b: per layer QKV 2,880 x (4,096 + 2 x 512), output 4,096 x 2,880, 32 experts of 3 x 2,880 x 2,880, the
    # router and two norms; embeddings untied
    layer = 2880 * 5120 + 4096 * 2880 + 32 * 3 * 2880 * 2880 + 2880 * 32 + 2 * 2880
    small = ModelSpec.from_name("openai/gpt-oss-20b")
    assert small.num_params() == 24 * layer + 2 * 201088 * 2880 + 2880
    assert small.num_params() == pytest.approx(21e9, rel=0.01)   # "21B parameters"
    big = ModelSpec.from_name("openai/gpt-oss-120b")
    assert big.num_params() == pytest.approx(117e9, rel=0.01)    # "117B"
    # the card's active figures (3.6B, 5.1B) leave out the input embedding (a lookup), which kvsim counts
    for spec, active in ((small, 3.6e9), (big, 5.1e9)):
        assert spec.activated_params() - 201088 * 2880 == pytest.approx(active, rel=0.01)
    assert (small.local_layers, big.local_layers, small.kv_pages()) == (12, 18, (12, 1))


def test_the_config_gives_the_preset():
    spec = spec_from_hf_config(GPT_OSS_20B, "gpt-oss-20b")
    assert spec == ModelSpec.from_name("gpt-oss-20b")
    assert (spec.weight_dtype, spec.weight_group_size, spec.weight_scope, spec.dtype) == ("mxfp4", 32, "experts",
                                                                                        "bf16")


def test_only_the_experts_take_four_bits():
    # the experts: 4 bits an element and one 1-byte exponent a 32 (4.25 bits); everything else in bf16
    spec = ModelSpec.from_name("gpt-oss-120b")
    experts = 36 * 128 * 3 * 2880 * 2880
    assert spec.weight_bytes() == experts // 2 + experts // 32 + (spec.num_params() - experts) * 2
    assert spec.weight_bytes() == pytest.approx(65.2e9, rel=0.005)   # the checkpoint: about 65 GB


def test_a_decode_reads_the_active_experts_in_four_bits():
    # one token: its 4 experts' up (2,880 x 5,760) and down (2,880 x 2,880) weights per layer, at 4.25 bits
    # instead of 16; the attention projections and the router at 16 bits either way (memory bound, ideal)
    quant = ModelSpec.from_name("gpt-oss-20b")
    plain = quant.model_copy(update={"weight_dtype": None, "weight_scope": "all"})
    t = {m.weight_dtype: CostModelExecutor(m, H100, CostParams(**IDEAL)).layer_linear_time(1) for m in (quant, plain)}
    saved = 4 * (2880 * 5760 + 2880 * 2880) * (2 - 4.25 / 8) / 3.35e12
    assert t[None] - t["mxfp4"] == pytest.approx(saved, rel=1e-9)


def test_refusals():
    base = {"workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}}
    with pytest.raises(KvsimError, match="weight_group_size must be 32, got 128"):
        scenario_from_dict({**base, "model": {"name": "gpt-oss-20b", "weight_group_size": 128}})
    with pytest.raises(KvsimError, match="weight_scope experts needs num_experts"):
        scenario_from_dict({**base, "model": {"name": "llama-2-7b", "weight_dtype": "int4", "weight_scope": "experts"}})
    with pytest.raises(ValueError, match="mxfp4 quantizes a mixture of experts' experts"):
        spec_from_hf_config({**GPT_OSS_20B, "num_local_experts": 0}, "x")


def test_gpt_oss_120b_runs_on_one_h100():
    data = {"name": "gpt-oss", "model": "openai/gpt-oss-120b", "hardware": "h100-80gb",
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 8192},
            "workload": {"synthetic": {"num_requests": 50, "arrival": {"process": "poisson", "rate": 5.0},
                                       "prompt_len": {"dist": "uniform", "min": 500, "max": 8000},
                                       "output_len": {"dist": "uniform", "min": 50, "max": 500}}},
            "output": {"plots": False}}
    run = run_scenario(scenario_from_dict(data), check_integrity=False)
    assert run.summary["num_finished"] == 50 and run.summary["num_rejected"] == 0

