"""An independent checker of the Chrome trace-event format (the subset kvsim writes).

Written from the Trace Event Format document (Google, "JSON Object Format"), not from sim/trace_events.py:
the object form {"traceEvents": [...], "displayTimeUnit": "ms"|"ns", "otherData": {...}}; every event has a one-letter ph,
a name, and integer pid (and tid except counters); "X" complete events need numeric ts >= 0 and dur >= 0;
"C" counters need ts and args of numbers; "M" metadata events are process_name / thread_name /
process_sort_index / thread_sort_index with their args, or any other name with an args object. Slices on one
(pid, tid) track must nest or not overlap at all (what viewers require to stack them).
"""

from __future__ import annotations

import math
from collections import defaultdict

KNOWN_PHASES = set("XBEiICMbnesftPONDR")
METADATA_ARGS = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
                 "thread_sort_index": "sort_index"}
EPS_US = 1e-3  # a nanosecond: timestamps are microseconds with three decimals


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_trace(obj) -> list[str]:
    """Every problem found (an empty list: the trace is well formed)."""
    errs: list[str] = []
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    if not isinstance(obj.get("otherData", {}), dict):
        errs.append("otherData must be an object")
    if obj.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errs.append(f"displayTimeUnit {obj.get('displayTimeUnit')!r}")
    tracks: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for i, e in enumerate(obj["traceEvents"]):
        where = f"event {i}"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in KNOWN_PHASES:
            errs.append(f"{where}: ph {ph!r}")
            continue
        if not isinstance(e.get("name"), str):
            errs.append(f"{where}: name missing")
        if not isinstance(e.get("pid"), int):
            errs.append(f"{where}: pid must be an integer")
        if ph in "XM" and not isinstance(e.get("tid"), int):
            errs.append(f"{where}: tid must be an integer")
        if ph == "X":
            if not (_num(e.get("ts")) and e["ts"] >= 0):
                errs.append(f"{where}: ts {e.get('ts')!r}")
            elif not (_num(e.get("dur")) and e["dur"] >= 0):
                errs.append(f"{where}: dur {e.get('dur')!r}")
            else:
                tracks[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"] + e["dur"])))
            if "args" in e and not isinstance(e["args"], dict):
                errs.append(f"{where}: args must be an object")
        elif ph == "C":
            if not (_num(e.get("ts")) and e["ts"] >= 0):
                errs.append(f"{where}: counter ts {e.get('ts')!r}")
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(_num(v) for v in args.values()):
                errs.append(f"{where}: counter args must be numbers")
        elif ph == "M":
            args = e.get("args")
            if not isinstance(args, dict):
                errs.append(f"{where}: metadata without args")
            elif e.get("name") in METADATA_ARGS and METADATA_ARGS[e["name"]] not in args:
                errs.append(f"{where}: {e['name']} without args.{METADATA_ARGS[e['name']]}")
    for track, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for a, b in spans:
            while stack and stack[-1] <= a + EPS_US:
                stack.pop()
            if stack and b > stack[-1] + EPS_US:
                errs.append(f"track {track}: slice [{a}, {b}] overlaps one ending at {stack[-1]}")
                break
            stack.append(b)
    return errs
