"""Two runs' results compared bit for bit (summary.json apart from wall_time_s, and every table)."""

from __future__ import annotations

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
