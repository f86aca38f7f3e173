"""kvsim sweep SWEEP.yaml [--ray [ADDRESS]] [--workers N]: a grid of runs into one results table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sim.errors import KvsimError
from sim.output import writable_folder
from sim.trace_events import DEFAULT_REQUEST_LIMIT

MAX_WORKERS = 1024


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of scenarios (resumable) into one results table")
    p.add_argument("sweep", help="sweep YAML file (base, grid, repeats, out)")
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: CPU count, at most the number of runs)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray (a local cluster, or the one at ADDRESS)")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; run nothing")
    p.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                   help="no progress bar (there is none anyway when stderr is not a terminal)")
    p.add_argument("--trace-events", metavar="DIR",
                   help="write each run's Chrome trace-event JSON (Perfetto) to DIR/TASK_ID.json")
    p.add_argument("--trace-events-limit", type=int, default=DEFAULT_REQUEST_LIMIT, metavar="N",
                   help=f"request tracks per trace: the first N requests (default {DEFAULT_REQUEST_LIMIT})")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from sim.sweep import load_sweep, run_sweep

    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise KvsimError("--workers", f"must be 1 .. {MAX_WORKERS}, got {args.workers}")
    if args.trace_events_limit < 0:
        raise KvsimError("--trace-events-limit", f"must be 0 or more, got {args.trace_events_limit}")
    trace_dir = Path(args.trace_events) if args.trace_events else None
    if trace_dir is not None and trace_dir.exists() and not trace_dir.is_dir():
        raise KvsimError("--trace-events", f"{trace_dir} is a file; sweep takes a folder for one trace per run")
    if trace_dir is not None:
        writable_folder(trace_dir / "TASK_ID.json", "--trace-events")
    sweep = load_sweep(args.sweep)
    if args.dry_run:
        for t in sweep.tasks:
            point = ", ".join(f"{k}={v!r}" for k, v in t.params) or "(base)"
            print(f"{t.task_id}  {point}  repeat={t.repeat} seed={t.seed}")
        print(f"{len(sweep.tasks)} runs -> {os.path.normpath(sweep.out_dir)}/")
        return 0
    # never more processes than runs (a pool forks all its workers up front)
    workers = max(1, min(args.workers or os.cpu_count() or 1, len(sweep.tasks)))
    outcome = run_sweep(sweep, workers=workers, use_ray=args.ray is not None, ray_address=args.ray or None,
                        progress=not args.no_progress and sys.stderr.isatty(), trace_dir=trace_dir,
                        trace_limit=args.trace_events_limit)
    print(f"{outcome.total} runs: {outcome.ran} ran ({outcome.failed} failed), {outcome.skipped} already done; "
          f"results in {os.path.normpath(sweep.out_dir)}/")
    return 1 if outcome.failed else 0
