"""Mixtures of experts with shared experts and dense layers (Qwen-MoE, DeepSeek): the presets' parameters
against the model cards, the cost model's expert layers by hand, and the compiled core against the loop."""

from __future__ import annotations

import pytest
from result_compare import assert_same, off_and_on

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.roofline import CostParams
from sim.native import native
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

QWEN = ModelSpec.from_name("qwen1.5-moe-a2.7b")
H100 = HardwareSpec.from_name("h100-80gb")
IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0)
# a DeepSeek-MoE-16B-like layout: 28 layers, the first dense (MLP 10944), then 64 experts of 1408, 6 a token,
# and two shared experts (2 x 1408 = 2816)
DEEPSEEK = ModelSpec(name="deepseek-like", num_layers=28, hidden_size=2048, num_heads=16, num_kv_heads=16,
                     head_dim=128, intermediate_size=1408, vocab_size=102400, max_model_len=4096, num_experts=64,
                     experts_per_token=6, shared_expert_size=2816, dense_layers=1, dense_intermediate_size=10944)


def test_qwen_moe_parameters_by_hand_match_the_model_cards():
    # per layer: QKV 2048 x 6144, out 2048 x 2048, 60 experts x 3 x 2048 x 1408, the shared expert 3 x 2048 x
    # 5632, router 2048 x 60, two norms; embedding and LM head 151936 x 2048 each, the final norm
    layer = 2048 * 6144 + 2048 * 2048 + 60 * 3 * 2048 * 1408 + 3 * 2048 * 5632 + 2048 * 60 + 2 * 2048
    assert QWEN.num_params() == 24 * layer + 2 * 151936 * 2048 + 2048 == 14_315_587_584
    assert QWEN.num_params() == pytest.approx(14.3e9, rel=0.005)   # "14.3B parameters in total"
    assert ModelSpec.from_name("qwen2-57b-a14b").num_params() == pytest.approx(57e9, rel=0.01)   # "57B"


def test_dense_layers_count_their_own_mlp():
    moe_layer = 4 * 2048 * 2048 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816 + 2048 * 64 + 2 * 2048
    dense_layer = 4 * 2048 * 2048 + 3 * 2048 * 10944 + 2 * 2048
    assert DEEPSEEK.num_params() == 27 * moe_layer + dense_layer + 2 * 102400 * 2048 + 2048
    assert DEEPSEEK.num_params() == pytest.approx(16.4e9, rel=0.005)   # DeepSeek-MoE-16B: "16.4B"
    # int4 weights: every projection (experts, shared, dense) at half a byte plus a 2-byte scale a 128 rows
    q4 = DEEPSEEK.model_copy(update={"weight_dtype": "int4"})
    proj = 27 * (4 * 2048 * 2048 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816) + 4 * 2048 * 2048 + 3 * 2048 * 10944
    # (one scale a column of each 128 rows of K: K = 2048 -> 16 groups, 1408 -> 11, 2816 -> 22, 10944 -> 86)
    scales = 27 * 2 * (16 * 4 * 2048 + 64 * (16 * 2 * 1408 + 11 * 2048) + 16 * 2 * 2816 + 22 * 2048) \
        + 2 * (16 * 4 * 2048 + 16 * 2 * 10944 + 86 * 2048)
    assert q4.weight_bytes() == proj // 2 + scales + (DEEPSEEK.num_params() - proj) * 2


def _gemm_bytes(m: float, n: int, k: int) -> float:
    return 2.0 * (k * n + m * k + m * n)   # memory bound at one token: weights + activations in and out


def _linear(model: ModelSpec, tokens: int, **params) -> float:
    exe = CostModelExecutor(model, H100, CostParams(**{**IDEAL, **params}))
    plan = StepPlan(scheduled=[ScheduledRequest(i, 1, 100, []) for i in range(tokens)])
    return exe.execute(plan).breakdown["linear"] - exe._lm_head(tokens)


def test_one_token_reads_its_experts_and_the_shared_one():
    # 60 x (1 - (56/60)^1) = 4 experts active, a row each; the shared expert and the router read whole
    attn = _gemm_bytes(1, 6144, 2048) + _gemm_bytes(1, 2048, 2048)
    experts = 4 * (_gemm_bytes(1, 2 * 1408, 2048) + _gemm_bytes(1, 2048, 1408))
    shared = _gemm_bytes(1, 2 * 5632, 2048) + _gemm_bytes(1, 2048, 5632)
    router = _gemm_bytes(1, 60, 2048)
    assert _linear(QWEN, 1) == pytest.approx(24 * (attn + experts + shared + router) / 3.35e12, rel=1e-9)


