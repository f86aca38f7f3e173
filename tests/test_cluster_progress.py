"""The progress bar of cluster runs: colocated (compiled core and SimPy loop) and disaggregated (pull and
push). It counts each request once, when it is done where it ends (a decode replica, or its prefill replica
for one output token, or rejected anywhere), never goes back, reaches every request, and changes no result."""

from __future__ import annotations

import pytest

import sim.cluster.runner as cluster_runner
from sim import engine_core, progress_bar
from sim.runner import run_scenario
from sim.scenario import scenario_from_dict

TINY = {"model": "tiny-llama", "hardware": "a100-80gb", "output": {"plots": False},
        "frontend": {"enabled": False}, "kv_cache": {"block_size": 16, "num_gpu_blocks": 400}}
# 60 requests; output 1 for i = 0 and 30 (finished on the prefill side when disaggregated); one prompt of
# 9,000 tokens that no replica can hold (400 blocks of 16): rejected
REQS = [{"arrival": 0.002 * i, "prompt_len": 9000 if i == 17 else 40 + 13 * (i % 9), "output_len": 1 + (i * 7) % 30}
        for i in range(60)]


class Recorded(progress_bar.ProgressBar):
    """The real bar, never shown, recording what it is told and keeping the SimPy loop's count."""

    made: list[Recorded] = []

    def __init__(self, total: int, after_s: float = 0.0) -> None:
        super().__init__(total, after_s=1e9)
        self.total, self.shown, self.done = total, [], None
        Recorded.made.append(self)

    def stepper(self, done):
        self.done = done
        return super().stepper(done)

    def at(self, done: int) -> None:
        self.shown.append(done)


def _cluster(**cluster) -> dict:
    return {**TINY, "workload": {"requests": REQS}, "cluster": {"router": {"policy": "round_robin"}, **cluster}}


CASES = {
    "colocated-core": (_cluster(replicas=3), True),
    "colocated-loop": (_cluster(replicas=3), False),
    "pull": (_cluster(prefill={"replicas": 2}, decode={"replicas": 2},
                      kv_transfer={"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.01}, "mode": "pull"}), False),
    "push": (_cluster(prefill={"replicas": 1}, decode={"replicas": 3},
                      kv_transfer={"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.01}, "mode": "push"}), False),
    "pull-core": (_cluster(prefill={"replicas": 2}, decode={"replicas": 2},
                           kv_transfer={"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.01}, "mode": "pull"}), True),
    "push-core": (_cluster(prefill={"replicas": 1}, decode={"replicas": 3},
                           kv_transfer={"link": {"bandwidth_gb_s": 1.0, "latency_s": 0.01}, "mode": "push"}), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cluster_progress_counts_every_request_once(monkeypatch, case):
    data, core = CASES[case]
    monkeypatch.setattr(engine_core, "enabled", core)
    monkeypatch.setattr(engine_core, "PROGRESS_EVERY", 5)
    monkeypatch.setattr(progress_bar, "EVERY", 5)
    monkeypatch.setattr(cluster_runner, "ProgressBar", Recorded)
    Recorded.made = []
    plain = run_scenario(scenario_from_dict(data))
    shown = run_scenario(scenario_from_dict(data), progress=True)
    assert shown.profile.get("compiled_core", False) is core
    bar, = Recorded.made
    assert bar.total == 60
    assert bar.shown and bar.shown == sorted(bar.shown) and bar.shown[-1] <= 60
    if not core:   # the loop's count, read once the run is over: every request, each once
        assert bar.done() == 60
    status = shown.requests["status"].value_counts().to_dict()
    assert status == {"FINISHED": 59, "REJECTED": 1}
    # the bar changes nothing
    for key in set(plain.summary) - {"wall_time_s"}:
        assert shown.summary[key] == plain.summary[key], key
    assert shown.requests.equals(plain.requests) and shown.steps.equals(plain.steps)
