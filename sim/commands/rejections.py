"""A one-line console note on the requests a run rejected and why (the reasons its requests.csv holds)."""

from __future__ import annotations

import re

import pandas as pd

SHOWN = 3   # the most common kinds of reason named; the rest counted
_NUMBER = re.compile(r"\d[\d,.]*")


def rejection_note(requests: pd.DataFrame) -> str | None:
    """``note: N of M requests rejected: C like "reason"; ...`` or None when none was.

    Reasons that differ only in their numbers ("needs 5 KV blocks" and "needs 6 KV blocks") are one kind,
    shown by its first reason met; the most common kinds first (ties in the order first met)."""
    if "status" not in requests or requests.empty:
        return None
    rejected = requests.loc[requests["status"].astype(str) == "REJECTED", "reject_reason"]
    if rejected.empty:
        return None
    reasons = rejected.astype(object).fillna("no reason recorded").astype(str)
    kinds: dict[str, list] = {}   # kind -> [count, first reason met]
    for reason in reasons:
        kind = kinds.setdefault(_NUMBER.sub("#", reason), [0, reason])
        kind[0] += 1
    ranked = sorted(kinds.values(), key=lambda kind: -kind[0])   # stable: ties keep first-met order
    named = [f'{count:,} like "{example}"' for count, example in ranked[:SHOWN]]
    more = len(ranked) - SHOWN
    tail = ""
    if more > 0:
        tail = f"; {sum(k[0] for k in ranked[SHOWN:]):,} for {more:,} other reason{'s' if more > 1 else ''}"
    return f"note: {len(rejected):,} of {len(requests):,} requests rejected: " + "; ".join(named) + tail