def test_a_dense_layer_is_priced_as_a_dense_mlp():
    # one token: 27 expert layers (6 experts of 64 active, the shared pair, the router) and 1 dense layer
    attn = _gemm_bytes(1, 6144, 2048) + _gemm_bytes(1, 2048, 2048)
    active = 64 * (1 - (58 / 64))
    moe = attn + active * (_gemm_bytes(1, 2 * 1408, 2048) + _gemm_bytes(1, 2048, 1408)) \
        + _gemm_bytes(1, 2 * 2816, 2048) + _gemm_bytes(1, 2048, 2816) + _gemm_bytes(1, 64, 2048)
    dense = attn + _gemm_bytes(1, 2 * 10944, 2048) + _gemm_bytes(1, 2048, 10944)
    assert _linear(DEEPSEEK, 1) == pytest.approx((27 * moe + dense) / 3.35e12, rel=1e-9)


def test_launches_and_eager_ops_of_each_kind_of_layer():
    # an expert layer with shared experts: QKV, out, router, 2 grouped, 3 small MoE kernels, the shared
    # experts' 2 GEMMs, their activation and their sum: 12 launches; a dense layer 4. Each costs
    # kernel_latency_s alone and graph_kernel_s in a CUDA graph
    from sim.executors.engine_params import EngineParams

    def linear(latency: float) -> float:
        return _linear(DEEPSEEK, 16, kernel_latency_s=latency)

    assert linear(1e-6) - linear(0.0) == pytest.approx((27 * 12 + 4) * 1e-6, rel=1e-9)
    exe = CostModelExecutor(DEEPSEEK, H100, CostParams(**dict(IDEAL, kernel_latency_s=7e-6)),
                            engine=EngineParams(graph_kernel_s=2e-6))
    graph, _ = exe._engine_linear(16, graph=True)
    eager, _ = exe._engine_linear(16, graph=False)
    assert eager - graph == pytest.approx((27 * 12 + 4) * (7e-6 - 2e-6), rel=1e-9)
    # without graphs the CPU dispatches a dense layer's 14 ops, and an expert layer's 8 more
    assert exe._eager_ops == 27 * (14 + 8) + 14


def test_the_activation_reads_the_experts_and_shared_widths():
    # SiLU-and-mul per token: 6 experts x 1408 + 2816 on the 27 expert layers, 10944 on the dense one, over
    # 28 layers: (27 x 11264 + 10944) / 28 = 11252.57... wide on average; at TP 2 half of it
    assert DEEPSEEK.activated_mlp_width() == pytest.approx((27 * 11264 + 10944) / 28, rel=1e-15)
    assert DEEPSEEK.activated_mlp_width(2) == pytest.approx((27 * 5632 + 5472) / 28, rel=1e-15)
    assert QWEN.activated_mlp_width() == 4 * 1408 + 5632   # alike layers: an int


