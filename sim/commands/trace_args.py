"""--trace-events FILE and --trace-events-limit N, shared by run and compare."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sim.errors import KvsimError
from sim.output import writable_folder
from sim.trace_events import DEFAULT_REQUEST_LIMIT


def add_trace_args(p: argparse.ArgumentParser, per_run: bool = False) -> None:
    where = " (one file per run: FILE's name with the run's label added)" if per_run else ""
    p.add_argument("--trace-events", metavar="FILE",
                   help=f"write a Chrome trace-event JSON for Perfetto / chrome://tracing{where}")
    p.add_argument("--trace-events-limit", type=int, default=DEFAULT_REQUEST_LIMIT, metavar="N",
                   help=f"request tracks in the trace: the first N requests (default {DEFAULT_REQUEST_LIMIT}; "
                        "0: none)")


def check_trace_args(args: argparse.Namespace) -> Path | None:
    """The trace path, checked before anything runs (bad input exits 2 and writes nothing)."""
    if args.trace_events_limit < 0:
        raise KvsimError("--trace-events-limit", f"must be 0 or more, got {args.trace_events_limit}")
    if not args.trace_events:
        return None
    path = Path(args.trace_events)
    if path.is_dir() or str(args.trace_events).endswith(("/", "\\")):
        raise KvsimError("--trace-events", f"{path} is a folder; give a file name such as trace.json")
    writable_folder(path, "--trace-events")
    return path


def per_run_path(path: Path, label: str) -> Path:
    """trace.json + 'block_size=8, preemption=swap' -> trace.block_size-8_preemption-swap.json."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label.replace("=", "-").replace(", ", "_")).strip("_") or "run"
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.stem if path.suffix else path.name}.{slug}{suffix}")
