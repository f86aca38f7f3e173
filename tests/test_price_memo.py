"""Executors of one pricing setup share their memoised prices within a process
(sim/executors/price_memo.py); any difference in the setup gives a memo of its own."""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict

import pytest

from sim import run_scenario, scenario_from_dict
from sim.executors import price_memo as memo_module
from sim.executors.cost_model import CostModelExecutor, engine_params_of, load_calibration
from sim.specs import HardwareSpec, ModelSpec

TOKENS = [1, 3, 8, 17, 64, 100, 256, 513, 2048, 4096]


@pytest.fixture
def fresh_memos(monkeypatch):
    monkeypatch.setattr(memo_module, "_memos", OrderedDict())


def _setup(model="llama-2-7b", tp=1, **change):
    params, doc = load_calibration("h100-80gb")
    engine = engine_params_of(doc)
    model_spec = ModelSpec.from_name(model)
    hardware = HardwareSpec.from_name("h100-80gb").model_copy(update={"tensor_parallel": tp})
    if "kv_dtype" in change:
        model_spec = model_spec.model_copy(update={"kv_dtype": change.pop("kv_dtype")})
    if "graph_max_tokens" in change:
        engine = dataclasses.replace(engine, graph_max_tokens=change.pop("graph_max_tokens"))
    if "correction" in change:
        params = dataclasses.replace(params, gemm_correction=change.pop("correction"))
    params = dataclasses.replace(params, **change)
    return model_spec, hardware, params, engine


def _prices(ex: CostModelExecutor) -> list:
    return ([ex._linear(t) for t in TOKENS] + [ex._lm_head(s) for s in TOKENS]
            + [ex._engine_fixed(t, min(t, 256), t > 256) for t in TOKENS])


def _alone(setup) -> list:
    """The prices of an executor that shares nothing (a memo store of its own)."""
    saved = memo_module._memos
    memo_module._memos = OrderedDict()
    try:
        return _prices(CostModelExecutor(*setup[:3], engine=setup[3]))
    finally:
        memo_module._memos = saved


def test_the_same_setup_shares_and_prices_as_an_executor_alone(fresh_memos):
    a = CostModelExecutor(*_setup()[:3], engine=_setup()[3])
    b = CostModelExecutor(*_setup()[:3], engine=_setup()[3])   # (a second read of the same calibration)
    assert a._linear_cache is b._linear_cache and a._eng_fixed_cache is b._eng_fixed_cache
    first = _prices(a)
    assert _prices(b) == first == _alone(_setup())


@pytest.mark.parametrize("change", [
    {"model": "llama-2-13b"}, {"tp": 2}, {"kv_dtype": "fp8"}, {"kernel_latency_s": 7e-6},
    {"graph_max_tokens": 64}, {"correction": {}},
], ids=lambda c: next(iter(c)))
def test_any_difference_in_the_setup_gets_a_memo_of_its_own(fresh_memos, change):
    base = CostModelExecutor(*_setup()[:3], engine=_setup()[3])
    base_prices = _prices(base)
    other_setup = _setup(**change)
    other = CostModelExecutor(*other_setup[:3], engine=other_setup[3])
    assert other._linear_cache is not base._linear_cache
    assert _prices(other) == _alone(other_setup) != base_prices


def test_an_equal_correction_read_anew_is_not_trusted_by_content(fresh_memos):
    model, hardware, params, engine = _setup()
    a = CostModelExecutor(model, hardware, params, engine=engine)
    b = CostModelExecutor(model, hardware, dataclasses.replace(params,
                          gemm_correction=copy.deepcopy(params.gemm_correction)), engine=engine)
    assert a._linear_cache is not b._linear_cache and _prices(a) == _prices(b)


def test_a_bounded_number_of_setups_is_kept(fresh_memos):
    model, hardware, params, engine = _setup()
    for i in range(memo_module.MAX_SETUPS + 4):
        CostModelExecutor(model, hardware, dataclasses.replace(params, kernel_latency_s=1e-6 * (i + 1)),
                          engine=engine)
    assert len(memo_module._memos) == memo_module.MAX_SETUPS


def test_a_run_is_the_same_with_its_prices_memoised_or_not(fresh_memos, tmp_path):
    scn = scenario_from_dict({"name": "t", "model": "llama-2-7b", "hardware": "h100-80gb",
                              "workload": {"synthetic": {"num_requests": 60, "arrival": {"rate": 20},
                                                         "prompt_len": {"dist": "uniform", "min": 16, "max": 900},
                                                         "output_len": {"dist": "uniform", "min": 1, "max": 200}}}},
                             base_dir=tmp_path)
    cold = run_scenario(scn)
    assert memo_module._memos   # (the run's executor left its prices)
    warm = run_scenario(scn)
    assert {k: v for k, v in cold.summary.items() if k != "wall_time_s"} == \
        {k: v for k, v in warm.summary.items() if k != "wall_time_s"}
    assert cold.steps.equals(warm.steps) and cold.requests.equals(warm.requests)
