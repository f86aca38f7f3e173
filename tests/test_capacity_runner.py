"""The capacity search's candidate runner keeps one process pool for the whole search
(sim/cluster/capacity.py ``CandidateRunner``): its workers carry what a run leaves in a process (the
parsed calibration, the memoised prices) from one round of the bisection to the next."""

from __future__ import annotations

import os

import sim.cluster.capacity as capacity


def _pid_of_worker(data, base_dir, source, slos):
    return {"pid": os.getpid(), "x": data["x"]}


def test_one_pool_serves_every_round_until_closed(monkeypatch):
    monkeypatch.setattr(capacity, "evaluate", _pid_of_worker)
    with capacity.parallel_runner(".", "<test>", [], workers=2) as run:
        rounds = [run([{"x": r * 10 + i} for i in range(3)]) for r in range(4)]
        pool = run._pool
    assert [[c["x"] for c in r] for r in rounds] == [[r * 10 + i for i in range(3)] for r in range(4)]   # in order
    pids = {c["pid"] for r in rounds for c in r}
    assert os.getpid() not in pids and len(pids) <= 2   # the same two workers, every round
    assert run._pool is None and pool is not None
    again = run([{"x": 1}, {"x": 2}])   # (closed: a later call starts a new pool)
    assert [c["x"] for c in again] == [1, 2]
    run.close()


def test_a_single_worker_runs_inline(monkeypatch):
    monkeypatch.setattr(capacity, "evaluate", _pid_of_worker)
    with capacity.parallel_runner(".", "<test>", [], workers=1) as run:
        assert {c["pid"] for c in run([{"x": 1}, {"x": 2}])} == {os.getpid()} and run._pool is None
