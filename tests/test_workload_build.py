"""build_workload on the Azure trace, synthetic generators and inline requests.

Expected values come from independent computations (plain pandas / numpy over the raw data,
or by hand), never from the loader's own output.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.errors import KvsimError
from sim.workload import Workload, WorkloadConfig, build_workload

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
CONV = SCENARIOS / "traces" / "azure_llm_2023_conv.csv"


def wl(data: dict, base_dir: Path = SCENARIOS, seed: int = 0) -> Workload:
    return build_workload(WorkloadConfig.model_validate(data), base_dir, seed)


@pytest.fixture(scope="module")
def conv_raw() -> pd.DataFrame:
    return pd.read_csv(CONV)


def test_azure_conversation_matches_raw_file(conv_raw: pd.DataFrame) -> None:
    start = time.perf_counter()
    w = wl({"trace": "traces/azure_llm_2023_conv.csv", "format": "azure"})
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    reqs = w.requests
    assert len(reqs) == 19_366 == len(conv_raw)
    assert [r.req_id for r in reqs] == list(range(len(reqs)))
    # the file is already in time order, so the rows line up one to one
    assert [r.prompt_len for r in reqs] == conv_raw["ContextTokens"].tolist()
    assert [r.output_len for r in reqs] == conv_raw["GeneratedTokens"].tolist()
    # first two rows: 18:15:46.6805900 and 18:15:50.9951690 -> 4.314579 s apart (by hand)
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    t = pd.to_datetime(conv_raw["TIMESTAMP"])
    span = (t.iloc[-1] - t.iloc[0]).total_seconds()
    assert reqs[-1].arrival_s == pytest.approx(span, abs=1e-6)
    assert w.stats["rows_read"] == 19_366 and w.stats["rows_skipped"] == 0 and w.stats["warnings"] == []


def test_azure_limit_and_time_scale(conv_raw: pd.DataFrame) -> None:
    w = wl({"trace": "traces/azure_llm_2023_conv.csv", "format": "azure", "limit": 100, "time_scale": 0.5})
    assert len(w.requests) == 100
    assert w.stats["rows_read"] == 100  # reading stopped after the first 100 rows
    t = pd.to_datetime(conv_raw["TIMESTAMP"].iloc[:100])
    expect = ((t - t.iloc[0]).dt.total_seconds() * 0.5).to_numpy()
    np.testing.assert_allclose([r.arrival_s for r in w.requests], expect, atol=1e-9)


def test_inline_requests_sorted_and_numbered() -> None:
    w = wl({"requests": [
        {"arrival": 1.0, "prompt_len": 10, "output_len": 100},
        {"arrival": 0.0, "prompt_len": 2050, "output_len": 50, "prefix_group": 0, "prefix_len": 2000,
         "priority": 1, "n": 2},
    ]})
    a, b = w.requests
    assert (a.req_id, a.arrival_s, a.prompt_len, a.output_len, a.n, a.prefix_group, a.prefix_len, a.priority) == (
        0, 0.0, 2050, 50, 2, 0, 2000, 1)
    assert (b.req_id, b.arrival_s, b.prompt_len, b.output_len, b.prefix_group, b.prefix_len) == (1, 1.0, 10, 100, -1, 0)


def test_inline_prefix_longer_than_prompt_is_an_error() -> None:
    with pytest.raises(KvsimError, match="prefix_len"):
        wl({"requests": [{"prompt_len": 10, "output_len": 1, "prefix_group": 0, "prefix_len": 10}]})


def test_inline_hash_ids_share_content_chunk_by_chunk() -> None:
    """Three 64-token prompts, one content id per 16 tokens: the second shares its first two chunks with the
    first, the third is the first again. With prefix caching (16-token blocks) the second finds 2 blocks
    (32 tokens), the third 3 (48: every full block but the one holding the last prompt token, which is
    always computed); without hash_ids nothing is shared."""
    from sim.runner import run_scenario
    from sim.scenario import scenario_from_dict

    reqs = [{"arrival": 0.0, "prompt_len": 64, "output_len": 2, "hash_ids": [1, 2, 3, 4]},
            {"arrival": 1.0, "prompt_len": 64, "output_len": 2, "hash_ids": [1, 2, 7, 8]},
            {"arrival": 2.0, "prompt_len": 64, "output_len": 2, "hash_ids": [1, 2, 3, 4]}]
    base = {"model": "llama-2-7b", "hardware": "h100-80gb", "kv_cache": {"block_size": 16, "prefix_caching": True},
            "output": {"plots": False}}
    shared = run_scenario(scenario_from_dict({**base, "workload": {"requests": reqs, "hash_block_tokens": 16}}))
    assert shared.requests["num_cached_tokens"].tolist() == [0, 32, 48]
    plain = [{k: v for k, v in r.items() if k != "hash_ids"} for r in reqs]
    alone = run_scenario(scenario_from_dict({**base, "workload": {"requests": plain}}))
    assert alone.requests["num_cached_tokens"].tolist() == [0, 0, 0]
    w = wl({"requests": reqs[:1]})                         # 512 tokens an id unless told
    assert (w.requests[0].hash_ids, w.requests[0].hash_block_tokens) == ((1, 2, 3, 4), 512)


@pytest.mark.parametrize("data, message", [
    ({"requests": [{"prompt_len": 10, "output_len": 1, "prefix_group": 0, "prefix_len": 4, "hash_ids": [1]}]},
     "requests.0: give prefix_group/prefix_len or hash_ids, not both"),
    ({"trace": "traces/azure_llm_2023_conv.csv", "format": "azure", "hash_block_tokens": 16},
     "hash_block_tokens applies to inline requests"),
])
def test_inline_hash_ids_misuse_is_an_error(data: dict, message: str) -> None:
    with pytest.raises((KvsimError, ValueError), match=message):
        wl(data)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        WorkloadConfig.model_validate({"requests": [{"prompt_len": 4, "output_len": 1, "hash_ids": [-1]}]})


def synth(arrival: dict, prompt: dict | None = None, output: dict | None = None, count: int = 1000,
          seed: int = 0, **extra) -> Workload:
    return wl({"synthetic": {"num_requests": count, "arrival": arrival,
                             "prompt_len": prompt or {"dist": "fixed", "value": 8},
                             "output_len": output or {"dist": "fixed", "value": 4}, **extra}}, seed=seed)


def test_synthetic_is_reproducible_bit_for_bit() -> None:
    args = ({"process": "poisson", "rate": 3.0}, {"dist": "lognormal", "mean": 161, "std": 120, "min": 4, "max": 2048},
            {"dist": "uniform", "min": 16, "max": 512})
    a, b = synth(*args, seed=7), synth(*args, seed=7)
    key = [(r.arrival_s, r.prompt_len, r.output_len) for r in a.requests]
    assert key == [(r.arrival_s, r.prompt_len, r.output_len) for r in b.requests]
    assert key != [(r.arrival_s, r.prompt_len, r.output_len) for r in synth(*args, seed=8).requests]


def test_constant_and_burst_arrivals() -> None:
    w = synth({"process": "constant", "rate": 4.0}, count=5)
    assert [r.arrival_s for r in w.requests] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert {r.arrival_s for r in synth({"process": "burst"}, count=5).requests} == {0.0}


def test_poisson_mean_gap_and_cv() -> None:
    t = np.array([r.arrival_s for r in synth({"process": "poisson", "rate": 5.0}, count=20_000).requests])
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: CV 1


def test_lognormal_lengths_have_the_requested_mean_and_std() -> None:
    w = synth({"process": "burst"}, {"dist": "lognormal", "mean": 500, "std": 200, "min": 1, "max": 100_000},
              count=50_000)
    x = np.array([r.prompt_len for r in w.requests], dtype=float)
    assert x.mean() == pytest.approx(500, rel=0.02)
    assert x.std() == pytest.approx(200, rel=0.05)


def test_lengths_clipped_to_min_max() -> None:
    w = synth({"process": "burst"}, {"dist": "lognormal", "mean": 100, "std": 300, "min": 20, "max": 150},
              {"dist": "uniform", "min": 3, "max": 5}, count=5000)
    p = np.array([r.prompt_len for r in w.requests])
    o = np.array([r.output_len for r in w.requests])
    assert p.min() == 20 and p.max() == 150  # heavy tails on both sides hit both bounds
    assert set(o.tolist()) == {3, 4, 5}


def test_overrides_leave_the_callers_dict_as_it_was() -> None:
    """scenario_from_dict copies only the mappings an override changes: the caller's dict, its nested
    mappings and its inline requests are the same objects, unchanged, afterwards."""
    import copy

    from sim.scenario import scenario_from_dict

    requests = [{"arrival": 0.0, "prompt_len": 8, "output_len": 2, "hash_ids": [1]}]
    data = {"model": "llama-2-7b", "hardware": {"name": "h100-80gb", "tensor_parallel": 1},
            "kv_cache": {"block_size": 16}, "workload": {"requests": requests}}
    before = copy.deepcopy(data)
    scn = scenario_from_dict(data, overrides=["hardware.tensor_parallel=2", "kv_cache.block_size=32",
                                              "model.max_model_len=1024", "workload.limit=1"])
    assert (scn.hardware_spec.tensor_parallel, scn.kv_cache.block_size, scn.model_spec.max_model_len) == (2, 32, 1024)
    assert data == before and data["workload"]["requests"] is requests
