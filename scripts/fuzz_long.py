#!/usr/bin/env python
"""Long fuzzing runs: thousands of random scenarios with every invariant checked after every step.

    .venv/bin/python scripts/fuzz_long.py --seed 14 --count 20000 --failures /tmp/fuzz-failures

Each failing scenario is written as a YAML file that ``kvsim run FILE --check`` replays. Case i of a seed is
reproducible on its own: ``--seed S --start i --count 1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

os.environ.setdefault("KVSIM_CHECK_INTEGRITY", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from sim.fuzz import CaseResult, fuzz  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--start", type=int, default=0, help="index of the first case")
    ap.add_argument("--failures", type=Path, default=Path("fuzz-failures"), help="folder for failing scenarios")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    seen = {"n": 0}

    def on_case(case: CaseResult) -> None:
        seen["n"] += 1
        if case.outcome == "failed":
            args.failures.mkdir(parents=True, exist_ok=True)
            path = args.failures / f"seed{args.seed}_case{case.index}.yaml"
            header = "".join(f"# {line}\n" for line in case.error.splitlines())
            path.write_text(header + yaml.safe_dump(case.scenario, sort_keys=False))
            print(f"FAILED case {case.index}: {case.error.splitlines()[0]} -> {path}", flush=True)
        if seen["n"] % 500 == 0:
            print(f"{seen['n']} cases, {time.perf_counter() - t0:.1f}s", flush=True)

    report = fuzz(args.seed, args.count, on_case=on_case, start=args.start)
    counts = report.counts()
    steps = sum(c.num_steps for c in report.cases)
    slowest = max(report.cases, key=lambda c: c.seconds)
    print(f"seed {args.seed}: {len(report.cases)} cases in {time.perf_counter() - t0:.1f}s, {steps} steps; "
          f"{counts}; slowest case {slowest.index} ({slowest.seconds:.2f}s)")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
