"""Pipeline parallelism (``hardware.pipeline_parallel``): stages, their weights and KV, the priced step.

References: vLLM's layer split (``get_pp_indices``) worked by hand, Llama-2-7B's parameter count from its
config (hidden 4096, intermediate 11008, 32 layers, vocab 32000), the H100's 80 GiB, the NVLink preset's
figures, and the full model's own cost model (a stage's parts must add up to it).
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
from result_compare import assert_same, off_and_on, same_cluster_outcome

from sim import engine_core
from sim.cluster.layouts import gpus_of
from sim.errors import KvsimError
from sim.executors.cost_model import make_cost_model_executor
from sim.executors.pipeline import PipelineExecutor
from sim.native import native
from sim.pipeline_stages import stage_layers, stage_weight_bytes
from sim.runner import run_scenario
from sim.scenario import SchedulerConfig, load_scenario, scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec, hbm_budget, kv_capacity_blocks

ROOT = Path(__file__).resolve().parents[1]
H100 = HardwareSpec.from_name("h100-80gb")
LLAMA7 = ModelSpec.from_name("llama-2-7b")
# Llama-2-7B by hand: a layer's q, k, v, o (4 x 4096^2), gate, up, down (3 x 4096 x 11008), two norms
LAYER = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096          # 202,383,360 parameters
EMBED = 32000 * 4096                                       # the embedding, and the (untied) LM head


@pytest.mark.parametrize("layers, stages, expect", [
    (80, 3, [27, 27, 26]),        # 26 each, the remainder of 2 on the two stages before the last
    (32, 5, [6, 6, 7, 7, 6]),
    (32, 1, [32]),
    (4, 4, [1, 1, 1, 1]),
])
def test_layers_are_split_as_vllm_splits_them(layers, stages, expect):
    assert stage_layers(layers, stages) == expect


def test_each_stage_holds_its_layers_the_first_the_embedding_the_last_the_head():
    first, last = stage_weight_bytes(LLAMA7, 2)
    assert first == 2 * (16 * LAYER + EMBED)
    assert last == 2 * (16 * LAYER + EMBED + 4096)          # the LM head and the final norm
    assert first + last == LLAMA7.weight_bytes()


def test_the_tightest_stage_decides_how_many_blocks_fit():
    hw = H100.model_copy(update={"pipeline_parallel": 2})
    usable = 80 * 2**30 * 0.9
    free_last = usable - 2 * (16 * LAYER + EMBED + 4096) - 0.05 * usable
    block_of_16_layers = 16 * 2 * 16 * 32 * 128 * 2           # 16 tokens, K and V, 16 layers, 32 heads of 128, fp16
    assert kv_capacity_blocks(LLAMA7, hw, 16) == math.floor(free_last / block_of_16_layers) == 15903
    budget = hbm_budget(LLAMA7, hw, 16, 15903)
    assert budget["gpus"] == 2 and budget["hbm_bytes"] == 2 * 80 * 2**30
    assert budget["weights_bytes"] == LLAMA7.weight_bytes()
    assert budget["kv_cache_bytes"] == 15903 * 2 * block_of_16_layers


def test_pipeline_stages_keep_kv_heads_that_a_wider_group_would_copy():
    """Llama-3.1-405B has 8 KV heads: over 16 GPUs of one tensor-parallel group each head is held twice; over
    two stages of 8 each GPU holds one head of half the layers, so twice the blocks fit."""
    model = ModelSpec.from_name("llama-3.1-405b")
    tp16 = kv_capacity_blocks(model, H100.model_copy(update={"tensor_parallel": 16}), 16)
    pp2 = kv_capacity_blocks(model, H100.model_copy(update={"tensor_parallel": 8, "pipeline_parallel": 2}), 16)
    assert pp2 == pytest.approx(2 * tp16, rel=0.001)


def _pipeline(stages: int, tp: int = 1, budget: int = 2048, chunked: bool = True) -> PipelineExecutor:
    hw = H100.model_copy(update={"tensor_parallel": tp, "pipeline_parallel": stages})
    sch = SchedulerConfig(max_num_batched_tokens=budget, chunked_prefill=chunked)
    ex = make_cost_model_executor(model=LLAMA7, hardware=hw, scheduler=sch)
    assert isinstance(ex, PipelineExecutor)
    return ex


def _decodes(n: int, ctx: int = 500) -> StepPlan:
    return StepPlan(scheduled=[ScheduledRequest(i, 1, ctx, []) for i in range(n)])


def test_a_lone_decode_crosses_every_stage_and_hop():
    pipe = _pipeline(2)
    plan = _decodes(1)
    stages = [stage.execute(plan) for stage in pipe.stages]
    hop = 2e-6 + 2 * 4096 * 2 / 450e9                         # NVLink (2 GPUs: one node): latency + 2 tensors
    assert pipe.execute(plan).duration_s == pytest.approx(sum(r.duration_s for r in stages) + hop, rel=1e-12)
    # the stages' GEMMs, attention and elementwise parts are the whole model's, split by its layers
    whole = make_cost_model_executor(model=LLAMA7, hardware=H100,
                                     scheduler=SchedulerConfig(max_num_batched_tokens=2048)).execute(plan)
    for part in ("linear", "attention", "elementwise"):
        assert sum(r.breakdown[part] for r in stages) == pytest.approx(whole.breakdown[part], rel=1e-9)


def test_a_full_pipeline_takes_its_busiest_stage_for_each_microbatch():
    """Eight equal decodes over four stages: four microbatches of two; the last stage (the LM head and the
    sampler on top of its layers) is the busiest, and the step is its four microbatches."""
    pipe = _pipeline(4)
    result = pipe.execute(_decodes(8))
    assert [len(b) for b in pipe.microbatches(_decodes(8))] == [2, 2, 2, 2]
    last = pipe.stages[-1].execute(_decodes(2)).duration_s
    assert last > pipe.stages[0].execute(_decodes(2)).duration_s
    assert result.duration_s == pytest.approx(4 * last, rel=1e-12)
    bd = result.breakdown
    assert sum(bd.values()) == pytest.approx(result.duration_s, rel=1e-12) and bd["pipeline"] > 0


def test_a_long_prefill_is_cut_into_pieces_of_the_batch_budget():
    pipe = _pipeline(2, budget=512)
    bins = pipe.microbatches(StepPlan(scheduled=[ScheduledRequest(0, 1024, 0, [])]))
    assert [[(e.num_new_tokens, e.num_context_tokens) for e in b] for b in bins] == [[(512, 0)], [(512, 512)]]
    whole = _pipeline(2, budget=2048, chunked=False).microbatches(StepPlan(scheduled=[ScheduledRequest(0, 1024, 0, [])]))
    assert [len(b) for b in whole] == [1]


BASE = {"model": "llama-2-7b", "hardware": {"name": "h100-80gb", "pipeline_parallel": 2},
        "output": {"plots": False}, "frontend": {"enabled": False},
        "scheduler": {"max_num_batched_tokens": 512, "chunked_prefill": True},
        "workload": {"requests": [{"arrival": 0.0, "prompt_len": 2048, "output_len": 4}]}}


def test_a_step_stands_for_one_batch_a_stage():
    """Two stages, 512 tokens a batch: a lone 2,048-token prompt computes one chunk a step, each crossing
    both stages (vLLM does not pipeline one request's chunks); two prompts fill a batch each."""
    res = run_scenario(scenario_from_dict(copy.deepcopy(BASE)), check_integrity=True)
    assert list(res.steps["num_prefill_tokens"][:4]) == [512, 512, 512, 512]
    assert res.summary["step_model"]["stage_layers"] == [16, 16]
    assert res.summary["hbm_budget"]["gpus"] == 2 and res.profile["compiled_core"] == (native is not None)
    pipe = _pipeline(2, budget=512)
    one = StepPlan(scheduled=[ScheduledRequest(0, 512, 0, [])])
    assert res.steps["duration_s"][0] == pytest.approx(pipe.execute(one).duration_s, rel=1e-12)
    two = copy.deepcopy(BASE)
    two["workload"]["requests"] *= 2
    steps = run_scenario(scenario_from_dict(two), check_integrity=True).steps
    assert list(steps["num_prefill_tokens"][:4]) == [1024, 1024, 1024, 1024]   # 2 batches x 512 tokens


def test_without_chunked_prefill_a_prompt_must_fit_one_batch():
    data = copy.deepcopy(BASE)
    data["scheduler"] = {"max_num_batched_tokens": 512, "chunked_prefill": False}
    data["workload"]["requests"] = [{"arrival": 0.0, "prompt_len": 600, "output_len": 4}]
    row = run_scenario(scenario_from_dict(data)).requests.iloc[0]
    assert row["status"] == "REJECTED"
    assert row["reject_reason"] == "prompt of 600 tokens exceeds max_num_batched_tokens 512 without chunked prefill"


@pytest.mark.parametrize("change, key", [
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative"),
    ({"scheduler": {"preemption": "swap"}}, "scheduler.preemption"),
    ({"model": "gemma-3-12b"}, "model"),
    ({"hardware": {"name": "h100-80gb", "pipeline_parallel": 33}}, "hardware.pipeline_parallel"),
    ({"hardware": {"name": "h100-80gb", "pipeline_parallel": 2, "pipeline_link": "carrier-pigeon"}},
     "hardware.pipeline_link"),
])
def test_what_pipelines_do_not_model_is_refused_naming_the_key(change, key):
    data = {**copy.deepcopy(BASE), **change}
    with pytest.raises(KvsimError) as e:
        scenario_from_dict(data)
    assert f": {key}" in e.value.one_line()


def test_forked_samples_are_refused_and_fanned_out_ones_run():
    data = copy.deepcopy(BASE)
    data["workload"]["requests"] = [{"arrival": 0.0, "prompt_len": 100, "output_len": 4, "n": 2}]
    with pytest.raises(KvsimError, match="pipeline stages do not price"):
        run_scenario(scenario_from_dict(copy.deepcopy(data)))
    data["scheduler"]["parallel_sampling"] = "fanout"
    assert run_scenario(scenario_from_dict(data)).summary["num_finished"] == 2


def test_a_fleet_of_pipelines_counts_every_stage_gpu():
    data = copy.deepcopy(BASE)
    data["hardware"] = {"name": "h100-80gb", "tensor_parallel": 2, "pipeline_parallel": 2}
    data["cluster"] = {"replicas": 3}
    data["workload"]["requests"] = [{"arrival": 0.01 * i, "prompt_len": 300, "output_len": 20} for i in range(9)]
    scn = scenario_from_dict(data)
    assert gpus_of(scn)[0] == 12
    res = run_scenario(scn, check_integrity=True)
    assert list(res.replicas["pipeline_parallel"]) == [2, 2, 2] and res.summary["num_finished"] == 9


def test_kv_size_prints_the_stages():
    out = subprocess.run([sys.executable, "-m", "sim.cli", "kv-size", "--model", "llama-2-7b", "--seq-len", "4096",
                          "--hardware", "h100-80gb", "--pipeline-parallel", "2"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert "on 2 stages of 1 x h100-80gb at gpu_memory_utilization 0.9" in out and "15,903 blocks" in out


@pytest.mark.parametrize("changes", [
    [],
    ["hardware.tensor_parallel=4", "hardware.pipeline_parallel=4", "scheduler.policy=priority"],
    ["hardware.pipeline_parallel=3", "scheduler.chunked_prefill=false", "scheduler.max_num_batched_tokens=8192"],
    ["kv_cache.prefix_caching=true", "scheduler.policy=round_robin", "workload.timeout_s=3"],
    ["cluster.replicas=2", "cluster.router.policy=least_requests"],
])
def test_the_compiled_core_prices_pipelines_as_the_simpy_loop_does(monkeypatch, changes):
    # the shipped 405B scenario (120 requests): stages of one or two kinds, chunks cut to a batch's tokens,
    # microbatches placed longest first, bit for bit with the SimPy loop (every invariant checked a step in
    # the core; the loop's checks over 44,000 blocks a step would take minutes)
    def run():
        scn = load_scenario(ROOT / "scenarios/pipeline_parallel.yaml", ["workload.limit=120", *changes])
        return run_scenario(scn, check_integrity=engine_core.enabled)

    loop, core = off_and_on(monkeypatch, engine_core, "enabled", run)
    if "cluster.replicas=2" in changes:
        assert same_cluster_outcome(loop, core) == (native is not None)
    else:
        assert_same(loop, core)
        assert core.profile["compiled_core"] == (native is not None)
    assert core.steps["time_pipeline_s"].ge(0).all() and (core.steps["time_pipeline_s"] > 0).any()
