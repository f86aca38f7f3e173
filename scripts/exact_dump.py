"""Dump every shipped scenario's tables (and fuzz cases, and the Azure hour's head) for bit-exact comparison.

    python scripts/exact_dump.py DIR              # write DIR/<case>.pkl
    python scripts/exact_dump.py DIR --compare REF  # write, then compare with REF's dumps exactly

Each case is run with multi-step decode off and on; the dump holds summary (without wall_time_s),
requests, steps and the timeline. Used to check that speed work changes no result.
"""

from __future__ import annotations

import argparse
import math
import pickle
import random
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.engine_bench import azure_scenario  # noqa: E402
from sim import load_scenario, run_scenario, scenario_from_dict  # noqa: E402
from sim.fuzz import _combination_problem, draw_scenario  # noqa: E402


def _strip(summary: dict) -> dict:
    out = dict(summary)
    out.pop("wall_time_s", None)
    return out


def _run(scn) -> dict:
    res = run_scenario(scn, check_integrity=False)
    return {"summary": _strip(res.summary), "requests": res.requests, "steps": res.steps,
            "timeline": res.timeline}


def cases(fuzz_count: int):
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if "sweep" in path.name or path.stem == "quickstart_gpu_cpu":   # a sweep; timed by the wall clock
            continue
        for ms in (False, True):
            yield f"{path.stem}-ms{int(ms)}", lambda p=path, m=ms: load_scenario(p, [f"scheduler.multi_step={str(m).lower()}"])
    for ms in (False, True):
        data = azure_scenario(3000)
        data["scheduler"]["multi_step"] = ms
        yield f"azure3000-ms{int(ms)}", lambda d=data: scenario_from_dict(d, base_dir=ROOT / "scenarios")
    for i in range(fuzz_count):
        data = draw_scenario(random.Random(f"20261130:{i}"), i)
        try:
            if _combination_problem(data) is not None:
                continue
        except Exception:  # noqa: BLE001
            continue
        yield f"fuzz{i:03d}", lambda d=data, i=i: scenario_from_dict(d, source=f"<fuzz {i}>")


def _same(a, b) -> str:
    if type(a) is not type(b):
        return f"type {type(a)} != {type(b)}"
    if isinstance(a, pd.DataFrame):
        if list(a.columns) != list(b.columns) or list(a.dtypes) != list(b.dtypes) or a.shape != b.shape:
            return "columns/dtypes/shape differ"
        for c in a.columns:
            x, y = a[c].tolist(), b[c].tolist()
            for i, (u, v) in enumerate(zip(x, y)):
                if not (u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))):
                    return f"column {c} row {i}: {u!r} != {v!r}"
        return ""
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"keys differ: {set(a) ^ set(b)}"
        for k in a:
            d = _same(a[k], b[k])
            if d:
                return f"{k}: {d}"
        return ""
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return ""
    return "" if a == b else f"{a!r} != {b!r}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--compare", default=None)
    ap.add_argument("--fuzz", type=int, default=120)
    ap.add_argument("--only", default=None, help="substring of case names")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    n = 0
    for name, make in cases(args.fuzz):
        if args.only and args.only not in name:
            continue
        try:
            dump = _run(make())
        except Exception as e:  # noqa: BLE001
            dump = {"error": f"{type(e).__name__}: {e}"}
        (out / f"{name}.pkl").write_bytes(pickle.dumps(dump))
        n += 1
        if args.compare:
            ref = pickle.loads((Path(args.compare) / f"{name}.pkl").read_bytes())
            d = _same(ref, dump)
            if d:
                bad += 1
                print(f"DIFF {name}: {d}", flush=True)
    print(f"{n} cases, {bad} differ" if args.compare else f"{n} cases written")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
