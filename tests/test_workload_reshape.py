"""Reshaping (limit, window, time_scale, rate, clipping) and the rest of the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import KvsimError
from sim.scenario import load_scenario
from sim.workload import Workload, WorkloadConfig, build_workload

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


def inline(times: list[float], **extra) -> Workload:
    reqs = [{"arrival": t, "prompt_len": 10 + i, "output_len": 5} for i, t in enumerate(times)]
    return build_workload(WorkloadConfig.model_validate({"requests": reqs, **extra}), Path("."), 0)


def times(w: Workload) -> list[float]:
    return [r.arrival_s for r in w.requests]


def test_window_keeps_half_open_interval_and_measures_from_its_start() -> None:
    w = inline([0.0, 1.0, 2.0, 3.0, 4.0], start_s=1.0, duration_s=2.0)
    assert times(w) == [0.0, 1.0] and [r.prompt_len for r in w.requests] == [11, 12]
    assert [r.req_id for r in w.requests] == [0, 1]


def test_order_limit_then_window_then_scale_then_rate() -> None:
    # limit 4 -> [0, 1, 3, 7]; window [1, 8) -> [0, 2, 6]; time_scale 0.5 -> [0, 1, 3]; rate: 2 gaps over
    # 3 s = 2/3 req/s -> 2 req/s means a factor 1/3: [0, 1/3, 1]
    w = inline([0.0, 1.0, 3.0, 7.0, 7.5], limit=4, start_s=1.0, duration_s=7.0, time_scale=0.5, rate=2.0)
    assert times(w) == pytest.approx([0.0, 1 / 3, 1.0])


def test_rate_needs_distinct_times() -> None:
    with pytest.raises(KvsimError, match="workload.rate"):
        inline([0.0, 0.0], rate=1.0)


def test_empty_after_window_is_an_error() -> None:
    with pytest.raises(KvsimError, match="no requests"):
        inline([0.0, 1.0], start_s=5.0)


def test_max_model_len_clips_output_first_then_prompt() -> None:
    reqs = [{"prompt_len": 90, "output_len": 5}, {"prompt_len": 60, "output_len": 50},
            {"prompt_len": 150, "output_len": 9}, {"prompt_len": 80, "output_len": 20, "prefix_group": 0,
                                                   "prefix_len": 79}]
    w = build_workload(WorkloadConfig.model_validate({"requests": reqs, "max_model_len": 100}), Path("."), 0)
    assert [(r.prompt_len, r.output_len, r.prefix_len) for r in w.requests] == [
        (90, 5, 0), (60, 40, 0), (99, 1, 0), (80, 20, 79)]
    assert w.stats["clipped"] == 2


def test_quickstart_rate_10_doubles_rate_5() -> None:
    def arrivals(rate: int) -> np.ndarray:
        scn = load_scenario(SCENARIOS / "quickstart.yaml", [f"workload.rate={rate}"])
        w = build_workload(scn.workload, scn.base_dir, scn.seed, scn.source)
        return np.array(times(w))

    a5, a10 = arrivals(5), arrivals(10)
    assert len(a5) == len(a10) == 2000
    assert (len(a5) - 1) / a5[-1] == pytest.approx(5.0, rel=1e-12)
    assert (len(a10) - 1) / a10[-1] == pytest.approx(10.0, rel=1e-12)
    np.testing.assert_allclose(a10 * 2, a5, rtol=1e-12)


# ---------------------------------------------------------------- synthetic, the rest


def synth(count: int = 2000, seed: int = 0, **spec) -> Workload:
    body = {"num_requests": count, "prompt_len": {"dist": "fixed", "value": 8},
            "output_len": {"dist": "fixed", "value": 4}, **spec}
    return build_workload(WorkloadConfig.model_validate({"synthetic": body}), SCENARIOS, seed)


def test_gamma_arrivals_have_the_requested_cv() -> None:
    w = synth(40_000, arrival={"process": "gamma", "rate": 4.0, "cv": 3.0})
    gaps = np.diff(times(w))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.08)


def test_zipf_lengths_follow_the_power_law() -> None:
    w = synth(60_000, arrival={"process": "burst"}, prompt_len={"dist": "zipf", "a": 2.0, "min": 10, "max": 13})
    x = np.array([r.prompt_len for r in w.requests])
    weights = np.array([1, 1 / 4, 1 / 9, 1 / 16])  # ranks 1..4 -> lengths 10..13
    expect = weights / weights.sum()
    got = np.array([(x == v).mean() for v in (10, 11, 12, 13)])
    np.testing.assert_allclose(got, expect, atol=0.01)
    assert x.min() == 10 and x.max() == 13


def test_empirical_lengths_resample_a_trace() -> None:
    spec = {"dist": "empirical", "trace": "traces/azure_llm_2023_conv.csv", "format": "azure"}
    w = synth(30_000, arrival={"process": "burst"}, prompt_len=spec, output_len=spec)
    raw = pd.read_csv(SCENARIOS / "traces" / "azure_llm_2023_conv.csv")
    p = np.array([r.prompt_len for r in w.requests])
    o = np.array([r.output_len for r in w.requests])
    assert set(p.tolist()) <= set(raw["ContextTokens"].tolist())
    assert set(o.tolist()) <= set(raw["GeneratedTokens"].tolist())
    assert p.mean() == pytest.approx(raw["ContextTokens"].mean(), rel=0.03)
    assert o.mean() == pytest.approx(raw["GeneratedTokens"].mean(), rel=0.03)


def test_shared_prefix_groups_priorities_n_and_beam() -> None:
    w = synth(3000, arrival={"process": "poisson", "rate": 10.0},
              prompt_len={"dist": "uniform", "min": 5, "max": 300}, shared_prefix={"groups": 3, "length": 200},
              priority={"dist": "uniform", "min": 0, "max": 3}, n=2, beam_width=4)
    reqs = w.requests
    assert {r.prefix_group for r in reqs} == {0, 1, 2}
    assert {r.prefix_len for r in reqs} == {200}
    assert min(r.prompt_len for r in reqs) == 201  # at least one token beyond the prefix
    assert {r.priority for r in reqs} == {0, 1, 2, 3}
    assert {r.n for r in reqs} == {2}
    assert {r.beam_width for r in reqs} == {4}


def test_arrival_override_for_a_trace_is_seeded() -> None:
    def run(seed: int) -> list[float]:
        cfg = WorkloadConfig.model_validate({"trace": "traces/azure_llm_2023_conv.csv", "format": "azure",
                                             "arrival": {"process": "poisson", "rate": 2.0}, "limit": 50})
        return times(build_workload(cfg, SCENARIOS, seed))

    assert run(3) == run(3) != run(4)


# ---------------------------------------------------------------- invariants, for any inline workload

_request = st.fixed_dictionaries({
    "arrival": st.floats(0, 100, allow_nan=False), "prompt_len": st.integers(2, 500),
    "output_len": st.integers(1, 500), "prefix_group": st.sampled_from([-1, 0, 1]),
})


@settings(max_examples=60, deadline=None)
@given(reqs=st.lists(_request, min_size=1, max_size=30), max_len=st.integers(2, 600),
       scale=st.floats(0.1, 4.0), limit=st.integers(1, 40))
def test_reshaped_workload_invariants(reqs: list[dict], max_len: int, scale: float, limit: int) -> None:
    for r in reqs:
        r["prefix_len"] = r["prompt_len"] // 2 if r["prefix_group"] >= 0 else 0
    cfg = {"requests": reqs, "max_model_len": max_len, "time_scale": scale, "limit": limit}
    w = build_workload(WorkloadConfig.model_validate(cfg), Path("."), 0)
    out = w.requests
    assert len(out) == min(limit, len(reqs))
    assert [r.req_id for r in out] == list(range(len(out)))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(out, out[1:], strict=False))
    expect_times = sorted(r["arrival"] for r in reqs)[: len(out)]
    assert [r.arrival_s for r in out] == pytest.approx([t * scale for t in expect_times])
    for r in out:
        assert r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= max(max_len, 2)
        assert 0 <= r.prefix_len < r.prompt_len or (r.prefix_group == -1 and r.prefix_len == 0)
    over = sum(r["prompt_len"] + r["output_len"] > max_len for r in
               sorted(reqs, key=lambda r: r["arrival"])[: len(out)])
    assert w.stats["clipped"] == over
