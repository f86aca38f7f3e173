"""The decode lane (sim/sched/decode_lane.py) keeps the running decodes in arrays; a step planned and
updated through it must equal the per-request loop bit for bit: every shipped scenario (trimmed), the
multi-step stress scenarios and a hundred fuzzer cases are run with the lane off and with it on for
batches of any size (LANE_MIN_BATCH = 1), with the integrity checks (which compare the lane with one
rebuilt from the requests) on where the caches are small. In the stress scenarios decode runs are
planned from the lane and move it on (``DecodeLane.advance``), checked against a rebuilt lane after
each run."""

from __future__ import annotations

import copy
import glob
import random
from pathlib import Path

import numpy as np
import pytest
from result_compare import assert_same, assert_same_outcome, off_and_on
from test_multi_step import NOT_COMPARABLE, STRESS

import sim.sched.continuous as continuous
from sim.executors.cost_model import make_cost_model_executor
from sim.fuzz import draw_scenario
from sim.request import Request
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario, scenario_from_dict
from sim.sched.decode_lane import DecodeLane
from sim.sched.plan import LaneEntries, ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

pytestmark = pytest.mark.usefixtures("simpy_loop")   # the SimPy loop's own paths (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def lane_steps(monkeypatch) -> dict[str, int]:
    """Lanes for every batch size; counts the steps planned through one and the decode runs it followed
    (planned from its arrays and moved on by them, not rebuilt)."""
    monkeypatch.setattr(continuous, "LANE_MIN_BATCH", 1)
    counts = {"steps": 0, "runs": 0}
    take = continuous.ContinuousScheduler._take_lane
    advance = DecodeLane.advance

    def counting(self, budget, chunked):
        lane = take(self, budget, chunked)
        counts["steps"] += lane is not None
        return lane

    def advancing(self, k, end, keep):
        counts["runs"] += 1
        advance(self, k, end, keep)

    monkeypatch.setattr(continuous.ContinuousScheduler, "_take_lane", counting)
    monkeypatch.setattr(DecodeLane, "advance", advancing)
    return counts


def _both(monkeypatch, run) -> tuple[Result | str, Result | str]:
    return off_and_on(monkeypatch, continuous.ContinuousScheduler, "use_lane", run)


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "scenarios" / "*.yaml"))), ids=lambda p: Path(p).name)
def test_shipped_scenarios_equal(path, lane_steps, monkeypatch):
    if Path(path).name in NOT_COMPARABLE:
        pytest.skip(NOT_COMPARABLE[Path(path).name])
    off, on = _both(monkeypatch, lambda: run_scenario(load_scenario(path, ["workload.limit=250"]),
                                                               check_integrity=False))   # big caches: slow checks
    assert_same(off, on)


@pytest.mark.parametrize("name", sorted(n for n, d in STRESS.items() if d["scheduler"].get("policy") != "priority"))
def test_stress_scenarios_equal(name, lane_steps, monkeypatch):
    data = copy.deepcopy(STRESS[name])   # (the priority policy sorts its batch: no lane)
    data["output"] = {"plots": False}
    check = name != "long_decodes"
    off, on = _both(monkeypatch, lambda: run_scenario(scenario_from_dict(copy.deepcopy(data), source="<t>"),
                                                      check_integrity=check))
    assert_same(off, on)
    assert lane_steps["steps"] > 0, "no step went through a lane"
    assert lane_steps["runs"] > 0, "no decode run followed the lane"


def test_fuzz_cases_equal(lane_steps, monkeypatch):
    for i in range(100):
        data = draw_scenario(random.Random(f"decode-lane:{i}"), i)
        off, on = _both(monkeypatch, lambda d=data: run_scenario(scenario_from_dict(copy.deepcopy(d), source="<fuzz>"),
                                                                 check_integrity=True))
        assert_same_outcome(off, on, f"case {i}")
    assert lane_steps["steps"] > 0


def _req(rid: int, prompt: int, generated: int, out: int, last: float) -> Request:
    r = Request(rid, 0.0, prompt, out)
    r.num_generated = generated
    r.num_computed_tokens = prompt + generated - 1
    r.last_token_s = last
    return r


