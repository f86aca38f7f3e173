"""The engine-level step model (sim/executors/engine_params.py), checked by hand on Llama-2-13B / A100.

Plain roofline (efficiencies 1, no latencies) underneath, so each engine term shows alone.
"""

from __future__ import annotations

import random

import pytest

from sim.executors.base import execute_decode_run
from sim.executors.cost_model import CostModelExecutor, make_cost_model_executor
from sim.executors.engine_params import EngineParams, capture_sizes
from sim.executors.roofline import CostParams
from sim.scenario import ExecutorConfig, SchedulerConfig, scenario_from_dict
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

IDEAL = dict(compute_eff=1.0, memory_eff=1.0, kernel_latency_s=0.0, step_overhead_s=0.0, attn_compute_eff=1.0,
             attn_memory_eff=1.0, attn_kv_read_eff=1.0, elementwise_eff=1.0, elementwise_latency_s=0.0,
             swap_block_latency_s=0.0, allreduce_eff=1.0)
QUIET = dict(graph_kernel_s=0.0, step_gap_s=0.0, sampler_s=0.0, cpu_step_s=0.0, cpu_seq_s=0.0, eager_op_s=0.0,
             attn_kv_read_eff=1.0, attn_half_ctx=0.0)
A100 = HardwareSpec.from_name("a100-80gb")
L13 = ModelSpec.from_name("llama-2-13b")


def _exe(hw=A100, params=None, **engine) -> CostModelExecutor:
    return CostModelExecutor(L13, hw, CostParams(**{**IDEAL, **(params or {})}), 16,
                             EngineParams(**{**QUIET, **engine}))


def _decode(*contexts: int) -> StepPlan:
    return StepPlan(scheduled=[ScheduledRequest(i, 1, c, []) for i, c in enumerate(contexts)])


def test_capture_sizes_are_vllms():
    assert capture_sizes(256)[:5] == [1, 2, 4, 8, 16] and capture_sizes(256)[-2:] == [248, 256]
    assert capture_sizes(512)[-3:] == [480, 496, 512]
    assert len(capture_sizes(512)) == 3 + 31 + 17
    assert capture_sizes(6) == [1, 2, 4, 6] and capture_sizes(300)[-2:] == [288, 300]
    # 3 seats: the largest graph holds 6 tokens; a decode batch of 5 pads to 6
    exe = _exe(graph_max_tokens=6)
    assert exe.execute(_decode(*[10] * 5)).breakdown["linear"] > exe.execute(_decode(*[10] * 4)).breakdown["linear"]


def test_decode_batch_is_padded_to_a_captured_size():
    exe = _exe()
    nine, sixteen, seventeen = (exe.execute(_decode(*[100] * n)).breakdown["linear"] for n in (9, 16, 17))
    head = lambda m: 2 * (5120 * 32000 + m * 5120 + m * 32000) / 2039e9   # noqa: E731  LM head on m rows
    # the layers' GEMMs see 16 rows for 9 and 16 sequences, 24 for 17; the LM head sees the real count
    assert nine - head(9) == pytest.approx(sixteen - head(16), rel=1e-12)
    assert seventeen - head(17) > sixteen - head(16)
    # by hand: 40 layers x sum over the 4 GEMMs of 2 (K N + 16 K + 16 N) bytes at 2039 GB/s
    gemms = [(5120, 15360), (5120, 5120), (5120, 27648), (13824, 5120)]
    by_hand = 40 * sum(2 * (k * n + 16 * k + 16 * n) for k, n in gemms) / 2039e9
    assert nine - head(9) == pytest.approx(by_hand, rel=1e-9)


