"""Multi-head latent attention (DeepSeek-V2/V3): the presets' parameters and KV against the model cards, the
latent cached whole on every GPU, the attention's and projections' costs by hand, the configs, the refusals,
and the compiled core against the loop."""

from __future__ import annotations

import math

import pytest
from result_compare import assert_same, off_and_on

import sim.engine_core as engine_core
from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.layer_terms import attention_shapes
from sim.executors.roofline import CostParams
from sim.hf_config import spec_from_hf_config
from sim.native import native
from sim.runner import gpu_blocks, run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

V3 = ModelSpec.from_name("deepseek-v3")
LITE = ModelSpec.from_name("deepseek-v2-lite")
H100 = HardwareSpec.from_name("h100-80gb")
IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0)

# deepseek-ai/DeepSeek-V3 config.json (the keys that matter), its fp8 checkpoint's quantization_config
V3_CONFIG = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
             "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
             "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
             "num_hidden_layers": 61, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
             "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
             "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
             "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}}
# deepseek-ai/DeepSeek-V2-Lite config.json: no query bottleneck (q_lora_rank null), two shared experts
LITE_CONFIG = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
               "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
               "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_attention_heads": 16, "num_key_value_heads": 16,
               "num_hidden_layers": 27, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
               "tie_word_embeddings": False}


def test_deepseek_v3_parameters_and_kv_by_hand():
    # attention a layer: the fused down projections 7168 x (1536 + 512 + 64), the query's up 1536 x 128 x 192,
    # the latent's up 512 x 128 x (128 + 128), the output 128 x 128 x 7168; norms 2 x 7168 + 1536 + 512
    attention = 7168 * 2112 + 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168 + 2 * 7168 + 1536 + 512
    expert = 3 * 7168 * 2048
    moe = attention + 256 * expert + expert + 7168 * 256   # 256 routed, 1 shared, the router
    dense = attention + 3 * 7168 * 18432
    assert V3.num_params() == 58 * moe + 3 * dense + 2 * 129280 * 7168 + 7168
    assert V3.num_params() == pytest.approx(671e9, rel=0.001)   # "671B total parameters"
    assert LITE.num_params() == pytest.approx(15.7e9, rel=0.002)  # "15.7B"
    # one latent of 512 + a rotary key of 64 a layer, 16-bit: 61 x 576 x 2 = 70,272 bytes a token (a
    # multi-head cache of 128 heads of 192 / 128 would be 2 x ... 61 x 128 x (192 + 128) x 2 = 4,997,120)
    assert V3.kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    assert LITE.kv_bytes_per_token() == 27 * 576 * 2


def test_configs_give_the_presets():
    assert spec_from_hf_config(V3_CONFIG, "deepseek-v3") == V3
    assert spec_from_hf_config(LITE_CONFIG, "deepseek-v2-lite") == LITE
    assert (LITE.q_lora_rank, LITE.head_dim, LITE.dense_layers, LITE.shared_expert_size) == (0, 192, 1, 2816)


