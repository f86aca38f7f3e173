"""kvsim trace-info TRACE [--format F] [--plot PATH] [--json]: counts, rates and lengths of a trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.errors import KvsimError
from sim.workload.traces import FORMATS, TIME_UNITS, guess_format


def add_parser(sub) -> None:
    p = sub.add_parser("trace-info", help="requests, time span, rate, burstiness and lengths of a trace")
    p.add_argument("trace", help="trace file (azure/burstgpt/vidur/csv, or mooncake/jsonl)")
    p.add_argument("--format", choices=FORMATS, help="file format (guessed from the extension and columns)")
    p.add_argument("--plot", metavar="PATH", help="draw arrival rate over time and length histograms")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--model-filter", metavar="MODEL", help="burstgpt: keep this Model's rows only")
    p.add_argument("--column", action="append", default=[], metavar="FIELD=NAME",
                   help="csv/jsonl: map a field (arrival, prompt_len, output_len, ...) to a column")
    p.add_argument("--time-unit", choices=sorted(TIME_UNITS), default="s", help="csv/jsonl: arrival unit")
    p.set_defaults(func=main)


def _columns(pairs: list[str]) -> dict[str, str]:
    out = {}
    for text in pairs:
        if "=" not in text:
            raise KvsimError("--column", f"expected FIELD=NAME, got {text!r}")
        field, name = text.split("=", 1)
        out[field.strip()] = name.strip()
    return out


def _fmt(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def render(info: dict) -> str:
    lines = [
        f"trace           {info['trace']} ({info['format']})",
        f"requests        {info['requests']:,}"
        + (f"  ({info['rows_skipped']:,} rows skipped: "
           + ", ".join(f"{k}: {v:,}" for k, v in info["skipped_by_reason"].items()) + ")"
           if info["rows_skipped"] else ""),
        f"time span       {_fmt(info['time_span_s'])} s",
        f"mean rate       {_fmt(info['mean_rate_rps'], 3)} requests/s",
        f"burstiness (CV) {_fmt(info['burstiness_cv'], 3)}",
        f"{'':16}{'mean':>10}{'p50':>10}{'p99':>10}{'max':>10}",
    ]
    for key in ("prompt_len", "output_len"):
        s = info[key]
        lines.append(f"{key:16}{_fmt(s['mean']):>10}{_fmt(s['p50']):>10}{_fmt(s['p99']):>10}{_fmt(s['max']):>10}")
    if "block_repeat_fraction" in info:
        lines.append(f"repeated blocks {info['block_repeat_fraction']:.3f} of prompt block references")
    lines += [f"warning: {w}" for w in info["warnings"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from sim.workload.summary import load_for_info, plot_trace, trace_summary

    path = Path(args.trace)
    source = str(path)
    if not path.exists():
        raise KvsimError(source, "no such file")
    if path.is_dir():
        raise KvsimError(source, "is a directory, not a trace file")
    if args.format:
        fmt = args.format
    elif args.column:  # a column mapping means a generic file
        fmt = "jsonl" if path.suffix in (".jsonl", ".json") else "csv"
    else:
        fmt = guess_format(path, source)
    cols, stats = load_for_info(path, fmt, source, columns=_columns(args.column), model_filter=args.model_filter,
                                time_unit=args.time_unit)
    info = trace_summary(cols, stats, fmt, source)
    if args.plot:
        plot_trace(cols, Path(args.plot), f"{path.name} ({fmt}, {len(cols):,} requests)")
        info["plot"] = args.plot
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0