def test_graph_replaces_each_kernels_isolated_latency():
    slow = _exe(params={"kernel_latency_s": 5e-6}, graph_kernel_s=1e-6).execute(_decode(100))
    fast = _exe(params={"kernel_latency_s": 5e-6}, graph_kernel_s=0.0).execute(_decode(100))
    # 4 GEMMs a layer pay 1 us each inside the graph instead of nothing; the LM head (outside) pays 5 us
    assert slow.breakdown["linear"] - fast.breakdown["linear"] == pytest.approx(40 * 4 * 1e-6, rel=1e-9)
    # 5 fused elementwise kernels and the attention kernel a layer, 1 us each
    assert slow.breakdown["elementwise"] - fast.breakdown["elementwise"] == pytest.approx(40 * 5e-6, rel=1e-9)
    assert slow.breakdown["attention"] - fast.breakdown["attention"] == pytest.approx(40 * 1e-6, rel=1e-9)


def test_decode_attention_efficiency_grows_with_context():
    exe = _exe(attn_kv_read_eff=0.8, attn_half_ctx=128.0)
    # per layer, a sequence of context c reads (c + 1) tokens of K and V: 2 x 5120 x 2 bytes each, at
    # 0.8 x c/(c + 128) of 2039 GB/s; plus its Q, O, new K and V (4 x 5120 x 2 bytes) at full bandwidth
    def by_hand(c: int) -> float:
        return 40 * ((c + 1 + 128) * 20480 / (2039e9 * 0.8) + 4 * 10240 / 2039e9)
    for c in (64, 1000):
        assert exe.execute(_decode(c)).breakdown["attention"] == pytest.approx(by_hand(c), rel=1e-9)
    short = exe.execute(_decode(64)).breakdown["attention"] / 65
    long = exe.execute(_decode(1000)).breakdown["attention"] / 1001
    assert short > 2 * long   # per token, a short context costs over twice as much


def test_fused_elementwise_traffic_by_hand():
    r = _exe().execute(_decode(*[10] * 16))
    # per token and layer: 2 fused add+RMSNorm (4 H each), rotary (2 (q + kv)), cache write (4 kv),
    # SiLU-and-mul (3 I): 8 x 5120 + 2 x 10240 + 4 x 5120 + 3 x 13824 = 123,392 elements of 2 bytes
    assert r.breakdown["elementwise"] == pytest.approx(40 * 16 * 123_392 * 2 / 2039e9, rel=1e-9)


def test_custom_allreduce_for_small_messages_nccl_above():
    tp2 = A100.model_copy(update={"tensor_parallel": 2})
    exe = _exe(hw=tp2, custom_ar_latency_s=8e-6, custom_ar_eff=0.5, custom_ar_max_bytes=1e6)
    # one decode sequence: 1 x 5120 x 2 = 10,240 bytes; 8 us + 2 x 1/2 x 10,240 / (300 GB/s x 0.5); 2 a layer
    one = exe.execute(_decode(100)).breakdown["allreduce"]
    assert one == pytest.approx(80 * (8e-6 + 10240 / 150e9), rel=1e-9)
    # 2,048 prompt tokens: 20,971,520 bytes > 1 MB: the NCCL ring of the calibration (5 us link latency)
    big = exe.execute(StepPlan(scheduled=[ScheduledRequest(0, 2048, 0, [])])).breakdown["allreduce"]
    assert big == pytest.approx(80 * (20_971_520 / 300e9 + 2 * 5e-6), rel=1e-9)


def test_custom_allreduce_grows_up_to_tp4_and_runs_on_2_4_6_8_gpus():
    """The growth per GPU (fitted on TP 2 and 4) stops at custom_ar_growth_until_tp = 4: at TP 8 a custom
    all-reduce pays TP 4's latency and its own bandwidth term (2 x 7/8 of the bytes); vLLM's kernel takes
    2, 4, 6 or 8 GPUs, so TP 16 goes to the NCCL ring (no table here: 2 (t-1)/t x bytes / bw + 2 (t-1) x 5 us)."""
    def allreduce(tp: int) -> float:
        hw = A100.model_copy(update={"tensor_parallel": tp})
        exe = _exe(hw=hw, custom_ar_latency_s=8e-6, custom_ar_peer_s=3e-6, custom_ar_eff=0.5, custom_ar_max_bytes=1e6)
        return exe.execute(_decode(100)).breakdown["allreduce"] / 80   # 40 layers x 2: one all-reduce
    nbytes = 5120 * 2
    assert allreduce(4) == pytest.approx(8e-6 + 3e-6 * 2 + 2 * 3 / 4 * nbytes / 150e9, rel=1e-9)
    assert allreduce(8) == pytest.approx(8e-6 + 3e-6 * 2 + 2 * 7 / 8 * nbytes / 150e9, rel=1e-9)
    assert allreduce(16) == pytest.approx(2 * 15 / 16 * nbytes / 300e9 + 2 * 15 * 5e-6, rel=1e-9)


