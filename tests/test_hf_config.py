"""A model from its Hugging Face config.json (sim/hf_config.py): the keys read, the defaults, the errors, and
its use in a scenario (``model: path/config.json``) and in ``kvsim fidelity --model ID=PATH``.

The configs below are the published config.json values of each model (the keys that matter), typed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.hf_config import load_hf_config, spec_from_hf_config
from sim.specs import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[1]

LLAMA_2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
              "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000, "tie_word_embeddings": False}
QWEN_2_5_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
               "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
               "max_position_embeddings": 32768, "tie_word_embeddings": False}
OPT_13B = {"model_type": "opt", "hidden_size": 5120, "ffn_dim": 20480, "num_attention_heads": 40,
           "num_hidden_layers": 40, "vocab_size": 50272, "max_position_embeddings": 2048,
           "activation_function": "relu", "tie_word_embeddings": True}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2}


def test_a_config_gives_the_preset_typed_from_the_same_config():
    spec = spec_from_hf_config(LLAMA_2_7B, "llama-2-7b")
    assert spec == MODEL_PRESETS["llama-2-7b"]   # no num_key_value_heads: one KV head per head
    assert spec_from_hf_config(OPT_13B, "opt-13b") == MODEL_PRESETS["opt-13b"]   # ffn_dim: a plain MLP
    assert spec_from_hf_config(MIXTRAL_8X7B, "mixtral-8x7b") == MODEL_PRESETS["mixtral-8x7b"]


def test_a_dense_config_may_state_zero_experts():
    assert spec_from_hf_config({**QWEN_2_5_7B, "num_experts": 0, "num_experts_per_tok": 0}, "q").num_experts == 0


def test_grouped_query_attention_and_head_dim():
    spec = spec_from_hf_config(QWEN_2_5_7B, "qwen")
    assert (spec.num_kv_heads, spec.head_dim, spec.gated_mlp) == (4, 128, True)   # 3584 / 28 = 128
    assert spec.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2                     # 57,344 bytes in fp16
    # a config that states its head dim (here 128, not 5120 / 64 = 80) keeps it
    explicit = spec_from_hf_config({**QWEN_2_5_7B, "hidden_size": 5120, "num_attention_heads": 64,
                                    "num_key_value_heads": 8, "head_dim": 128}, "q")
    assert explicit.head_dim == 128 and explicit.q_size == 64 * 128


def test_a_multimodal_config_reads_its_text_model():
    spec = spec_from_hf_config({"model_type": "llava", "text_config": LLAMA_2_7B}, "llava")
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (32, 4096, 32000)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("num_hidden_layers"), "no layer count (num_hidden_layers or n_layer or num_layers)"),
    (lambda c: c.__setitem__("hidden_size", "4096"), "hidden_size: hidden size must be a positive integer"),
    (lambda c: c.__setitem__("num_key_value_heads", 5), "num_heads (32) must be a multiple of num_kv_heads (5)"),
    (lambda c: c.__setitem__("tie_word_embeddings", "yes"), "tie_word_embeddings: expected true or false"),
    (lambda c: c.__setitem__("kv_lora_rank", 512), "no rotary head dim (qk_rope_head_dim)"),   # latent, half given
    (lambda c: c.__setitem__("full_attention_interval", 4), "full_attention_interval: linear-attention (Gated "
                                                            "DeltaNet) layers"),
    (lambda c: c.__setitem__("layer_types", ["linear_attention", "full_attention"] * 16),
     "layer_types: linear_attention layers are not modelled"),
    (lambda c: c.__setitem__("shared_expert_intermediate_size", 5632), "shared_expert_intermediate_size: shared experts and dense "
                                                                        "layers describe a mixture of experts"),
    (lambda c: c.update(num_experts=8, num_experts_per_tok=2, mlp_only_layers="0,1"),
     "mlp_only_layers: expected a list of layer indices"),
    (lambda c: c.update(num_experts=8, num_experts_per_tok=2, first_k_dense_replace=32),
     "first_k_dense_replace: no layer is left a mixture of experts"),
    (lambda c: c.update(num_experts=8, num_experts_per_tok=2, mlp_only_layers=list(range(32))),
     "mlp_only_layers: no layer is left a mixture of experts"),
    (lambda c: c.update(attention_chunk_size="1024"), "attention_chunk_size: the chunk must be a positive integer"),
    (lambda c: c.update(attention_chunk_size=1024, no_rope_layers=[2] * 32), "no_rope_layers: expected a 0 or 1"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 32), "sliding_window: layer_types names sliding_attention "
                                                                  "layers, but the config gives no window"),
])
def test_bad_configs_name_the_key(edit, message):
    cfg = dict(LLAMA_2_7B)
    edit(cfg)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_hf_config(cfg, "x")


def _kvsim(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT, capture_output=True, text=True)


def test_a_scenario_names_a_config_file_relative_to_itself(tmp_path):
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(QWEN_2_5_7B))
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: qwen/config.json\nhardware: h100-80gb\n"
                        "workload: {synthetic: {num_requests: 20, arrival: {process: poisson, rate: 5.0},\n"
                        "  prompt_len: {dist: fixed, value: 200}, output_len: {dist: fixed, value: 20}}}\n")
    r = _kvsim("run", str(scenario), "--no-plots", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["num_finished"] == 20
    # a field of the config's model overridden like a preset's
    r = _kvsim("run", str(scenario), "--no-plots", "--out", str(tmp_path / "b"), "--set", "model.max_model_len=100")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["num_rejected"] == 20   # 200 + 20 > 100


@pytest.mark.parametrize("text, message", [
    ("{", ":1: not valid JSON"),
    (json.dumps({"hidden_size": 8}), "no layer count"),
])
def test_a_bad_config_file_exits_2_naming_it(tmp_path, text, message):
    bad = tmp_path / "config.json"
    bad.write_text(text)
    r = _kvsim("run", "scenarios/quickstart.yaml", "--set", f"model={bad}", "--no-plots")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and message in lines[0]
    r = _kvsim("run", "scenarios/quickstart.yaml", "--set", f"model={tmp_path / 'none.json'}", "--no-plots")
    assert r.returncode == 2 and "none.json: no such file" in r.stderr


def test_fidelity_replays_a_model_without_a_preset(tmp_path):
    runs = (ROOT / "sim/data/ground_truth/vllm_h100_runs.csv").read_text()
    f = tmp_path / "runs.csv"
    f.write_text(runs.replace("meta-llama/Llama-2-7b-hf", "acme/Qwen-Like-7B"))   # no preset by that name
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN_2_5_7B))
    r = _kvsim("fidelity", str(f), "--run", "llama-2-7b-tp1-codegen", "--seeds", "1", "--duration", "5", "--json",
               "--model", f"ACME/qwen-like-7b={cfg}")   # any case
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["stages"]) == 2
    r = _kvsim("fidelity", str(f), "--seeds", "1", "--duration", "5")
    assert r.returncode == 2 and "--model acme/Qwen-Like-7B=PATH" in r.stderr


def test_load_names_the_file(tmp_path):
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(LLAMA_2_7B))
    assert load_hf_config(cfg).name == "m"   # the folder's name, as a downloaded model's


@pytest.mark.parametrize("preset, billions", [
    # the parameter counts on the models' cards (Qwen2.5-Coder-32B and the 2B Granite: the Hub's count of the weights)
    ("qwen2.5-1.5b", 1.54), ("qwen2.5-3b", 3.09), ("qwen2.5-7b", 7.61), ("qwen2.5-14b", 14.7),
    ("qwen2.5-72b", 72.7), ("llama-3.2-1b", 1.23), ("llama-3.2-3b", 3.21), ("phi-4", 14.7),
    ("qwen3-4b", 4.0), ("qwen3-8b", 8.2), ("qwen3-14b", 14.8), ("qwen3-32b", 32.8), ("qwen3-30b-a3b", 30.5),
    ("llama-3.1-405b", 405.85), ("granite-3.3-8b", 8.17), ("granite-3.3-2b", 2.53),
    ("qwen2.5-coder-7b", 7.61), ("qwen2.5-coder-32b", 32.8), ("deepseek-r1-distill-llama-8b", 8.03),
    ("deepseek-r1-distill-llama-70b", 70.6),
])
def test_new_presets_have_their_published_size(preset, billions):
    assert MODEL_PRESETS[preset].num_params() / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("model_id, preset", [
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b"), ("microsoft/phi-4", "phi-4"),
    ("ibm-granite/granite-3.1-8b-instruct", "granite-3.1-8b"), ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
    ("codellama/CodeLlama-13b-Instruct-hf", "codellama-13b"), ("acme/Giant-9000", None),
    ("Qwen/Qwen3-8B", "qwen3-8b"), ("Qwen/Qwen3-14B-Base", "qwen3-14b"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"), ("zai-org/GLM-4.5", "glm-4.5"),
    ("zai-org/GLM-4.5-Air", "glm-4.5-air"), ("moonshotai/Kimi-K2-Instruct-0905", "kimi-k2"),
    ("moonshotai/Kimi-K2-Thinking", None),   # (its experts in int4: a config.json, not a guess)
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b"), ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3.1"),
    ("ibm-granite/granite-3.3-8b-instruct", "granite-3.3-8b"), ("ibm-granite/granite-3.0-8b-base", "granite-3.0-8b"),
    ("Qwen/Qwen2.5-Coder-32B-Instruct", "qwen2.5-coder-32b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1-distill-llama-70b"),
])
def test_runs_files_name_models_as_the_hub_does(model_id, preset):
    from sim.fidelity.runs import model_preset

    assert model_preset(model_id) == preset


def test_an_override_of_a_config_models_field_reads_the_config_beside_the_scenario(tmp_path):
    from sim.scenario import apply_override

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN_2_5_7B))
    data = {"model": "m/config.json"}
    apply_override(data, ["model", "max_model_len"], 8192, tmp_path)   # as sweeps and capacity searches do
    assert data["model"]["max_model_len"] == 8192 and data["model"]["num_kv_heads"] == 4



# published config.json values (the keys that matter): Mistral-7B-v0.1, Gemma-3-4B (text), gpt-oss-20b, Gemma-2-9B,
# Phi-3-mini-4k
MISTRAL_7B_V01 = {**LLAMA_2_7B, "model_type": "mistral", "intermediate_size": 14336, "num_key_value_heads": 8,
                  "max_position_embeddings": 32768, "sliding_window": 4096}
GEMMA_3_4B = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 8,
              "num_hidden_layers": 34, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
              "max_position_embeddings": 131072, "sliding_window": 1024, "tie_word_embeddings": True,
              "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5 + ["sliding_attention"] * 4}
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
               "num_hidden_layers": 24, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
               "max_position_embeddings": 131072, "sliding_window": 128, "num_local_experts": 32,
               "num_experts_per_tok": 4, "layer_types": ["sliding_attention", "full_attention"] * 12}
GEMMA_2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
              "num_hidden_layers": 42, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
              "max_position_embeddings": 8192, "sliding_window": 4096, "sliding_window_size": 4096,
              "cache_implementation": "hybrid", "tie_word_embeddings": True}
PHI_3_MINI_4K = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                 "max_position_embeddings": 4096, "sliding_window": 2047}


@pytest.mark.parametrize("cfg, window, sliding", [
    (MISTRAL_7B_V01, 4096, 32),                                      # every layer
    (PHI_3_MINI_4K, 2047, 32),
    (GEMMA_3_4B, 1024, 29),                                          # layer_types: 5 of every 6, the last 4 too
    ({k: v for k, v in GEMMA_3_4B.items() if k != "layer_types"}, 1024, 29),   # Gemma 3's pattern of 6 alone
    ({**GEMMA_3_4B, "layer_types": None, "sliding_window_pattern": 2}, 1024, 17),
    (GPT_OSS_20B, 128, 12),                                          # every other layer
    (GEMMA_2_9B, 4096, 21),                                          # Gemma 2: the even layers (0, 2, .. 40)
    ({**QWEN_2_5_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}, 4096, 8),
])
def test_a_sliding_window_is_read_with_the_layers_it_covers(cfg, window, sliding):
    spec = spec_from_hf_config(cfg, "x")
    assert (spec.sliding_window, spec.local_layers) == (window, sliding)
    # the KV cache keeps every layer's tokens: the bytes a token are the full-attention model's
    full = spec_from_hf_config({**cfg, "sliding_window": None, "layer_types": None}, "x")
    assert spec.kv_bytes_per_token() == full.kv_bytes_per_token() and spec.num_params() == full.num_params()


def test_sliding_window_configs_give_the_presets():
    assert spec_from_hf_config(MISTRAL_7B_V01, "mistral-7b-v0.1") == MODEL_PRESETS["mistral-7b-v0.1"]
    assert spec_from_hf_config(GEMMA_2_9B, "gemma-2-9b") == MODEL_PRESETS["gemma-2-9b"]
    assert spec_from_hf_config({"text_config": GEMMA_3_4B}, "gemma-3-4b") == MODEL_PRESETS["gemma-3-4b"]


@pytest.mark.parametrize("cfg, message", [
    ({**GEMMA_3_4B, "sliding_window": None}, "sliding_window: layer_types names sliding_attention layers, but the "
                                             "config gives no window"),
    ({**MISTRAL_7B_V01, "sliding_window": -1}, "sliding_window: the window must be a positive integer (or null), "
                                               "got -1"),
    ({**MISTRAL_7B_V01, "sliding_window": True}, "sliding_window: the window must be a positive integer"),
    ({**GEMMA_3_4B, "layer_types": ["sliding_attention", "linear_attention"] * 17},
     "layer_types: linear_attention layers are not modelled by kvsim (a transformer of full-attention, "
     "sliding-window and chunked layers is)"),
    ({**GEMMA_3_4B, "sliding_window": None, "layer_types": ["full_attention", "chunked_attention"] * 17},
     "attention_chunk_size: layer_types names chunked_attention layers, but the config gives no chunk"),
    ({**QWEN_2_5_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": -2},
     "max_window_layers: expected a layer count, got -2"),
    ({**GEMMA_3_4B, "layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern: sliding window "
                                                                        "pattern must be a positive integer"),
])
def test_a_bad_sliding_window_is_refused_naming_the_key(cfg, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_hf_config(cfg, "x")


@pytest.mark.parametrize("edit", [
    {"sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28},   # Qwen2.5's: switched off
    {"sliding_window": None},                                                            # Mistral-7B-v0.2 on
    {"sliding_window": 32768},                                                           # covers the whole context
    {"layer_types": ["full_attention"] * 28, "sliding_window": 512},                     # no sliding layer
    {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28},       # every layer below it
    {"decoder_sparse_step": 1, "mlp_only_layers": [], "attention_chunk_size": 32768},
])
def test_a_window_that_is_off_or_covers_the_context_is_full_attention(edit):
    """(and the alike-layer settings: experts on every layer, no dense-only layers, chunks covering the context)"""
    spec = spec_from_hf_config({**QWEN_2_5_7B, **edit}, "x")
    assert spec == spec_from_hf_config(QWEN_2_5_7B, "x")


def test_a_sliding_window_config_file_runs(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MISTRAL_7B_V01))
    out = tmp_path / "out"
    r = _kvsim("run", "scenarios/quickstart.yaml", "--set", f"model={config}", "--set", "workload.limit=50",
               "--no-plots", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 50


# Qwen/Qwen1.5-MoE-A2.7B config.json (the keys that matter)
QWEN_MOE_A2_7B = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
                  "num_experts_per_tok": 4, "decoder_sparse_step": 1, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936,
                  "max_position_embeddings": 8192, "tie_word_embeddings": False}


def test_shared_experts_and_dense_layers_from_a_config():
    assert spec_from_hf_config(QWEN_MOE_A2_7B, "qwen1.5-moe-a2.7b") == MODEL_PRESETS["qwen1.5-moe-a2.7b"]
    # Qwen's layout: layer i has experts where (i + 1) is a multiple of decoder_sparse_step and i is not in
    # mlp_only_layers; of 24 layers, step 2 leaves 12 with experts, and listing 1 (an expert layer) and 2 (a
    # dense one already) makes 11
    stepped = spec_from_hf_config({**QWEN_MOE_A2_7B, "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}, "q")
    assert (stepped.dense_layers, stepped.dense_intermediate_size) == (13, 5632)
    # DeepSeek's: the first first_k_dense_replace layers dense, then experts on each layer i with
    # i % moe_layer_freq == 0; shared experts are n_shared_experts of the experts' width (2 x 1408)
    deepseek = {**QWEN_MOE_A2_7B, "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
                "intermediate_size": 10944, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 27}
    for key in ("num_experts", "shared_expert_intermediate_size", "decoder_sparse_step"):
        deepseek.pop(key)
    spec = spec_from_hf_config(deepseek, "d")
    assert (spec.num_experts, spec.experts_per_token, spec.shared_expert_size) == (64, 6, 2816)
    assert (spec.dense_layers, spec.dense_intermediate_size, spec.intermediate_size) == (1, 10944, 1408)
    # every other layer past the first 3: 3 dense + layers 3, 5, ..., 25 (12 odd) dense of the 24 past them
    sparse = spec_from_hf_config({**deepseek, "first_k_dense_replace": 3, "moe_layer_freq": 2}, "d")
    assert sparse.dense_layers == 3 + 12


# meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E config.json (text_config, the keys that matter)
LLAMA_4_SCOUT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                 "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_hidden_layers": 48,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "max_position_embeddings": 10485760,
                 "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                 "attention_chunk_size": 8192, "tie_word_embeddings": False,
                 "no_rope_layers": [1, 1, 1, 0] * 12, "moe_layers": list(range(48))}
LLAMA_4_MAVERICK = {**LLAMA_4_SCOUT, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                    "max_position_embeddings": 1048576, "moe_layers": list(range(1, 48, 2))}


def test_llama4_configs_give_the_presets():
    # the wrapper's text_config; the RoPE layers (1 in no_rope_layers) attend within chunks of 8,192
    assert spec_from_hf_config({"model_type": "llama4", "text_config": LLAMA_4_SCOUT},
                               "llama-4-scout-17b-16e") == MODEL_PRESETS["llama-4-scout-17b-16e"]
    maverick = spec_from_hf_config(LLAMA_4_MAVERICK, "llama-4-maverick-17b-128e")
    assert maverick == MODEL_PRESETS["llama-4-maverick-17b-128e"]
    # without the lists: every interleave_moe_layer_step-th layer has experts, every fourth attends it all
    bare = {k: v for k, v in LLAMA_4_MAVERICK.items() if k not in ("moe_layers", "no_rope_layers")}
    assert spec_from_hf_config(bare, "llama-4-maverick-17b-128e") == maverick
    assert (maverick.dense_layers, maverick.dense_intermediate_size, maverick.shared_expert_size) == (24, 16384, 8192)
    # cards: 109B and 400B parameters (the vision tower, about 1B, not priced here), 17B active
    assert MODEL_PRESETS["llama-4-scout-17b-16e"].num_params() == pytest.approx(108e9, rel=0.01)
    assert maverick.num_params() == pytest.approx(400e9, rel=0.01)
    assert maverick.activated_params() == pytest.approx(17e9, rel=0.02)
