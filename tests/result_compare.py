"""Two runs' results compared bit for bit (summary.json apart from wall_time_s, and every table)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from sim.output import summary_json
from sim.runner import Result


def assert_same(a: Result, b: Result) -> None:
    sa, sb = dict(a.summary), dict(b.summary)
    sa.pop("wall_time_s")
    sb.pop("wall_time_s")
    assert summary_json(sa) == summary_json(sb)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    if a.timeline is not None:
        pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)


def outcome(run: Callable[[], Result]) -> Result | str:
    """``run()``'s result, or the one-line text of what it raised (a case that fails must fail the same way
    both ways)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def assert_same_outcome(a: Result | str, b: Result | str, label: str = "") -> None:
    """Two ``outcome``s: the same error text, or the same results bit for bit."""
    if isinstance(a, str) or isinstance(b, str):
        assert a == b, label
    else:
        assert_same(a, b)


def same_cluster_outcome(loop: Result | str, core: Result | str, label: str = "") -> bool:
    """``assert_same_outcome`` of a cluster's two runs, their replicas tables too; whether the second ran in
    the compiled core."""
    assert_same_outcome(loop, core, label)
    if isinstance(core, str):
        return False
    pd.testing.assert_frame_equal(loop.replicas, core.replicas, check_exact=True)
    return bool(core.profile.get("compiled_core"))


def off_and_on(monkeypatch, owner: object, flag: str, run: Callable[[], Result]) -> tuple[Result | str, Result | str]:
    """``run``'s outcome with ``owner.flag`` False, then True."""
    out = []
    for on in (False, True):
        monkeypatch.setattr(owner, flag, on)
        out.append(outcome(run))
    return out[0], out[1]