def test_cpu_overlaps_the_gpu_with_async_scheduling():
    plan = _decode(100, 200)
    gpu = _exe().execute(plan).duration_s
    over = _exe(cpu_step_s=1.0, step_gap_s=1e-3).execute(plan)
    serial = _exe(cpu_step_s=1.0, step_gap_s=1e-3, overlap_cpu=False).execute(plan)
    assert over.duration_s == pytest.approx(1.0 + 1e-3, rel=1e-12)          # max(gpu, cpu) + gap
    assert serial.duration_s == pytest.approx(gpu + 1.0 + 1e-3, rel=1e-12)  # gpu + cpu + gap
    for r in (over, serial):
        assert sum(r.breakdown.values()) == pytest.approx(r.duration_s, rel=1e-12)
        assert r.breakdown["overhead"] == pytest.approx(r.duration_s - gpu, rel=1e-9)


def test_without_async_scheduling_the_cpu_side_is_not_hidden():
    # the shipped H100 engine terms: with async scheduling (the default) a decode step of Llama-2-7B at
    # batch 2 is max(GPU, CPU) + gap, its CPU side (0.6 ms a step + 4 us a sequence; no eager op in a full
    # graph) under the GPU's; without, the CPU side runs first: the step is that much longer
    base = {"model": "llama-2-7b", "hardware": "h100-80gb",
            "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]}}
    steps = {}
    for on in (True, False):
        scn = scenario_from_dict({**base, "scheduler": {"async_scheduling": on}})
        exe = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                       scheduler=scn.scheduler)
        assert exe.engine.overlap_cpu is on
        steps[on] = exe.execute(_decode(100, 200))
    e = steps[True]
    gpu = sum(v for k, v in e.breakdown.items() if k != "overhead")
    cpu = 0.6e-3 + 2 * 4e-6
    assert cpu < gpu
    assert steps[False].duration_s == pytest.approx(steps[True].duration_s + cpu, rel=1e-9)


def test_mixed_and_large_steps_run_outside_full_graphs():
    mixed = StepPlan(scheduled=[ScheduledRequest(0, 1, 100, []), ScheduledRequest(1, 30, 0, [])])
    # piecewise graph: 2 eager ops a layer (cache write, attention) cost CPU, here the whole step
    r = _exe(eager_op_s=1e-3).execute(mixed)
    assert r.duration_s == pytest.approx(40 * 2 * 1e-3, rel=1e-12)
    big = StepPlan(scheduled=[ScheduledRequest(0, 600, 0, [])])
    r = _exe(eager_op_s=1e-3, graph_max_tokens=512).execute(big)   # 600 > 512: eager, 14 ops a layer
    assert r.duration_s == pytest.approx(40 * 14 * 1e-3, rel=1e-12)


@pytest.mark.parametrize("engine", [True, False])
@pytest.mark.parametrize("tp", [1, 4])
def test_decode_run_equals_stepping_bit_for_bit(engine, tp):
    rng = random.Random(tp * 7 + engine)
    hw = HardwareSpec.from_name("h100-80gb").model_copy(update={"tensor_parallel": tp})
    model = ModelSpec.from_name("llama-2-70b" if tp > 1 else "llama-2-7b")
    cfg = ExecutorConfig(engine=engine)
    exe = make_cost_model_executor(model=model, hardware=hw, config=cfg, scheduler=SchedulerConfig(max_num_seqs=64))
    assert (exe.engine is not None) == engine
    for _ in range(20):
        contexts = [rng.randint(1, 3000) for _ in range(rng.randint(1, 64))]
        k = rng.randint(1, 40)
        run = execute_decode_run(exe, _decode(*contexts), k)
        for j in range(k):
            ref = exe.execute(_decode(*[c + j for c in contexts]))
            assert run.durations[j] == ref.duration_s
            assert all(run.breakdown[key][j] == v for key, v in ref.breakdown.items())


