"""GPUExecutor through the simulator's registry, and the CPU quickstart scenario end to end."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pydantic")
pytest.importorskip("simpy")

from sim.errors import KvsimError  # noqa: E402
from sim.executors.base import make_executor  # noqa: E402
from sim.scenario import ExecutorConfig, KVCacheConfig  # noqa: E402
from sim.sched.plan import ScheduledRequest, StepPlan  # noqa: E402
from sim.specs import HardwareSpec, ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _executor(**cfg):
    return make_executor("gpu", model=ModelSpec.from_name("tiny-llama"), hardware=HardwareSpec.from_name("cpu"),
                         config=ExecutorConfig(kind="gpu", device="cpu", **cfg), kv=KVCacheConfig(block_size=16),
                         num_gpu_blocks=64, num_cpu_blocks=8, base_dir=ROOT)


def test_plan_runs_and_is_not_mutated():
    ex = _executor(step_overhead_s=0.001)
    prefill = StepPlan(scheduled=[ScheduledRequest(0, 20, 0, [3, 9]), ScheduledRequest(1, 5, 0, [4])])
    r1 = ex.execute(prefill)
    assert r1.duration_s > 0.001 and r1.breakdown["overhead"] == 0.001
    assert set(r1.breakdown) == {"linear", "attention", "swap", "copy", "other", "overhead"}
    assert r1.duration_s == pytest.approx(sum(r1.breakdown.values()))
    blocks = [3, 9]
    plan = StepPlan(scheduled=[ScheduledRequest(0, 1, 20, blocks), ScheduledRequest(1, 1, 5, [4])],
                    blocks_to_copy=[(4, 10)], blocks_to_swap_out=[(9, 2)])
    r2 = ex.execute(plan)
    assert r2.breakdown["copy"] > 0 and r2.breakdown["swap"] > 0
    assert plan.scheduled[0].block_ids is blocks and blocks == [3, 9] and plan.blocks_to_copy == [(4, 10)]


def test_num_layers_override_builds_fewer_layers():
    ex = _executor(num_layers=1)
    assert ex.runner.num_layers == 1 and ex.runner.layer_scale == 2.0


def test_cpu_pool_too_large_is_a_clear_error():
    with pytest.raises(KvsimError, match="num_gpu_blocks"):
        make_executor("gpu", model=ModelSpec.from_name("llama-2-13b"), hardware=HardwareSpec.from_name("cpu"),
                      config=ExecutorConfig(kind="gpu", device="cpu"), kv=KVCacheConfig(block_size=16),
                      num_gpu_blocks=100_000, num_cpu_blocks=0, base_dir=ROOT)


def test_quickstart_gpu_cpu_scenario_end_to_end():
    from sim import load_scenario, run_scenario

    scn = load_scenario(ROOT / "scenarios" / "quickstart_gpu_cpu.yaml",
                        ["workload.synthetic.num_requests=12", "output.plots=false"])
    result = run_scenario(scn)
    assert result.summary["num_finished"] == 12 and result.summary["num_rejected"] == 0
    assert result.summary["step_model"] == {"executor": "gpu", "device": "cpu"}   # the real backend, on the CPU
    assert result.summary["num_steps"] > 0 and (result.steps["duration_s"] > 0).all()
