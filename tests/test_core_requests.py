"""A run in the compiled core builds its per-request table from the core's arrays (sim/core_requests.py);
read back from the same run's Requests (``requests_frame``, what the SimPy loop's runs use) it is the same
table, values and dtypes, in the cases where the dtypes hinge on Python types: times taken while SimPy's
clock was still its int 0 (an int column where every time is such), requests refused on arrival. (The core-against-loop
tests compare it with the SimPy loop's table on every shipped scenario and the fuzz cases too.)"""

from __future__ import annotations

import copy
import random

import pandas as pd
import pytest
from result_compare import off_and_on

import sim.runner as runner
from sim.fuzz import draw_scenario
from sim.native import native
from sim.scenario import scenario_from_dict

pytestmark = pytest.mark.skipif(native is None, reason="sim._native is not built")


def _scenario(requests: list[dict], **kv) -> dict:
    return {"name": "columns", "model": "llama-2-7b", "hardware": "a100-80gb",
            "kv_cache": {"block_size": 16, "num_gpu_blocks": 64, **kv},
            "scheduler": {"max_num_batched_tokens": 1024, "max_num_seqs": 8},
            "workload": {"requests": requests}, "frontend": {"input_latency_s": 0.0, "output_latency_s": 0.0}}


CASES = {
    # one request at the int time 0: scheduled while the clock is the int 0 (an int column)
    "one at int 0": [{"arrival": 0, "prompt_len": 40, "output_len": 3}],
    # int arrivals (the schema makes them floats), one of them refused (its prompt is beyond max_model_len)
    "int arrivals, one refused": [{"arrival": 0, "prompt_len": 40, "output_len": 3},
                                  {"arrival": 1, "prompt_len": 5000, "output_len": 3},
                                  {"arrival": 2, "prompt_len": 300, "output_len": 9}],
    # every request refused at the int time 0: an int finish column
    "all refused at 0": [{"arrival": 0, "prompt_len": 5000, "output_len": 3},
                         {"arrival": 0, "prompt_len": 6000, "output_len": 2}],
    # float arrivals, one of them refused later
    "float arrivals": [{"arrival": 0.0, "prompt_len": 40, "output_len": 3},
                       {"arrival": 0.25, "prompt_len": 700, "output_len": 30},
                       {"arrival": 0.5, "prompt_len": 5000, "output_len": 1}],
}


def _tables(data: dict):
    data = copy.deepcopy(data)
    off, on = off_and_on(pytest.MonkeyPatch(), runner, "CORE_REQUEST_COLUMNS",
                         lambda: runner.run_scenario(scenario_from_dict(copy.deepcopy(data), source="<case>")))
    return off, on


@pytest.mark.parametrize("name", list(CASES))
def test_the_core_s_columns_are_the_requests_table(name):
    data = _scenario(CASES[name])
    data["model"] = {"name": "llama-2-7b", "max_model_len": 4096}
    off, on = _tables(data)
    assert on.profile["compiled_core"]
    pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)
    requests = CASES[name]
    assert (on.requests["status"] == "REJECTED").sum() == sum(r["prompt_len"] >= 4096 for r in requests)
    int_zero = {"one at int 0": "first_scheduled_s", "all refused at 0": "finish_s"}.get(name)
    if int_zero is not None:   # the case the dtype rule is there for
        assert on.requests[int_zero].dtype == "int64" and (on.requests[int_zero] == 0).all()


@pytest.mark.parametrize("policy", ["round_robin", "least_requests"])
def test_a_cluster_in_the_core_gives_the_same_table(policy):
    """Three replicas (routed ahead, or by their loads as each request arrives), refusals included: the
    cluster's table (replica column and all) from the core's arrays is the one read back from the Requests."""
    reqs = [{"arrival": round(0.05 * i, 2), "prompt_len": 5000 if i % 7 == 3 else 40 + 37 * i, "output_len": 1 + i % 9}
            for i in range(24)]
    data = _scenario(reqs)
    data["model"] = {"name": "llama-2-7b", "max_model_len": 4096}
    data["cluster"] = {"replicas": 3, "router": {"policy": policy}}
    off, on = _tables(data)
    assert on.profile["compiled_core"] and (on.requests["status"] == "REJECTED").sum() == 3
    pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)


def test_fuzzed_core_runs_give_the_same_table():
    """40 random scenarios the core runs (refusals, preemption, prefix caching, clusters included)."""
    ran = 0
    for i in range(40):
        data = draw_scenario(random.Random(f"core-requests:{i}"), i)
        off, on = _tables(data)
        if isinstance(on, str):   # refused as a whole: both the same way
            assert on == off
            continue
        if "compiled_core" in on.profile and on.profile["compiled_core"]:
            ran += 1
        pd.testing.assert_frame_equal(on.requests, off.requests, check_exact=True)
    assert ran >= 10, f"only {ran} of 40 cases ran in the core"
