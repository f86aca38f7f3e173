"""The scenario fuzzer: a seeded batch of random small scenarios must all pass, and the checker must bite."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from sim.fuzz import _max_n, check_outcome, draw_scenario, fuzz, literal_choices, run_case
from sim.scenario import SchedulerConfig, scenario_from_dict


@pytest.mark.parametrize("part", range(4))   # 4 x 100 cases: parallel test workers share them
def test_seeded_fuzz_batch_passes(part):
    report = fuzz(seed=20261130, count=100, start=100 * part)
    assert not report.failures, "\n\n".join(f"case {c.index}: {c.error}\n{c.scenario}" for c in report.failures[:3])
    assert report.counts().get("ok", 0) >= 25  # enough of the batch ran the real code paths


def test_draws_are_valid_and_reproducible():
    from sim.errors import KvsimError
    from sim.fuzz import _combination_problem

    refused = 0
    for i in range(300):
        a = draw_scenario(random.Random(f"7:{i}"), i)
        assert a == draw_scenario(random.Random(f"7:{i}"), i)
        problem = _combination_problem(a)
        if problem is None:
            scenario_from_dict(a)  # the schema accepts every draw but the deliberately refused ones
        else:
            refused += 1
            with pytest.raises(KvsimError, match=problem[0]):
                scenario_from_dict(a)
    assert 0 < refused < 30  # about REFUSED_P of the unsupported draws are kept


def test_draws_cover_tensor_parallelism_and_hbm_capacity():
    tp = hbm = 0
    for i in range(300):
        a = draw_scenario(random.Random(f"cov:{i}"), i)
        tp += isinstance(a["hardware"], dict) and a["hardware"]["tensor_parallel"] > 1
        hbm += "gpu_memory_utilization" in a["kv_cache"]
    assert tp > 10 and hbm > 5


def test_schema_choices_track_the_schema():
    assert {"fcfs", "priority"} <= set(literal_choices(SchedulerConfig, "policy"))
    assert set(literal_choices(SchedulerConfig, "preemption")) == {"recompute", "swap"}


def _tables():
    reqs = pd.DataFrame({
        "req_id": [0, 1], "arrival_s": [0.0, 0.0], "prompt_tokens": [4, 9], "output_tokens": [3, 2], "n": [1, 1],
        "num_preemptions": [0, 0],
        "status": ["FINISHED", "REJECTED"], "first_scheduled_s": [0.0, float("nan")],
        "first_token_s": [0.1, float("nan")], "finish_s": [0.3, 0.0], "num_cached_tokens": [0, 0],
        "reject_reason": ["", "too long"],
    })
    # request 0: prefill of 4 tokens, then 2 decode steps (prompt + output - 1 = 6 tokens of KV computed)
    steps = pd.DataFrame({
        "start_s": [0.0, 0.1, 0.2], "duration_s": [0.1, 0.1, 0.1], "end_s": [0.1, 0.2, 0.3],
        "num_prefill_tokens": [4, 0, 0], "num_decode_tokens": [0, 1, 1], "kv_blocks_used": [1, 2, 0],
        "slots_token_states": [4, 5, 0], "slots_reserved": [0, 3, 0], "slots_internal_frag": [0, 0, 0],
        "slots_external_frag": [0, 0, 0], "slots_free": [4, 0, 8],
    })
    summary = {"num_finished": 1, "num_rejected": 1, "num_preemptions": 0, "swapped_blocks": 0,
               "memory_breakdown": {"token_states": 0.5, "free": 0.5}}
    return reqs, steps, summary


def test_checker_accepts_a_consistent_run():
    reqs, steps, summary = _tables()
    assert check_outcome(reqs, steps, summary, capacity_slots=8) == []


@pytest.mark.parametrize("breakage, fragment", [
    (lambda r, s, m: r.__setitem__("status", ["RUNNING", "REJECTED"]), "neither finished, rejected nor aborted"),
    (lambda r, s, m: r.__setitem__("reject_reason", ["", ""]), "without a reason"),
    (lambda r, s, m: r.__setitem__("first_scheduled_s", [0.0, 0.0]), "rejected request was scheduled"),
    (lambda r, s, m: r.__setitem__("num_preemptions", [1, 0]), "num_preemptions"),
    (lambda r, s, m: s.__setitem__("num_swapped", [0, 1, 1]), "still swapped out"),
    (lambda r, s, m: r.__setitem__("first_token_s", [0.5, float("nan")]), "finish_s < first_token_s"),
    (lambda r, s, m: s.__setitem__("kv_blocks_used", [1, 2, 1]), "still held"),
    (lambda r, s, m: s.__setitem__("num_decode_tokens", [0, 1, 0]), "tokens computed"),
    (lambda r, s, m: r.__setitem__("n", [2, 1]), "tokens computed"),  # 2 sequences: 4 + 2 x 2 = 8 tokens
    (lambda r, s, m: s.__setitem__("start_s", [0.0, 0.05, 0.2]), "overlap"),
    (lambda r, s, m: s.__setitem__("slots_free", [4, 0, 7]), "add up"),
])
def test_checker_catches_each_violation(breakage, fragment):
    reqs, steps, summary = _tables()
    breakage(reqs, steps, summary)
    problems = check_outcome(reqs, steps, summary, capacity_slots=8)
    assert any(fragment in p for p in problems), problems


def test_a_crash_is_reported_with_its_scenario():
    data = draw_scenario(random.Random("crash"), 0)
    data["kv_cache"]["block_size"] = 3  # invalid: the schema rejects it, and the case reports a failure
    case = run_case(data)
    assert case.outcome == "failed" and "block_size" in case.error and case.scenario is data


def test_known_issues_are_classified_not_hidden(monkeypatch):
    import sim.fuzz as fz

    monkeypatch.setitem(fz.KNOWN_ISSUES, "demo", lambda data, error: "deadlock" in error and _max_n(data) > 2)
    data = {"workload": {"requests": [{"prompt_len": 1, "n": 3}]}}
    assert fz.known_issue(data, "KvsimError: engine: deadlock at t=0s") == "demo"
    assert fz.known_issue(data, "AssertionError: block 3 freed twice") == ""
    assert fz.known_issue({"workload": {"synthetic": {"n": 2}}}, "deadlock") == ""


def test_parallel_samples_are_drawn_only_where_they_fork():
    for i in range(400):
        data = draw_scenario(random.Random(f"multi:{i}"), i)
        if data["kv_cache"]["allocator"] != "paged" or data["scheduler"]["batching"] != "continuous":
            assert _max_n(data) == 1, data


def test_every_cache_and_scheduler_option_is_fuzzed_or_exempt():
    # a new option in kv_cache or scheduler must get a knob in sim/fuzz.py KNOBS (one line) or a reason
    from sim.fuzz import DRAWN_IN_SCENARIO, KNOBS, NOT_FUZZED
    from sim.scenario import KVCacheConfig

    knobs = {path for path, _ in KNOBS} | set(DRAWN_IN_SCENARIO)
    fields = {f"kv_cache.{k}" for k in KVCacheConfig.model_fields} | {
        f"scheduler.{k}" for k in SchedulerConfig.model_fields}
    missing = sorted(fields - knobs - set(NOT_FUZZED))
    assert not missing, f"options neither fuzzed nor exempt (add them to sim/fuzz.py KNOBS): {missing}"


def test_draws_cover_every_workload_kind():
    kinds = set()
    for i in range(300):
        wl = draw_scenario(random.Random(f"kinds:{i}"), i)["workload"]
        kinds |= {k for k in ("trace", "synthetic", "requests") if k in wl}
    assert kinds == {"trace", "synthetic", "requests"}