@pytest.mark.parametrize("edit, message", [
    ({"qk_rope_head_dim": None}, "no rotary head dim (qk_rope_head_dim)"),
    ({"index_topk": 2048, "index_n_heads": 64}, "index_topk: DeepSeek's sparse attention (V3.2"),
    ({"v_head_dim": 0}, "v_head_dim: value head dim must be a positive integer"),
])
def test_bad_latent_configs_name_the_key(edit, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_hf_config({**LITE_CONFIG, **edit}, "x")


def test_every_gpu_holds_the_whole_latent():
    # vLLM caches one latent a layer and does not shard it: at TP 2 each GPU holds all of it, so a block takes
    # twice the model's bytes over the group, and the cache is what is left of 2 x 0.9 x 80 GiB after the
    # weights and 5% for activations, in blocks of 2 x 16 x 31,104 bytes
    assert LITE.kv_replicas(2) == 2 and LITE.tensor_parallel_problem(16) is None   # no KV heads to divide
    scn = scenario_from_dict({"model": "deepseek-v2-lite", "hardware": {"name": "h100-80gb", "tensor_parallel": 2},
                              "workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}})
    usable = 2 * 0.9 * H100.hbm_bytes
    free = usable - LITE.num_params() * 2 - 0.05 * usable
    assert gpu_blocks(scn) == math.floor(free / (2 * 16 * 31_104))


def test_attention_shapes_as_vllm_shards_them():
    # TP 8: 16 heads a GPU; the down projections (fused_qkv_a_proj) are not sharded
    assert attention_shapes(V3, 8) == [("attn_pre_proj", 7168, 1536 + 576), ("attn_pre_proj", 1536, 16 * 192),
                                       ("attn_pre_proj", 512, 16 * 256), ("attn_post_proj", 16 * 128, 7168)]
    # no query bottleneck: kv_a_proj_with_mqa and q_proj
    assert attention_shapes(LITE, 1) == [("attn_pre_proj", 2048, 576), ("attn_pre_proj", 2048, 16 * 192),
                                         ("attn_pre_proj", 512, 16 * 256), ("attn_post_proj", 16 * 128, 2048)]


def _attention(plan: StepPlan, model: ModelSpec = V3, tp: int = 8) -> float:
    hw = H100.model_copy(update={"tensor_parallel": tp})
    return CostModelExecutor(model, hw, CostParams(**IDEAL)).execute(plan).breakdown["attention"]


def test_a_decode_reads_one_latent_a_cached_token():
    # DeepSeek-V3 at TP 8 (16 heads a GPU), fp8 weights, a 16-bit cache; one decode at context 1,000 reads
    # 1,001 latents of 576 x 2 bytes, and its query (16 heads x 576, fp8) and output (16 x 512) and stores
    # its latent; compute: 2 x 16 x (576 + 512) FLOPs a cached token, on the 16-bit tensor cores
    mem = (1001 * 576 * 2 + 16 * (576 + 512) * 1 + 576 * 2) / 3.35e12
    flops = 2 * 16 * (576 + 512) * 1001 / 989e12
    plan = StepPlan(scheduled=[ScheduledRequest(0, 1, 1000, [])])
    assert _attention(plan) == pytest.approx(61 * max(mem, flops), rel=1e-12)
    assert mem > flops   # memory bound at 16 heads a GPU


def test_a_prefill_attends_up_projected_keys_and_values():
    # 100 new tokens: 5,050 causal pairs of 2 x 16 x (192 + 128) FLOPs; bytes a token: Q, K (16 x 192), V and
    # O (16 x 128) in fp8 and the latent stored (576 x 2)
    new = 1 * 2 * 16 * (192 + 128) + 576 * 2
    alone = max(2 * 16 * 320 * 5050 / 989e12, new * 100 / 3.35e12)
    assert _attention(StepPlan(scheduled=[ScheduledRequest(0, 100, 0, [])])) == pytest.approx(61 * alone, rel=1e-12)
    # after 900 cached tokens: each is read as a latent, up-projected (2 x 512 FLOPs an element of 16 heads'
    # keys and values, 128 + 128 wide: the key's rotary part is the latent's own), written and read back
    pairs = 100 * 900 + 5050
    per_cached = (2 * 1 * 16 * 320 + 576 * 2) / 3.35e12 + 2 * 512 * 16 * 256 / 989e12
    chunk = max(2 * 16 * 320 * pairs / 989e12, new * 100 / 3.35e12 + per_cached * 900)
    assert _attention(StepPlan(scheduled=[ScheduledRequest(0, 100, 900, [])])) == pytest.approx(61 * chunk, rel=1e-12)


def _gemm_bytes(m: int, n: int, k: int, b: int = 2) -> float:
    return b * (k * n + m * k + m * n)   # memory bound at one token: weights + activations in and out


def test_one_token_reads_the_latent_projections():
    # DeepSeek-V2-Lite, one token, TP 1: the four attention projections, the latent's up projection (a
    # decode's two absorbed products read the same 512 x 16 x 256 weights), then the layer's MLP
    exe = CostModelExecutor(LITE, H100, CostParams(**IDEAL))
    attention = _gemm_bytes(1, 576, 2048) + _gemm_bytes(1, 3072, 2048) + _gemm_bytes(1, 4096, 512) \
        + _gemm_bytes(1, 2048, 2048)
    dense = _gemm_bytes(1, 2 * 10944, 2048) + _gemm_bytes(1, 2048, 10944)
    assert exe.layer_linear_time(1, dense=True) == pytest.approx((attention + dense) / 3.35e12, rel=1e-12)


def test_refusals():
    base = {"workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}}
    bad = {**LITE.model_dump(), "qk_rope_head_dim": 192}
    with pytest.raises(KvsimError, match="needs qk_rope_head_dim below head_dim"):
        scenario_from_dict({**base, "model": bad})
    with pytest.raises(KvsimError, match="need kv_lora_rank"):
        scenario_from_dict({**base, "model": {**ModelSpec.from_name("llama-2-7b").model_dump(), "v_head_dim": 128}})
    with pytest.raises(KvsimError, match="EAGLE-3 head of a latent-attention target is not modelled"):
        scenario_from_dict({**base, "model": "deepseek-v2-lite", "hardware": "h100-80gb",
                            "speculative": {"method": "eagle3", "num_speculative_tokens": 2, "acceptance_rate": 0.6}})
    from backend.executor import make_gpu_executor

    dense_latent = LITE.model_copy(update={"num_experts": 0, "experts_per_token": 0, "shared_expert_size": 0,
                                           "dense_layers": 0, "dense_intermediate_size": 0})
    with pytest.raises(KvsimError, match="multi-head attention only"):
        make_gpu_executor(model=dense_latent, hardware=H100, config=None, kv=None, num_gpu_blocks=1, num_cpu_blocks=0)


@pytest.mark.skipif(native is None, reason="sim._native is not built (pip install -e . builds it)")
@pytest.mark.parametrize("setting", [
    {"executor": {"calibration": "roofline"}},
    {"kv_cache": {"prefix_caching": True}},
    {"speculative": {"method": "mtp", "num_speculative_tokens": 2, "acceptance_rate": 0.7}},
    {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.5}},
    {"executor": {"calibration": "roofline"},
     "speculative": {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.7}},
], ids=["roofline", "engine-prefix-cache", "engine-mtp", "engine-ngram", "roofline-eagle-head"])
def test_the_core_prices_latent_attention_as_the_loop_does(monkeypatch, setting):
    data = {"name": "latent", "model": "deepseek-v2-lite", "hardware": "h100-80gb",
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 1024, "max_num_seqs": 24},
            "workload": {"synthetic": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 15.0},
                                       "prompt_len": {"dist": "uniform", "min": 50, "max": 3000},
                                       "output_len": {"dist": "uniform", "min": 5, "max": 200},
                                       "shared_prefix": {"groups": 3, "length": 512}}},
            "output": {"plots": False}, **setting}
    loop, core = off_and_on(monkeypatch, engine_core, "enabled",   # (the core checks its invariants every step; the
                            lambda: run_scenario(scenario_from_dict(data),   # loop's, on large caches, cost a second
                                                 check_integrity=engine_core.enabled))   # a run: fuzzed instead)
    assert_same(loop, core)
    assert core.profile["compiled_core"] and core.summary["num_finished"] == 120


