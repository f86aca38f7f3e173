"""Sliding-window attention (Mistral-7B-v0.1, Gemma 2 and 3, gpt-oss): the window's pairs and reads against a
brute-force count, the attention a step costs by hand, the presets against the model cards, the engine paths
a windowed model takes, and the refusals."""

from __future__ import annotations

import pytest
from result_compare import assert_same, off_and_on

from sim import engine_core
from sim.errors import KvsimError
from sim.executors.cost_model import CostModelExecutor
from sim.executors.local_attention import LocalAttention, chunk_pairs, window_pairs
from sim.executors.roofline import CostParams
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

H100 = HardwareSpec.from_name("h100-80gb")
IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, swap_block_latency_s=0.0)
MISTRAL = ModelSpec.from_name("mistral-7b")
# Mistral-7B's shapes with a 256-token window on 24 of its 32 layers
WINDOWED = MISTRAL.model_copy(update={"sliding_window": 256, "sliding_layers": 24})


@pytest.mark.parametrize("window", [1, 2, 7, 16, 256])
def test_window_pairs_count_each_query_against_its_window(window):
    for c in range(0, 40):
        for n in range(1, 40):
            brute = sum(min(p + 1, window) for p in range(c, c + n))
            assert window_pairs(n, c, window) == brute, (n, c)