def test_a_scenario_gets_its_hardwares_shipped_calibration():
    base = {"model": "llama-2-7b", "hardware": "h100-80gb",
            "workload": {"requests": [{"prompt_len": 10, "output_len": 2}]}}
    from sim.executors.cost_model import load_calibration

    shipped, _ = load_calibration("h100-80gb")
    scn = scenario_from_dict(base)
    exe = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec, config=scn.executor,
                                   scheduler=scn.scheduler)
    assert exe.params.to_dict() == shipped.to_dict() and exe.engine is not None
    # vLLM's largest captured size for 256 seats: min(2 x 256, 512)
    assert exe.engine.graph_max_tokens == 512
    plain = make_cost_model_executor(model=scn.model_spec, hardware=scn.hardware_spec,
                                     config=ExecutorConfig(calibration="roofline"))
    assert plain.engine is None and plain.params.tiles == []


def test_a_mapping_naming_a_preset_is_that_preset_with_its_fields_and_calibration(tmp_path):
    # hardware: {name: H100-80GB, tensor_parallel: 4}: the h100-80gb preset at TP 4 (its datasheet numbers
    # untouched), named as the preset, so the shipped H100 calibration prices it as it does the bare name
    from sim.executors.cost_model import load_calibration
    from sim.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text("model: {name: llama-2-7b, max_model_len: 2048}\n"
                    "hardware: {name: H100-80GB, tensor_parallel: 4}\n"
                    "workload: {requests: [{prompt_len: 10, output_len: 2}]}\n"
                    "cluster:\n  prefill: {replicas: 1, hardware: {name: a100-80gb, tensor_parallel: 2}}\n"
                    "  decode: {replicas: 1}\n")
    scn = load_scenario(path)
    hw = scn.hardware_spec
    assert hw.name == "h100-80gb" and hw.tensor_parallel == 4
    assert (hw.hbm_bytes, hw.hbm_bandwidth, hw.peak_flops, hw.peak_flops_fp8) == (80 * 2**30, 3.35e12, 989e12, 1979e12)
    assert scn.model_spec.max_model_len == 2048 and scn.model_spec.num_layers == 32 and scn.model_spec.hidden_size == 4096
    assert scn.model_spec == ModelSpec.from_name("llama-2-7b").model_copy(update={"max_model_len": 2048})
    assert scn.cluster.prefill.hardware == HardwareSpec.from_name("a100-80gb").model_copy(update={"tensor_parallel": 2})
    exe = make_cost_model_executor(model=scn.model_spec, hardware=hw, config=scn.executor, scheduler=scn.scheduler)
    assert exe.params.to_dict() == load_calibration("h100-80gb")[0].to_dict() and exe.engine is not None


def test_a_mapping_of_another_name_still_gives_every_field(tmp_path):
    from sim.errors import KvsimError
    from sim.scenario import load_scenario

    for text, message in (
            ("hardware: {name: 4xa100, tensor_parallel: 4}", r"s.yaml:2: hardware.hbm_bytes: required key is missing"),
            ("hardware: {name: a100-80gb, hbm_bytes: -1}", r"s.yaml:2: hardware.hbm_bytes: Input should be greater than 0"),
            ("hardware: {name: a100-80gb, cores: 4}", r"s.yaml:2: hardware.cores: unknown key")):
        path = tmp_path / "s.yaml"
        path.write_text(f"model: llama-2-7b\n{text}\nworkload: {{requests: [{{prompt_len: 10, output_len: 2}}]}}\n")
        with pytest.raises(KvsimError, match=message):
            load_scenario(path)