def test_a_prefilled_request_joins_the_decodes_at_its_running_position():
    a, b, c = _req(1, 10, 3, 50, 1.0), _req(2, 20, 1, 50, 1.0), _req(3, 5, 7, 50, 1.0)
    pre = Request(4, 0.0, 30, 50)
    lane = DecodeLane.build([a, pre, b, c], {4}, {1: 0, 4: 1, 2: 2, 3: 3})
    assert [r.req_id for r in lane.reqs] == [1, 2, 3] and lane.prefills == [pre]
    assert lane.comp.tolist() == [12, 20, 11] and lane.gen.tolist() == [3, 1, 7]
    lane.step(2.0)   # one token each, in the arrays; the requests are written back by sync (or write)
    assert (b.num_computed_tokens, b.num_generated, b.last_token_s) == (20, 1, 1.0)
    lane.write([1])
    assert (b.num_computed_tokens, b.num_generated, b.last_token_s) == (21, 2, 2.0)
    assert a.num_generated == 3
    lane.sync()
    assert [(r.num_computed_tokens, r.num_generated, r.last_token_s) for r in (a, b, c)] == \
        [(13, 4, 2.0), (21, 2, 2.0), (12, 8, 2.0)]
    pre.num_computed_tokens, pre.num_generated, pre.last_token_s = 30, 1, 2.0
    assert lane.prefilled(pre)
    assert [r.req_id for r in lane.reqs] == [1, 4, 2, 3]   # rank 1: between a and b
    assert lane.comp.tolist() == [13, 30, 21, 12] and lane.rank.tolist() == [0, 1, 2, 3]
    assert lane.last_times().tolist() == [2.0] * 4
    lane.drop([1, 3])
    assert [r.req_id for r in lane.reqs] == [1, 2] and lane.out.tolist() == [50, 50]
    assert lane.comp.tolist() == [13, 21] and lane.comp_sum == 34 and lane.left == 46   # a: 50 - 4



def test_the_lane_counts_down_to_its_next_finish():
    # tokens left to sample (output - generated): a 47, b 49, c 43 -> the first finish is 43 steps away
    a, b, c = _req(1, 10, 3, 50, 1.0), _req(2, 20, 1, 50, 1.0), _req(3, 5, 7, 50, 1.0)
    pre = Request(4, 0.0, 30, 6)
    lane = DecodeLane.build([a, pre, b, c], {4}, {1: 0, 4: 1, 2: 2, 3: 3})
    assert lane.left == 43
    lane.step(2.0)
    assert lane.left == 42 and lane.last is None   # one common last-token time, 2.0
    # the prefill samples its first token at 2.0 too: 6 - 1 = 5 left, and the common time stays
    pre.num_computed_tokens, pre.num_generated, pre.last_token_s = 30, 1, 2.0
    assert lane.prefilled(pre)
    assert lane.left == 5 and lane.last is None and lane.last_times().tolist() == [2.0] * 4
    for t in range(5):
        lane.step(3.0 + t)
    assert lane.left == 0 and lane.finished() == [1]
    lane.drop([1])   # pre finished: a, b, c have 41, 43, 37 left
    assert lane.left == 37

def test_a_request_with_more_than_one_token_to_compute_gets_no_lane():
    r = _req(1, 10, 3, 50, 1.0)
    r.num_computed_tokens -= 1   # two tokens to compute: not a decode step
    assert DecodeLane.build([r], set(), {1: 0}) is None


def test_lane_entries_stand_for_the_list_of_scheduled_requests():
    tables = {1: [4, 5], 2: [7], 3: [9, 10, 11]}
    rest = [ScheduledRequest(3, 12, 20, tables[3])]
    entries = LaneEntries(np.array([1, 2]), np.array([17, 3]), tables, rest)
    listed = [ScheduledRequest(1, 1, 17, tables[1]), ScheduledRequest(2, 1, 3, tables[2]), rest[0]]
    assert list(entries) == listed and len(entries) == 3 and entries[-1] == rest[0] and entries[1] == listed[1]
    # the cost model prices both the same (it reads the lane's size and context sum)
    ex = make_cost_model_executor(model=ModelSpec.from_name("llama-2-7b"), hardware=HardwareSpec.from_name("h100-80gb"))
    assert ex.execute(StepPlan(scheduled=entries)) == ex.execute(StepPlan(scheduled=listed))