@pytest.mark.parametrize("chunk", [1, 3, 16, 64])
def test_chunk_pairs_count_each_query_against_its_chunk(chunk):
    for c in range(0, 150, 7):
        for n in range(1, 150, 5):
            brute = sum(p - (p // chunk) * chunk + 1 for p in range(c, c + n))
            assert chunk_pairs(n, c, chunk) == brute, (n, c)


def test_a_wide_window_is_the_full_attention():
    # a window no context reaches: every figure is the full layers' (n c + n (n + 1) / 2, c, c + 1)
    entries = [ScheduledRequest(0, 100, 900, []), ScheduledRequest(1, 1, 499, []), ScheduledRequest(2, 1, 7, [])]
    assert LocalAttention(10_000).step_stats(entries) == (500 + 8, 100 * 900 + 5050, 900)
    # a window of 64: the chunk's first query sees 63 cached tokens, each of its 100 queries 64 keys; the
    # decodes read 64 and 8 keys
    assert LocalAttention(64).step_stats(entries) == (64 + 8, 100 * 64, 63)
    # chunks of 256: the chunk's first query (at 900) is in the chunk from 768, so it sees 132 cached tokens,
    # and the queries 900 .. 999 see 133 .. 232 keys; the decodes at 499 and 7 see 244 and 8 keys
    assert LocalAttention(256, chunked=True).step_stats(entries) == (244 + 8, sum(range(133, 233)), 132)


def _attention(plan: StepPlan, model: ModelSpec, engine: bool = False) -> float:
    if engine:   # the shipped H100 calibration's engine terms
        from sim.executors.cost_model import make_cost_model_executor

        exe = make_cost_model_executor(model=model, hardware=H100)
    else:
        exe = CostModelExecutor(model, H100, CostParams(**IDEAL))
    return exe.execute(plan).breakdown["attention"]


def test_a_decode_reads_the_window_on_its_sliding_layers():
    # one decode at context 1,000 (1,001 keys a full layer reads, 256 a sliding one) at ideal efficiencies:
    # each key is 8 KV heads x 128 x 2 (K, V) x 2 bytes = 4,096 bytes; the query and output 2 x 4,096 x 2 bytes
    # and the new K and V 4,096 bytes are read or written either way
    qo = 2 * 4096 * 2 + 4096
    full = (1001 * 4096 + qo) / 3.35e12
    window = (256 * 4096 + qo) / 3.35e12
    plan = StepPlan(scheduled=[ScheduledRequest(0, 1, 1000, [])])
    assert _attention(plan, MISTRAL) == pytest.approx(32 * full, rel=1e-12)
    assert _attention(plan, WINDOWED) == pytest.approx(8 * full + 24 * window, rel=1e-12)
    # below the window every layer reads the whole context
    short = StepPlan(scheduled=[ScheduledRequest(0, 1, 200, [])])
    assert _attention(short, WINDOWED) == pytest.approx(_attention(short, MISTRAL), rel=1e-12)


def test_a_prefill_attends_its_window():
    # a chunk of 512 new tokens after 1,000 cached ones: a full layer's 512 x 1,000 + 131,328 pairs and 1,000
    # cached tokens read, a sliding layer's 512 x 256 pairs and 255 cached tokens (compute bound either way:
    # 4 x 128 x 32 FLOPs a pair)
    flops = 4 * 128 * 32
    new = 512 * (2 * 4096 * 2 + 4096)
    full = max(flops * (512 * 1000 + 512 * 513 // 2) / 989e12, (new + 1000 * 4096) / 3.35e12)
    window = max(flops * 512 * 256 / 989e12, (new + 255 * 4096) / 3.35e12)
    plan = StepPlan(scheduled=[ScheduledRequest(0, 512, 1000, [])])
    assert _attention(plan, WINDOWED) == pytest.approx(8 * full + 24 * window, rel=1e-12)


def test_the_engine_step_prices_the_window_too():
    # the engine's decode attention is linear in the keys read: a step of 64 decodes at context 2,000 costs
    # the sliding layers what 64 decodes at context 255 (256 keys each) cost the full model
    long = StepPlan(scheduled=[ScheduledRequest(i, 1, 2000, []) for i in range(64)])
    at_window = StepPlan(scheduled=[ScheduledRequest(i, 1, 255, []) for i in range(64)])
    expect = (8 * _attention(long, MISTRAL, True) + 24 * _attention(at_window, MISTRAL, True)) / 32
    assert _attention(long, WINDOWED, True) == pytest.approx(expect, rel=1e-12)
    assert _attention(long, WINDOWED, True) < 0.4 * _attention(long, MISTRAL, True)


def test_presets_against_the_model_cards():
    cards = {"gemma-2-9b": 9.24e9, "gemma-2-27b": 27.2e9, "gemma-3-27b": 27.0e9, "mistral-7b-v0.1": 7.24e9}
    for name, params in cards.items():
        assert ModelSpec.from_name(name).num_params() == pytest.approx(params, rel=0.005), name
    # Gemma 3: 5 of every 6 layers slide (62 layers: 52); Gemma 2: every other (46: 23)
    assert ModelSpec.from_name("google/gemma-3-27b-it").local_layers == 62 - 62 // 6 == 52
    assert ModelSpec.from_name("google/gemma-2-27b-it").local_layers == 23
    assert ModelSpec.from_name("mistralai/Mistral-7B-Instruct-v0.1").local_layers == 32
    assert ModelSpec.from_name("mistralai/Mistral-7B-Instruct-v0.2").local_layers == 0


def _scenario(model, **extra) -> dict:
    return {"name": "window", "model": model, "hardware": "h100-80gb",
            "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 2048, "max_num_seqs": 32},
            "workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 8.0},
                                       "prompt_len": {"dist": "uniform", "min": 100, "max": 3000},
                                       "output_len": {"dist": "uniform", "min": 5, "max": 300}}},
            "output": {"plots": False}, **extra}


def test_a_windowed_model_runs_in_the_core_as_in_the_loop_and_the_same_twice(monkeypatch):
    model = WINDOWED.model_dump()   # (the loop's invariants: tests/test_window_pages.py, on small caches; the
    loop, a = off_and_on(monkeypatch, engine_core, "enabled",   # core checks its own after every step here)
                         lambda: run_scenario(scenario_from_dict(_scenario(model)), check_integrity=engine_core.enabled))
    b = run_scenario(scenario_from_dict(_scenario(model)), check_integrity=False)
    assert a.summary["num_finished"] == 60 and a.profile["compiled_core"] and not loop.profile["compiled_core"]
    assert_same(loop, a)
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    full = run_scenario(scenario_from_dict(_scenario(MISTRAL.model_dump())), check_integrity=False)
    # cheaper decodes past the window; the same bytes in blocks of 8 layers (sim/kv/window_pages.py), or with
    # every token kept in the full model's blocks of 32
    assert a.summary["tpot_s"]["mean"] < full.summary["tpot_s"]["mean"]
    blocks = full.summary["num_gpu_blocks"]
    assert 4 * blocks <= a.summary["num_gpu_blocks"] < 4 * blocks + 4
    kept = run_scenario(scenario_from_dict(_scenario(model, kv_cache={"hybrid_manager": False})), check_integrity=False)
    assert kept.summary["num_gpu_blocks"] == blocks


def test_a_window_no_context_reaches_runs_as_the_full_model():
    # prompts and outputs under 3,300 tokens against a window of 4,000, every token kept: the same steps,
    # prices equal to within rounding (the layers are summed in two parts)
    wide = MISTRAL.model_copy(update={"sliding_window": 4000, "sliding_layers": 16}).model_dump()
    a = run_scenario(scenario_from_dict(_scenario(wide, kv_cache={"hybrid_manager": False})), check_integrity=False)
    b = run_scenario(scenario_from_dict(_scenario(MISTRAL.model_dump())), check_integrity=False)
    assert len(a.steps) == len(b.steps)
    assert a.steps["duration_s"].to_numpy() == pytest.approx(b.steps["duration_s"].to_numpy(), rel=1e-12)


def test_refusals_name_the_key():
    base = {"workload": {"requests": [{"prompt_len": 5, "output_len": 2}]}}
    with pytest.raises(KvsimError, match="sliding_layers needs sliding_window"):
        scenario_from_dict({**base, "model": {**MISTRAL.model_dump(), "sliding_layers": 4}})
    with pytest.raises(KvsimError, match=r"sliding_layers \(40\) must be at most num_layers \(32\)"):
        scenario_from_dict({**base, "model": {**MISTRAL.model_dump(), "sliding_window": 64, "sliding_layers": 40}})
    with pytest.raises(KvsimError, match="has sliding-window layers: a draft model's passes"):
        scenario_from_dict({**base, "model": "gemma-2-27b", "hardware": "h100-80gb",
                            "speculative": {"method": "draft_model", "model": "gemma-2-9b",
                                            "num_speculative_tokens": 2, "acceptance_rate": 0.6}})
    from backend.executor import make_gpu_executor

    with pytest.raises(KvsimError, match="the GPU backend's kernels attend the whole context"):
        make_gpu_executor(model=WINDOWED, hardware=H100, config=None, kv=None, num_gpu_blocks=1, num_cpu_blocks=0)


def test_an_eagle_head_of_a_windowed_target_attends_the_whole_context():
    from sim.speculative import SpeculativeConfig, drafter_model

    cfg = SpeculativeConfig(method="eagle", num_speculative_tokens=2, acceptance_rate=0.6)
    head = drafter_model(cfg, WINDOWED)
    assert head.num_layers == 1 and head.local_layers == 0
    run = run_scenario(scenario_from_dict(_scenario(WINDOWED.model_dump(), kv_cache={"hybrid_manager": False,
                                                                                     "num_gpu_blocks": 2000},
                                                    speculative={"method": "eagle", "num_speculative_tokens": 2,
                                                                 "acceptance_rate": 0.6})), check_integrity=True)
    assert run.summary["num_finished"] == 60


def test_chunked_layers_read_their_chunk():
    # Mistral-7B's shapes with 24 of 32 layers attending within chunks of 256 (Llama 4's kind): a decode at
    # context 1,000 (position 1,000, in the chunk from 768) reads 233 keys there, 1,001 on the full layers
    chunked = MISTRAL.model_copy(update={"attention_chunk_size": 256, "chunked_layers": 24})
    qo = 2 * 4096 * 2 + 4096
    full = (1001 * 4096 + qo) / 3.35e12
    local = (233 * 4096 + qo) / 3.35e12
    plan = StepPlan(scheduled=[ScheduledRequest(0, 1, 1000, [])])
    assert _attention(plan, chunked) == pytest.approx(8 * full + 24 * local, rel=1e-12)
    # a chunk of 512 new tokens after 1,000 cached: the queries 1,000 .. 1,023 see 233 .. 256 keys (the chunk
    # from 768), those from 1,024 on start a chunk of their own: 1 .. 256, then 1 .. 232; 232 cached tokens read
    flops = 4 * 128 * 32
    new = 512 * (2 * 4096 * 2 + 4096)
    pairs = sum(range(233, 257)) + sum(range(1, 257)) + sum(range(1, 233))
    local = max(flops * pairs / 989e12, (new + 232 * 4096) / 3.35e12)
    full = max(flops * (512 * 1000 + 512 * 513 // 2) / 989e12, (new + 1000 * 4096) / 3.35e12)
    prefill = StepPlan(scheduled=[ScheduledRequest(0, 512, 1000, [])])
    assert _attention(prefill, chunked) == pytest.approx(8 * full + 24 * local, rel=1e-12)


def test_llama4_scout_runs_with_chunk_pages(monkeypatch):
    # 12 full layers and 36 chunked ones: blocks of 12 layers, three chunked groups; prompts crossing chunks
    scout = ModelSpec.from_name("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert scout.kv_pages() == (12, 3)
    data = {**_scenario("llama-4-scout-17b-16e"), "hardware": {"name": "h100-80gb", "tensor_parallel": 4}}
    data["workload"]["synthetic"].update(num_requests=30, prompt_len={"dist": "uniform", "min": 6000, "max": 20000})
    loop, run = off_and_on(monkeypatch, engine_core, "enabled",
                           lambda: run_scenario(scenario_from_dict(data), check_integrity=True))
    assert run.summary["num_finished"] == 30 and run.profile["compiled_core"]
    assert_same(loop, run)


def test_chunk_pages_of_a_long_sequence_by_hand():
    # Llama 4 Scout, 100,000 tokens: its table of 6,250 blocks (16 tokens of the 12 full layers each) and, for
    # each of 3 chunked groups, the blocks of the chunk its next query is in (from 98,304 = 12 x 8,192: 106
    # blocks); a block of 12 layers is 16 x 12 x 8 KV heads x 128 x 2 x 2 bytes
    from sim.commands.kv_size import kv_size, pages_per_sequence

    scout = ModelSpec.from_name("llama-4-scout-17b-16e")
    assert pages_per_sequence(scout, 100_000, 16) == 6250 + 3 * (6250 - 98_304 // 16) == 6568
    info = kv_size(scout, 100_000, "fp16", 16)
    assert info["bytes_per_block"] == 16 * 12 * 8 * 128 * 2 * 2 == 786_432
    assert info["bytes_per_sequence_paged"] == 6568 * 786_432
    # kept for the next query alone: 12 full layers x 100,000 tokens, 36 chunked x the 1,696 of its chunk
    assert info["bytes_per_sequence_window_only"] == (12 * 100_000 + 36 * 1_696) * 8 * 128 * 2 * 2
