"""numpy's huge-page advice is off while kvsim builds its tables (sim/small_pages.py), and as it was after."""

from __future__ import annotations

import pytest

from sim.small_pages import _switch, small_pages

switch = _switch()
pytestmark = pytest.mark.skipif(switch is None, reason="this numpy has no huge-page switch")


def advice() -> bool:
    """numpy's current setting (read by setting it back as it was)."""
    now = switch(True)
    switch(now)
    return now


@pytest.mark.parametrize("before", [True, False])
def test_off_inside_and_restored_after_even_on_an_error(monkeypatch, before):
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    old = switch(before)
    try:
        with small_pages():
            assert advice() is False
        assert advice() is before
        with pytest.raises(KeyError), small_pages():
            {}["missing"]
        assert advice() is before
    finally:
        switch(old)


def test_a_users_own_choice_is_left_alone(monkeypatch):
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    old = switch(True)
    try:
        with small_pages():
            assert advice() is True
    finally:
        switch(old)


def test_overlapping_blocks_restore_the_setting_once_the_last_one_ends(monkeypatch):
    """Two runs in threads, the first to start ends first: the advice stays off until the second ends,
    and is then back as it was (a plain save-and-restore in each would leave it off)."""
    import threading

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    old = switch(True)
    second_in, first_out, seen = threading.Event(), threading.Event(), []

    def second():
        with small_pages():
            second_in.set()
            first_out.wait()
            seen.append(advice())   # the first block has ended; this one is still open

    t = threading.Thread(target=second)
    try:
        with small_pages():
            t.start()
            second_in.wait()
        first_out.set()
        t.join()
        assert seen == [False] and advice() is True
    finally:
        switch(old)


def test_run_scenario_builds_its_tables_without_the_advice(monkeypatch, tmp_path):
    """The per-step table is filled inside ``small_pages`` (its arrays are large on long runs)."""
    import sim.metrics as metrics
    from sim import run_scenario, scenario_from_dict

    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    seen = []
    read = metrics.Recorder.read_steps
    monkeypatch.setattr(metrics.Recorder, "read_steps", lambda self, *a, **k: (seen.append(advice()), read(self, *a, **k))[1])
    scn = scenario_from_dict({"name": "t", "model": "llama-2-7b", "hardware": "a100-80gb", "workload": {"synthetic": {
        "num_requests": 4, "prompt_len": {"dist": "fixed", "value": 32}, "output_len": {"dist": "fixed", "value": 8}}}},
        base_dir=tmp_path)
    old = switch(True)
    try:
        run_scenario(scn, check_integrity=False)
        assert advice() is True
    finally:
        switch(old)
    assert seen == [False]
