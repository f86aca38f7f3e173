"""Speculative decoding (sim/speculative.py, sim/executors/drafter.py): the acceptance draws against their
distribution by hand, token and block accounting by hand, the drafter's memory by hand, its price against
the draft model's own executor, and the refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.errors import KvsimError
from sim.executors.cost_model import make_cost_model_executor
from sim.output import summary_json
from sim.runner import gpu_blocks, run_scenario
from sim.scenario import scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec
from sim.speculative import Speculation, SpeculativeConfig

ROOT = Path(__file__).resolve().parents[1]


def _scn(requests, speculative, **kw):
    data = {"name": "spec", "model": kw.pop("model", "llama-2-7b"), "hardware": kw.pop("hardware", "a100-80gb"),
            "kv_cache": {"block_size": 16, "num_gpu_blocks": kw.pop("blocks", 200)},
            "scheduler": {"max_num_seqs": 8, "chunked_prefill": True, "max_num_batched_tokens": 512},
            "workload": {"requests": requests}, "output": {"plots": False}, "frontend": {"enabled": False}}
    if speculative is not None:
        data["speculative"] = speculative
    data.update(kw)
    return scenario_from_dict(data)


# ---------------------------------------------------------------- the draws


@pytest.mark.parametrize("rate, expected", [
    (0.6, [0.4, 0.6 * 0.4, 0.36 * 0.4, 0.216]),                      # P(a = j) = 0.6^j x 0.4, P(a = 3) = 0.6^3
    ([0.9, 0.5, 0.2], [0.1, 0.9 * 0.5, 0.9 * 0.5 * 0.8, 0.9 * 0.5 * 0.2]),   # per position, conditional
])
def test_accepted_drafts_follow_the_leading_run_distribution(rate, expected):
    spec = Speculation(SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_rate=rate), seed=7)
    n = 200_000
    counts = np.bincount([spec.accept(0, 3) for _ in range(n)], minlength=4) / n
    for got, p in zip(counts, expected):
        assert abs(got - p) < 4 * math.sqrt(p * (1 - p) / n)   # four standard errors
    mean = sum(j * p for j, p in enumerate(expected))
    assert spec.summary()["acceptance_rate"] == pytest.approx(mean / 3, abs=0.005)
    assert spec.summary()["mean_acceptance_length"] == pytest.approx(1 + mean, abs=0.015)


def test_fewer_drafts_cut_the_run_and_the_stream_is_seeded():
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=4, acceptance_rate=1.0)
    assert Speculation(cfg, 0).accept(0, 2) == 2                      # a run never passes the drafts proposed
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=4, acceptance_rate=0.5)
    draws = [[Speculation(cfg, seed, rep).accept(0, 4) for _ in range(1)] for seed, rep in ((1, 0), (1, 0))]
    assert draws[0] == draws[1]
    a, b = Speculation(cfg, 1, 0), Speculation(cfg, 1, 1)
    assert [a.accept(0, 4) for _ in range(50)] != [b.accept(0, 4) for _ in range(50)]   # each replica its own stream


# ---------------------------------------------------------------- tokens and blocks, by hand


def test_every_draft_accepted_gives_k_plus_one_tokens_a_step():
    # prompt 32, 11 tokens: the prefill samples 1; then 1 + 4 drafts verified and all accepted: 5 a step, twice
    res = run_scenario(_scn([{"arrival": 0.0, "prompt_len": 32, "output_len": 11}],
                            {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 1.0}),
                       check_integrity=True)
    assert res.steps["num_decode_tokens"].tolist() == [0, 5, 5]
    assert res.steps["num_prefill_tokens"].tolist() == [32, 0, 0]
    s = res.summary["speculative"]
    assert (s["verifications"], s["draft_tokens"], s["accepted_tokens"]) == (2, 8, 8)
    assert s["mean_acceptance_length"] == 5.0
    assert res.requests[["draft_tokens", "accepted_tokens"]].values.tolist() == [[8, 8]]
    # 10 tokens: the second verification has 4 tokens left, so 3 drafts (the last token is the target's)
    res = run_scenario(_scn([{"arrival": 0.0, "prompt_len": 32, "output_len": 10}],
                            {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 1.0}),
                       check_integrity=True)
    assert res.steps["num_decode_tokens"].tolist() == [0, 5, 4]


def test_every_draft_rejected_gives_one_token_and_gives_the_slots_back():
    # prompt 30 (2 blocks of 16), 5 tokens, k = 4, nothing accepted: each step verifies min(4, left - 1) drafts
    # and keeps one token. Step 2 computes 30 + 4 tokens (3 blocks), keeps 31: its third block goes back.
    res = run_scenario(_scn([{"arrival": 0.0, "prompt_len": 30, "output_len": 5}],
                            {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 0.0}),
                       check_integrity=True)
    assert res.steps["num_decode_tokens"].tolist() == [0, 4, 3, 2, 1]
    # blocks held after each step: 30 -> 2, 31 -> 2, 32 -> 2, 33 -> 3, then finished -> 0
    assert res.steps["kv_blocks_used"].tolist() == [2, 2, 2, 3, 0]
    s = res.summary["speculative"]
    assert (s["verifications"], s["draft_tokens"], s["accepted_tokens"]) == (3, 6, 0)
    assert s["acceptance_rate"] == 0.0


def test_same_scenario_same_run_and_no_block_leaks_under_pressure():
    rng = np.random.default_rng(3)
    reqs = [{"arrival": float(i) * 0.01, "prompt_len": int(rng.integers(20, 200)),
             "output_len": int(rng.integers(2, 120))} for i in range(60)]
    spec = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": [0.8, 0.6, 0.4]}
    runs = [run_scenario(_scn(reqs, spec, blocks=60), check_integrity=True) for _ in range(2)]
    for r in runs:
        assert (r.requests["status"] == "FINISHED").all()
        assert r.summary["num_preemptions"] > 0      # (the cache is small: preemption with drafts in flight)
    a, b = (dict(r.summary) for r in runs)
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert summary_json(a) == summary_json(b)


def test_a_cluster_sums_its_replicas_drafts():
    reqs = [{"arrival": float(i) * 0.02, "prompt_len": 40, "output_len": 30} for i in range(20)]
    spec = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 1.0}
    res = run_scenario(_scn(reqs, spec, cluster={"replicas": 2}), check_integrity=True)
    # every request: a prefill token, then 29 tokens at 3 a step (2 drafts + 1): 9 full steps and one of 2 tokens
    s = res.summary["speculative"]
    assert s["verifications"] == 20 * 10
    assert s["draft_tokens"] == s["accepted_tokens"] == 20 * (9 * 2 + 1)
    assert (res.requests["draft_tokens"] == 19).all() and (res.requests["accepted_tokens"] == 19).all()


# ---------------------------------------------------------------- memory, by hand


def test_a_draft_model_takes_its_weights_and_its_kv_from_the_cache():
    # Llama-3.1-8B (8,030,261,248 parameters) with Llama-3.2-1B (1,235,814,400, tied embeddings) on one H100:
    # 80 GiB x 0.9, less 5% reserve, less both weights in fp16, over a block of both models' K and V
    hbm = 80 * 2**30 * 0.9
    free = hbm - 0.05 * hbm - 2 * 8_030_261_248 - 2 * 1_235_814_400
    target_block = 2 * 32 * 8 * 128 * 2 * 16   # K and V, 32 layers, 8 KV heads of 128, fp16, 16 tokens
    draft_block = 2 * 16 * 8 * 64 * 2 * 16     # 16 layers, 8 KV heads of 64
    scn = _scn([{"arrival": 0.0, "prompt_len": 8, "output_len": 4}],
               {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4,
                "acceptance_rate": 0.7}, model="llama-3.1-8b", hardware="h100-80gb")
    scn.kv_cache.num_gpu_blocks = None
    assert HardwareSpec.from_name("h100-80gb").hbm_bytes == 80 * 2**30
    assert gpu_blocks(scn) == math.floor(free / (target_block + draft_block))
    res = run_scenario(scn)
    budget = res.summary["hbm_budget"]
    assert budget["draft_weights_bytes"] == 2 * 1_235_814_400
    assert budget["draft_kv_cache_bytes"] == gpu_blocks(scn) * draft_block
    assert budget["weights_bytes"] + budget["activation_reserve_bytes"] + budget["kv_cache_bytes"] \
        + budget["unused_bytes"] == budget["hbm_bytes"]


def test_an_eagle_head_is_one_layer_and_a_fusion_layer():
    # one Llama-3.1-8B layer: Q and O 4096 x 4096, K and V 4096 x 1024, a gated MLP 3 x 4096 x 14336, two norms;
    # the fusion layer 2 x 4096 x 4096; fp16. Its KV: one layer's.
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    head = 2 * (layer + 2 * 4096 * 4096)
    hbm = 80 * 2**30 * 0.9
    free = hbm - 0.05 * hbm - 2 * 8_030_261_248 - head
    scn = _scn([{"arrival": 0.0, "prompt_len": 8, "output_len": 4}],
               {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7},
               model="llama-3.1-8b", hardware="h100-80gb")
    scn.kv_cache.num_gpu_blocks = None
    assert gpu_blocks(scn) == math.floor(free / (2 * 32 * 8 * 128 * 2 * 16 + 2 * 1 * 8 * 128 * 2 * 16))


def test_an_eagle3_head_has_a_wider_qkv_a_three_way_fusion_and_its_own_lm_head():
    # one Llama-3.1-8B layer as above, its QKV projection reading 2 x 4096 (4096 x 6144 more), the fusion layer
    # 3 x 4096 x 4096, its own LM head of 32,000 x 4096 (the published EAGLE-3 heads' vocabulary); fp16
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    for vocab, spec in ((32000, {}), (16000, {"draft_vocab_size": 16000})):
        head = 2 * (layer + 4096 * 6144 + 3 * 4096 * 4096 + vocab * 4096)
        hbm = 80 * 2**30 * 0.9
        free = hbm - 0.05 * hbm - 2 * 8_030_261_248 - head
        scn = _scn([{"arrival": 0.0, "prompt_len": 8, "output_len": 4}],
                   {"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.7, **spec},
                   model="llama-3.1-8b", hardware="h100-80gb")
        scn.kv_cache.num_gpu_blocks = None
        assert gpu_blocks(scn) == math.floor(free / (2 * 32 * 8 * 128 * 2 * 16 + 2 * 1 * 8 * 128 * 2 * 16))
        assert run_scenario(scn).summary["hbm_budget"]["draft_weights_bytes"] == head


# ---------------------------------------------------------------- prices


def test_an_eagle3_head_drafts_for_about_half_what_an_eagle_head_does_at_batch_one():
    # one request on an H100: a draft pass reads the head's weights once, so the draft parts stand as the bytes
    # read a step. EAGLE: 3 x (layer + fusion 2H x H + the target's LM head, 128,256 x 4096); EAGLE-3: 3 x (layer
    # + the QKV's second input half + an LM head of 32,000 x 4096) + its fusion 3H x H once. Attention over a
    # short context and the launches add little: the ratio of the parts within 10% of the ratio of the bytes
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    eagle = 3 * (layer + 2 * 4096 * 4096 + 128256 * 4096)
    eagle3 = 3 * (layer + 4096 * 6144 + 32000 * 4096) + 3 * 4096 * 4096
    parts = {}
    for method in ("eagle", "eagle3"):
        scn = _scn([{"arrival": 0.0, "prompt_len": 100, "output_len": 40}],
                   {"method": method, "num_speculative_tokens": 3, "acceptance_rate": 0.0},
                   model="llama-3.1-8b", hardware="h100-80gb")
        parts[method] = run_scenario(scn, check_integrity=True).steps["time_draft_s"].iloc[1]
    assert parts["eagle3"] / parts["eagle"] == pytest.approx(eagle3 / eagle, rel=0.10)
    assert 0.45 < eagle3 / eagle < 0.55


def test_the_draft_passes_cost_what_the_draft_model_charges_for_its_steps():
    # a step verifying drafts pays k passes of the draft model: against the draft model's own executor pricing
    # each pass as a step (its GPU work, without its per-step overhead). One request, prompt 100: step 1
    # prefills it; step 2 verifies 4 drafts over a context of 100 computed tokens. Pass 0 runs over the 5
    # tokens the target verified (vLLM's padded drafter batch), a verification of the draft model's own with
    # one row of logits instead of five; passes 1 to 3 decode one token at contexts 100 + j
    scn = _scn([{"arrival": 0.0, "prompt_len": 100, "output_len": 40}],
               {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4, "acceptance_rate": 0.0},
               model="llama-3.1-8b", hardware="h100-80gb")
    steps = run_scenario(scn, check_integrity=True).steps
    draft = make_cost_model_executor(model=ModelSpec.from_name("llama-3.2-1b"), hardware=scn.hardware_spec,
                                     config=scn.executor, kv=scn.kv_cache, scheduler=scn.scheduler)
    first = draft.execute(StepPlan(scheduled=[ScheduledRequest(0, 5, 100, [], 4)]))
    want = first.duration_s - first.breakdown["overhead"] - first.breakdown["draft"] \
        - (draft._lm_head(5) - draft._lm_head(1))
    for j in range(1, 4):
        r = draft.execute(StepPlan(scheduled=[ScheduledRequest(0, 1, 100 + j, [])]))
        want += r.duration_s - r.breakdown["overhead"]
    assert steps["num_decode_tokens"].iloc[1] == 5
    assert steps["time_draft_s"].iloc[1] == pytest.approx(want, rel=1e-12)
    assert steps["time_draft_s"].iloc[0] == 0.0   # (a prefill step verifies nothing)


def test_verifying_drafts_at_a_small_batch_costs_about_one_decode():
    # the premise of speculative decoding: at a small batch a step reads the weights once whatever its few
    # tokens, so verifying 4 tokens costs little more than decoding 1 (Llama-3.1-8B, H100, one request)
    scn = _scn([{"arrival": 0.0, "prompt_len": 8, "output_len": 4}], None, model="llama-3.1-8b",
               hardware="h100-80gb")
    ex = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                  kv=scn.kv_cache, scheduler=scn.scheduler)
    one = ex.execute(StepPlan(scheduled=[ScheduledRequest(0, 1, 1000, [])])).duration_s
    four = ex.execute(StepPlan(scheduled=[ScheduledRequest(0, 4, 1000, [], 3)])).duration_s
    assert one < four < 1.1 * one


def test_speculation_speeds_up_a_light_load_and_slows_a_saturated_one():
    # one request at a time: well-accepted drafts cut the time per output token; a saturated engine (256
    # requests at once) spends its compute on drafts it mostly rejects and serves fewer tokens a second
    light = [{"arrival": float(i), "prompt_len": 200, "output_len": 100} for i in range(4)]
    base, fast = (run_scenario(_scn(light, spec, model="llama-3.1-8b", hardware="h100-80gb", blocks=4000))
                  for spec in (None, {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.8}))
    assert fast.summary["tpot_s"]["mean"] < 0.6 * base.summary["tpot_s"]["mean"]
    heavy = [{"arrival": 0.0, "prompt_len": 200, "output_len": 100} for _ in range(256)]
    sched = {"max_num_seqs": 256, "chunked_prefill": True, "max_num_batched_tokens": 2048}
    base, slow = (run_scenario(_scn(heavy, spec, model="llama-3.1-8b", hardware="h100-80gb", blocks=4000,
                                    scheduler=sched))
                  for spec in (None, {"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 5,
                                      "acceptance_rate": 0.2}))
    assert slow.summary["output_throughput_tok_s"] < base.summary["output_throughput_tok_s"]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("extra, spec, key, words", [
    ({"scheduler": {"batching": "static"}}, {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative", "scheduler.batching: continuous"),
    ({"kv_cache": {"allocator": "contiguous-max"}},
     {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative", "allocator: paged"),
    ({}, {"method": "draft_model", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative.model",
     "needs the draft model"),
    ({}, {"method": "eagle", "model": "llama-3.2-1b", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative.model", "only method draft_model"),
    ({}, {"method": "draft_model", "model": "llama-2-7b", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative.model", "tokenizer"),
    ({}, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": [0.5, 0.4]},
     "speculative.acceptance_rate", "2 rates for num_speculative_tokens 3"),
    ({}, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 1.5}, "speculative.acceptance_rate",
     "probability"),
    ({}, {"method": "ngram", "num_speculative_tokens": 0, "acceptance_rate": 0.5},
     "speculative.num_speculative_tokens", "greater than or equal to 1"),
    ({}, {"method": "medusa", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative.method", ""),
    ({}, {"method": "eagle", "draft_vocab_size": 32000, "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative.draft_vocab_size", "only method eagle3"),
    ({}, {"method": "eagle3", "draft_vocab_size": 200000, "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative.draft_vocab_size", "more than the target"),
    ({}, {"method": "eagle3", "model": "llama-3.2-1b", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
     "speculative.model", "only method draft_model"),
])
def test_bad_settings_are_refused_naming_the_key(extra, spec, key, words):
    data = {"model": "llama-3.1-8b", "workload": {"requests": [{"arrival": 0, "prompt_len": 8, "output_len": 4}]},
            "speculative": spec, **extra}
    with pytest.raises(KvsimError) as e:
        scenario_from_dict(data, source="s.yaml")
    assert f"{key}:" in str(e.value) and words in str(e.value)


def test_the_cli_refuses_in_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: llama-3.1-8b\nworkload:\n  requests:\n    - {arrival: 0, prompt_len: 8, output_len: 4}\n"
                    "speculative:\n  method: draft_model\n  num_speculative_tokens: 3\n  acceptance_rate: 0.7\n")
    out = subprocess.run([sys.executable, "-m", "sim.cli", "run", str(path), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:5" in lines[0] and "speculative.model" in lines[0], out.stderr
    assert not (tmp_path / "o").exists()


def test_parallel_samples_are_refused_with_speculation():
    data = {"model": "llama-2-7b", "kv_cache": {"num_gpu_blocks": 100},
            "workload": {"requests": [{"arrival": 0, "prompt_len": 8, "output_len": 4, "n": 2}]},
            "speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}}
    with pytest.raises(KvsimError) as e:
        run_scenario(scenario_from_dict(data, source="s.yaml"))
    assert "speculative:" in str(e.value) and "n=2" in str(e.value)


def test_enabled_false_runs_without_drafts():
    reqs = [{"arrival": 0.0, "prompt_len": 32, "output_len": 11}]
    spec = {"enabled": False, "method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 1.0}
    res = run_scenario(_scn(reqs, spec))
    assert "speculative" not in res.summary and res.summary["num_steps"] == 11   # a prefill and 10 decodes


def test_a_mean_acceptance_length_is_read_as_one_rate_at_every_position():
    # 3 drafts and 2.7 tokens a step: 1 + a + a^2 + a^3 = 2.7 (a = 0.7: 2.533, a = 0.75: 2.734)
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=3, mean_acceptance_length=2.7)
    a = cfg.rates()
    assert len(set(a)) == 1 and 0.7 < a[0] < 0.75
    assert 1 + a[0] + a[0] ** 2 + a[0] ** 3 == pytest.approx(2.7, abs=1e-12)
    spec = Speculation(cfg, seed=5)
    for _ in range(100_000):
        spec.accept(0, 3)
    assert spec.summary()["mean_acceptance_length"] == pytest.approx(2.7, abs=0.01)
    for extra, words in (({"acceptance_rate": 0.5}, "not both"), ({"mean_acceptance_length": 4.5}, "more than 3 drafts"),
                         ({"mean_acceptance_length": None}, "required")):
        spec = {"method": "ngram", "num_speculative_tokens": 3, "mean_acceptance_length": 2.7, **extra}
        with pytest.raises(KvsimError) as e:
            scenario_from_dict({"workload": {"requests": [{"prompt_len": 8, "output_len": 4}]}, "speculative": spec})
        assert words in str(e.value)


@pytest.mark.parametrize("engine", [True, False])
def test_the_draft_work_in_scalars_is_the_decode_steps_parts(engine):
    # decode_work_s (the drafter's pricing) against execute_decode_sums, the decode runs' pricing, part by part
    scn = _scn([{"arrival": 0.0, "prompt_len": 8, "output_len": 4}], None, model="llama-3.2-1b", hardware="h100-80gb",
               executor={"engine": engine})
    ex = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                  kv=scn.kv_cache, scheduler=scn.scheduler)
    for seqs, ctx0, k in ((1, 101, 4), (7, 3000, 3), (64, 64 * 900, 5)):
        run = ex.execute_decode_sums(seqs, ctx0, k)
        want = float((run.durations - run.breakdown["overhead"]).sum())
        assert ex.decode_work_s(seqs, ctx0, k) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_decode_replicas_of_a_disaggregated_cluster_speculate(mode):
    # prefill replicas sample one token each and hand over. A decode replica's first step of a request is a
    # plain decode (its drafter has not run on it yet, as in vLLM): token 2; then 27 tokens at 3 a step (9
    # steps of 2 drafts, all accepted), and the last one alone (no draft past the output)
    reqs = [{"arrival": float(i) * 0.01, "prompt_len": 64, "output_len": 30} for i in range(12)]
    spec = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 1.0}
    cluster = {"prefill": {"replicas": 1}, "decode": {"replicas": 2},
               "kv_transfer": {"link": "nvlink", "mode": mode}}
    res = run_scenario(_scn(reqs, spec, cluster=cluster), check_integrity=True)
    assert (res.requests["status"] == "FINISHED").all()
    s = res.summary["speculative"]
    assert s["verifications"] == 12 * 9 and s["draft_tokens"] == s["accepted_tokens"] == 12 * 18
    assert (res.requests["draft_tokens"] == 18).all()


def test_prefix_cache_hits_are_the_same_with_drafts_rejected():
    # a cache large enough to evict nothing: hits come from prompts alone, so rejected drafts (their blocks
    # taken and given back every step) change none of them
    reqs = [{"arrival": float(i) * 0.05, "prompt_len": 300, "output_len": 40, "prefix_group": i % 2,
             "prefix_len": 256} for i in range(16)]
    runs = [run_scenario(_scn(reqs, spec, blocks=2000, kv_cache={"block_size": 16, "num_gpu_blocks": 2000,
                                                                  "prefix_caching": True}), check_integrity=True)
            for spec in (None, {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 0.0})]
    # each prompt of 300 tokens starts with its group's 256 (16 full blocks): every request after the first of
    # its group finds them, 14 x 256 of the 16 x 300 prompt tokens
    for r in runs:
        assert r.summary["prefix_cache_hit_rate"] == pytest.approx(14 * 256 / (16 * 300))


def test_kv_size_counts_a_drafter_beside_the_target():
    # the memory test's by-hand figures through `kvsim kv-size --draft-model`
    hbm = 80 * 2**30 * 0.9
    free = hbm - 0.05 * hbm - 2 * 8_030_261_248 - 2 * 1_235_814_400
    out = subprocess.run([sys.executable, "-m", "sim.cli", "kv-size", "--model", "llama-3.1-8b", "--seq-len", "4096",
                          "--hardware", "h100-80gb", "--draft-model", "llama-3.2-1b", "--json"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    fits = json.loads(out.stdout)["fits"]
    assert fits["kv_blocks"] == math.floor(free / (2 * 32 * 8 * 128 * 2 * 16 + 2 * 16 * 8 * 64 * 2 * 16))
    assert fits["hbm_budget"]["draft_weights_bytes"] == 2 * 1_235_814_400
    bad = subprocess.run([sys.executable, "-m", "sim.cli", "kv-size", "--model", "llama-3.1-8b", "--seq-len", "64",
                          "--hardware", "h100-80gb", "--draft-model", "llama-2-7b"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "tokenizer" in bad.stderr


def test_kv_size_counts_an_eagle3_head():
    # the EAGLE-3 memory test's by-hand head through `kvsim kv-size --eagle3`: one layer of K and V a block
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    head = 2 * (layer + 4096 * 6144 + 3 * 4096 * 4096 + 32000 * 4096)
    hbm = 80 * 2**30 * 0.9
    free = hbm - 0.05 * hbm - 2 * 8_030_261_248 - head
    out = subprocess.run([sys.executable, "-m", "sim.cli", "kv-size", "--model", "llama-3.1-8b", "--seq-len", "4096",
                          "--hardware", "h100-80gb", "--eagle3", "--json"], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    fits = json.loads(out.stdout)["fits"]
    assert fits["kv_blocks"] == math.floor(free / (2 * 32 * 8 * 128 * 2 * 16 + 2 * 1 * 8 * 128 * 2 * 16))
    assert fits["hbm_budget"]["draft_weights_bytes"] == head


def test_eagle_speed_ups_against_a_public_measurement():
    # scripts/speculative_latency_check.py: vLLM issue 20780's MT-Bench figures for Llama-3.1-8B at batch size 1
    # (AL and TPOT for k = 2..7, an EAGLE head), fitted to nothing: each k's speed-up over decoding without
    # drafts within 15% of the measured one, and the best k the measured best (3)
    import importlib.util

    spec = importlib.util.spec_from_file_location("spec_check", ROOT / "scripts" / "speculative_latency_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    base = check.predicted_tpot_ms()
    measured = [check.TPOT_MS["none"] / t for t in check.TPOT_MS["eagle"]]
    predicted = [base / check.predicted_tpot_ms("eagle", k, al) for k, al in zip(check.KS, check.AL["eagle"])]
    for k, m, p in zip(check.KS, measured, predicted):
        assert p == pytest.approx(m, rel=0.15), k
    best = check.KS[max(range(len(check.KS)), key=lambda i: predicted[i])]
    assert best == 3 == check.KS[max(range(len(check.KS)), key=lambda i: measured[i])]