def test_decode_attention_against_flashmla():
    # scripts/deepseek_latency_check.py, fitted to nothing: FlashMLA's own timing on one H100 (its issue 19:
    # 128 decodes of ~4,096 cached latents, 16 / 32 / 64 query heads: 0.215 / 0.218 / 0.223 ms a layer); the
    # shipped engine terms, fitted to Llama runs, price the same layer within 10%
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "deepseek_latency_check.py"
    spec = importlib.util.spec_from_file_location("deepseek_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    for batch, context, heads, measured, source in check.KERNEL:
        if source.startswith("FlashMLA"):
            assert check.kernel_s(batch, context, heads) == pytest.approx(measured, rel=0.10), heads


def test_the_multi_token_prediction_layer():
    # DeepSeek-V3's MTP layer beside the target: one expert layer of its own (fp8: a byte a parameter) and the
    # projection of the token's embedding and the last hidden state (2 x 7168 -> 7168), the embedding and LM
    # head shared; its KV one latent a token in the target's blocks, on each of the 8 GPUs
    from sim.speculative import SpeculativeConfig, drafter_bytes

    cfg = SpeculativeConfig(method="mtp", num_speculative_tokens=1, acceptance_rate=0.8)
    # in the fp8 checkpoint the projections take a byte a weight, the norms and the router's gate two (bf16)
    projections = 7168 * 2112 + 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168 + 257 * 3 * 7168 * 2048
    norms, gate = 2 * 7168 + 1536 + 512, 7168 * 256
    weights, block = drafter_bytes(cfg, V3, HardwareSpec.from_name("h200-141gb").model_copy(
        update={"tensor_parallel": 8}), 64)
    assert weights == projections + 2 * (norms + gate) + 2 * 7168 * 7168
    assert block == 8 * 64 * 576 * 2
    # priced as an EAGLE head, which has its shape: the same run either way
    data = {"model": "deepseek-v2-lite", "hardware": "h100-80gb", "output": {"plots": False},
            "workload": {"requests": [{"arrival": 0.01 * i, "prompt_len": 300, "output_len": 40} for i in range(20)]}}
    mtp, eagle = (run_scenario(scenario_from_dict({**data, "speculative": {
        "method": m, "num_speculative_tokens": 2, "acceptance_rate": 0.7}})) for m in ("mtp", "eagle"))
    assert mtp.steps.equals(eagle.steps) and mtp.summary["num_steps"] == eagle.summary["num_steps"]