@pytest.mark.parametrize("edit, message", [
    ({"num_experts": 0, "experts_per_token": 0}, "shared_expert_size needs num_experts"),
    ({"dense_layers": 28}, "dense_layers (28) must be fewer than num_layers (28)"),
    ({"dense_intermediate_size": 0}, "dense_layers and dense_intermediate_size go together"),
])
def test_bad_layouts_are_refused_naming_the_key(edit, message):
    with pytest.raises(KvsimError, match=message.replace("(", r"\(").replace(")", r"\)")):
        scenario_from_dict({"model": {**DEEPSEEK.model_dump(), **edit},
                            "workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}})


def test_tensor_parallel_must_divide_the_shared_and_dense_widths():
    odd = DEEPSEEK.model_copy(update={"dense_intermediate_size": 10946})
    assert odd.tensor_parallel_problem(4) == "4 does not divide deepseek-like's dense layers' MLP width 10946"
    assert DEEPSEEK.tensor_parallel_problem(4) is None


@pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prompts"])
def test_the_core_prices_them_as_the_loop_does(monkeypatch, chunked):
    data = {"name": "moe-layouts", "model": DEEPSEEK.model_dump(), "hardware": {"name": "h100-80gb"},
            "scheduler": {"chunked_prefill": chunked, "max_num_batched_tokens": 4096, "max_num_seqs": 32},
            "workload": {"synthetic": {"num_requests": 150, "arrival": {"process": "poisson", "rate": 20.0},
                                       "prompt_len": {"dist": "uniform", "min": 50, "max": 3000},
                                       "output_len": {"dist": "uniform", "min": 5, "max": 300}}},
            "output": {"plots": False}}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",
                            lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_finished"] == 150


def test_activated_parameters_match_the_model_cards():
    # a token runs through 4 of Qwen1.5-MoE's 60 experts: 24 x (QKV, out, 4 experts, the shared expert, router,
    # norms) + embedding + LM head + final norm
    layer = 2048 * 6144 + 2048 * 2048 + 4 * 3 * 2048 * 1408 + 3 * 2048 * 5632 + 2048 * 60 + 2 * 2048
    assert QWEN.activated_params() == 24 * layer + 2 * 151936 * 2048 + 2048
    cards = {"qwen1.5-moe-a2.7b": 2.7e9, "qwen2-57b-a14b": 14e9, "deepseek-v3": 37e9, "mixtral-8x7b": 12.9e9,
             "qwen3-30b-a3b": 3.3e9}   # "activated" / "active" parameters on each model card
    for name, active in cards.items():
        assert ModelSpec.from_name(name).activated_params() == pytest.approx(active, rel=0.025), name
    llama = ModelSpec.from_name("llama-2-7b")
    assert llama.activated_params() == llama.num_params()


# published config.json values (the keys that matter): GLM-4.5 (zai-org), Qwen3-235B-A22B, Kimi-K2-Instruct
GLM_4_5 = {"model_type": "glm4_moe", "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
           "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 92,
           "n_routed_experts": 160, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
           "partial_rotary_factor": 0.5, "attention_bias": True, "num_nextn_predict_layers": 1,
           "vocab_size": 151552, "max_position_embeddings": 131072, "tie_word_embeddings": False}
QWEN3_235B = {"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 94,
              "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False}
KIMI_K2 = {"model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 61, "n_routed_experts": 384,
           "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 131072,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128]}}


def test_large_moe_presets_by_hand_and_against_their_cards():
    # GLM-4.5, one expert layer: attention (96 x 128 queries, 8 x 128 keys and values, 12,288 -> 5,120 out),
    # 160 experts and a shared one of 3 x 5,120 x 1,536, the router, two norms; a dense layer's MLP 3 x 5,120 x
    # 12,288; 89 expert layers, 3 dense, untied embedding and head, the final norm
    h, attn = 5120, 5120 * (96 + 16) * 128 + 96 * 128 * 5120
    moe = attn + 161 * 3 * h * 1536 + h * 160 + 2 * h
    dense = attn + 3 * h * 12288 + 2 * h
    glm = ModelSpec.from_name("zai-org/GLM-4.5")
    assert glm.num_params() == 89 * moe + 3 * dense + 2 * 151552 * h + h
    # the cards: "355B total" (with its multi-token-prediction layer, left out here: 352.8B), "32B active" and
    # GLM-4.5-Air's "106B / 12B" counted without the embedding and the LM head; Qwen3-235B-A22B's "235B / 22B";
    # Kimi K2's "1T / 32B"; Mixtral-8x22B's "141B / 39B"
    air = ModelSpec.from_name("zai-org/GLM-4.5-Air")
    for spec, total, active, outside in ((glm, 355e9, 32e9, 2), (air, 106e9, 12e9, 2),
                                         (ModelSpec.from_name("Qwen/Qwen3-235B-A22B"), 235e9, 22e9, 0),
                                         (ModelSpec.from_name("moonshotai/Kimi-K2-Instruct"), 1e12, 32e9, 0),
                                         (ModelSpec.from_name("mistralai/Mixtral-8x22B-v0.1"), 141e9, 39e9, 0)):
        assert spec.num_params() == pytest.approx(total, rel=0.03), spec.name
        assert spec.activated_params() - outside * spec.vocab_size * spec.hidden_size == pytest.approx(
            active, rel=0.03), spec.name


@pytest.mark.parametrize("config, preset", [(GLM_4_5, "glm-4.5"), (QWEN3_235B, "qwen3-235b-a22b"),
                                            (KIMI_K2, "kimi-k2")])
def test_their_configs_give_the_presets(config, preset):
    from sim.hf_config import spec_from_hf_config

    assert spec_from_hf_config(config, preset) == ModelSpec.from_name(preset)


def test_deepseek_v3_1_has_v3s_shapes():
    v31 = ModelSpec.from_name("deepseek-ai/DeepSeek-V3.1")
    assert v31.model_copy(update={"name": "deepseek-v3"}) == ModelSpec.from_name("deepseek-v3")
