"""kvsim compare SCENARIO.yaml --vary key.path=v1,v2[,...] [--vary ...] [--set ...] [--slo METRIC_STAT=S ...]
[--workers N] [--out DIR] [--json]

One run per combination of the varied values (their cross product; with --workers, N at a time in worker
processes, the same results in the same order), a table of the main summary keys,
and, in DIR: compare.csv (every summary key, flattened, one row a run), overlaid latency CDFs and KV
usage, memory-breakdown bars side by side, the runs' output tokens/s against median TTFT and mean TPOT
(throughput_latency.png), the memory breakdown over time side by side
(memory_over_time.png), and the request timelines one above the other. With
--trace-events FILE, one Chrome trace per run (FILE's name plus the run's label). With --slo, each run's
summary gains ``slo`` (sim/goodput.py): whether it meets every SLO, each one's attainment, the goodput.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import pandas as pd

from sim.atomic_dir import replace_dir
from sim.cluster.capacity import parse_slo
from sim.commands.rejections import rejection_note
from sim.commands.trace_args import add_trace_args, check_trace_args, per_run_path
from sim.errors import KvsimError
from sim.output import flatten, prepare_results_dir, summary_json
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario, parse_override

MAX_COMPARE_RUNS = 1_000   # every run's tables stay in memory until the end; larger grids: kvsim sweep
MAX_WORKERS = 1024

# (column header, summary key, field of a latency mapping or None)
TABLE = [
    ("out tok/s", "output_throughput_tok_s", None), ("req/s", "request_throughput", None),
    ("TTFT p50", "ttft_s", "p50"), ("TPOT mean", "tpot_s", "mean"), ("E2E p99", "e2e_s", "p99"),
    ("norm lat", "normalized_latency_s_per_tok", "mean"), ("KV use", "kv_usage_mean", None),
    ("token st.", "memory_breakdown", "token_states"), ("preempt", "num_preemptions", None),
    ("swapped", "swapped_blocks", None), ("Jain", "jain_fairness", None), ("wait max", "queue_wait_max_s", None),
    ("swap s", "swap_time_s", None), ("done", "num_finished", None), ("makespan", "makespan_s", None),
]
# shown where a run has a prefix cache / a host tier under it / a client with a concurrency limit in front /
# a client timeout
CACHE_COLUMNS = [("prefix hit", "prefix_cache_hit_rate", None), ("host hit", "host_cache_hit_rate", None),
                 ("client wait", "client_wait_s", "mean"), ("aborted", "num_aborted", None)]
SLO_COLUMNS = [("SLOs met", "slo", "meets"), ("goodput", "slo", "goodput_req_s")]   # with --slo
# where the runs' caches, sized from HBM, differ (other weights, other GPUs): the KV cache's size, in GB
KV_COLUMN = ("KV GB", "hbm_budget", "kv_cache_bytes")


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="run a scenario for each combination of varied keys and compare")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--vary", action="append", default=[], metavar="KEY.PATH=V1,V2",
                   help="a key and the values to try (repeatable: the cross product is run)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key in every run (repeatable)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                   help="a service-level objective, e.g. ttft_p90=2 (repeatable; metrics ttft, tpot, itl, e2e; "
                        "stats mean, p50, p90, p99): adds whether each run meets them all, each one's attainment "
                        "and the goodput (requests a second within every bound)")
    p.add_argument("--workers", type=int, default=1,
                   help="runs at a time, in worker processes (default 1: one after another in this process)")
    p.add_argument("--out", help="folder for compare.csv and the overlaid plots")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--json", action="store_true", help="print one JSON object a run (its label, the varied keys' "
                   "values and its whole summary) instead of the table; other lines go to stderr")
    add_trace_args(p, per_run=True)
    p.set_defaults(func=main)


def parse_vary(texts: list[str]) -> list[tuple[str, list[str]]]:
    """``["a.b=1,2", "c=x"]`` -> ``[("a.b", ["1", "2"]), ("c", ["x"])]``; values stay text (parsed by --set)."""
    if not texts:
        raise KvsimError("--vary", "give at least one --vary key.path=v1,v2")
    out: list[tuple[str, list[str]]] = []
    for text in texts:
        path, _ = parse_override(text)  # validates key.path=value
        key = ".".join(path)
        values = [v.strip() for v in text.split("=", 1)[1].split(",")]
        if any(v == "" for v in values):
            raise KvsimError("--vary", f"{text!r}: empty value in the list")
        if key in [k for k, _ in out]:
            raise KvsimError("--vary", f"{key} is varied twice")
        out.append((key, values))
    return out


def combinations(vary: list[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
    keys = [k for k, _ in vary]
    return [list(zip(keys, combo)) for combo in itertools.product(*(vals for _, vals in vary))]


def label_of(combo: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in combo)


def run_all(scenario: str, vary: list[tuple[str, list[str]]], overrides: list[str], workers: int = 1
            ) -> dict[str, Result]:
    """One run per combination, in the order of the cross product; keys are the run labels. Every
    combination's scenario is read (and so checked) before any runs; ``workers`` > 1 runs them that many
    at a time in worker processes. Each summary gains ``swap_time_s``: the engine time spent moving
    blocks to and from CPU memory."""
    combos = combinations(vary)
    scns = [load_scenario(scenario, overrides, [f"{k}={v}" for k, v in combo]) for combo in combos]
    if workers > 1 and len(scns) > 1:
        from sim.worker_pool import worker_pool

        with worker_pool(min(workers, len(scns))) as pool:   # (stopped at once on Ctrl-C or an error)
            ran = list(pool.map(_run_one, scns, combos))
    else:
        ran = [_run_one(scn, combo) for scn, combo in zip(scns, combos)]
    return {label_of(combo): res for combo, res in zip(combos, ran)}


def _run_one(scn, combo: list[tuple[str, str]]) -> Result:
    """``run_scenario`` plus the summary's ``swap_time_s``; an error names the combination that failed."""
    try:
        res = run_scenario(scn)
    except KvsimError as e:
        varied = ", ".join(f"{k}={v}" for k, v in combo)
        raise KvsimError(e.where, f"{e.what} (with --vary {varied})") from None
    steps = res.steps
    res.summary["swap_time_s"] = float(steps["time_swap_s"].sum()) if "time_swap_s" in steps else 0.0
    return res


def compare_frame(results: dict[str, Result], vary: list[tuple[str, list[str]]]) -> pd.DataFrame:
    rows = []
    for (label, res), combo in zip(results.items(), combinations(vary)):
        rows.append({"run": label, **{k: v for k, v in combo}, **flatten(res.summary)})
    return pd.DataFrame(rows)


def compare_json(results: dict[str, Result], vary: list[tuple[str, list[str]]]) -> str:
    """A JSON list, one object a run in table order: ``run`` (its label), ``varied`` (each varied key's
    value as given on the command line) and ``summary`` (summary.json's content, NaN as null)."""
    rows = [{"run": label, "varied": dict(combo), "summary": json.loads(summary_json(res.summary))}
            for (label, res), combo in zip(results.items(), combinations(vary))]
    return json.dumps(rows, indent=2) + "\n"


def _cell(summary: dict, key: str, field: str | None) -> str:
    v = summary.get(key)
    if field is not None and isinstance(v, dict):
        v = v.get(field)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if field is not None and field.endswith("_bytes"):
        return f"{v / 1e9:.4g}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def add_slo_reports(results: dict[str, Result], slos: list) -> None:
    """Each run's summary gains ``slo`` (sim/goodput.py ``slo_report``: each SLO's figure, ``meets``, each
    one's attainment and ``goodput_req_s``)."""
    from sim.goodput import slo_report

    for res in results.values():
        res.summary["slo"] = slo_report(res.requests, res.summary, slos)


def print_table(results: dict[str, Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="kvsim compare", header_style="bold")
    t.add_column("run")
    caching = [r.scenario.kv_cache.prefix_caching for r in results.values()]
    hosts = ["host_cache_hit_rate" in r.summary for r in results.values()]
    clients = ["client_wait_s" in r.summary for r in results.values()]
    timeouts = ["num_aborted" in r.summary for r in results.values()]   # (workload.timeout_s)
    table = TABLE + [c for c, shown in zip(CACHE_COLUMNS, (any(caching), any(hosts), any(clients), any(timeouts)))
                     if shown]
    kv_bytes = {r.summary.get("hbm_budget", {}).get("kv_cache_bytes") for r in results.values()}
    if len(kv_bytes) > 1:
        table.append(KV_COLUMN)
    if all("slo" in r.summary for r in results.values()):
        table += SLO_COLUMNS
    for head, _, _ in table:
        t.add_column(head, justify="right")
    for label, res in results.items():
        t.add_row(label, *(_cell(res.summary, k, f) for _, k, f in table))
    Console(width=max(160, 12 * len(table) + 30)).print(t)


def intervals_of(res: Result) -> pd.DataFrame:
    """The run's state intervals (Result.timeline when the runner keeps it, else from requests.csv)."""
    from sim.timeline import intervals_from_requests

    tl = getattr(res, "timeline", None)
    return tl if tl is not None else intervals_from_requests(res.requests)


def write_plots(results: dict[str, Result], out: Path) -> list[str]:
    """Overlays and side-by-side panels into ``out`` (the staging folder); with one varied key the legends
    show just its values. Returns the file names."""
    from sim import plots
    from sim.latency_breakdown import latency_breakdown
    from sim.memory_plot import memory_over_time
    from sim.timeline import timeline

    if all(label.count("=") == 1 for label in results):
        results = {label.split("=", 1)[1]: r for label, r in results.items()}
    made = [
        plots.latency_cdf({k: r.requests for k, r in results.items()}, out / "latency_cdf.png"),
        plots.kv_usage({k: r.steps for k, r in results.items()}, out / "kv_usage.png"),
        plots.memory_breakdown({k: r.summary["memory_breakdown"] for k, r in results.items()},
                               out / "memory_breakdown.png"),
        plots.throughput_latency({k: r.summary for k, r in results.items()}, out / "throughput_latency.png"),
        timeline({k: intervals_of(r) for k, r in results.items()}, out / "timeline.png"),
        memory_over_time({k: r.steps for k, r in results.items()}, out / "memory_over_time.png"),
        latency_breakdown({k: (intervals_of(r), r.requests) for k, r in results.items()},
                          out / "latency_breakdown.png"),
    ]
    if all("hbm_budget" in r.summary for r in results.values()):   # (every cache sized from HBM)
        made.append(plots.hbm_budget({k: r.summary["hbm_budget"] for k, r in results.items()}, out / "hbm_budget.png"))
    return [f.name for f in made]


def main(args: argparse.Namespace) -> int:
    vary = parse_vary(args.vary)
    slos = [parse_slo(t) for t in args.slo]
    if not 1 <= args.workers <= MAX_WORKERS:
        raise KvsimError("--workers", f"must be 1 .. {MAX_WORKERS}, got {args.workers}")
    runs = math.prod(len(values) for _, values in vary)
    if runs > MAX_COMPARE_RUNS:
        raise KvsimError("--vary", f"{runs:,} combinations; kvsim compare runs at most {MAX_COMPARE_RUNS:,} "
                         "(use kvsim sweep for larger grids)")
    out = prepare_results_dir(args.out) if args.out else None
    trace = check_trace_args(args)
    results = run_all(args.scenario, vary, list(args.overrides), args.workers)
    if slos:
        add_slo_reports(results, slos)
    notes = sys.stderr if args.json else sys.stdout   # with --json, stdout holds the JSON alone
    if args.json:
        sys.stdout.write(compare_json(results, vary))
    else:
        print_table(results)
    for label, res in results.items():   # (why a run's requests were rejected, where some were)
        note = rejection_note(res.requests)
        if note:
            print(f"{label}: {note}", file=notes)
    if trace is not None:
        from sim.trace_events import write_trace_events

        for label, res in results.items():
            path = write_trace_events(per_run_path(trace, label), res.steps, intervals_of(res),
                                      request_limit=args.trace_events_limit, name=label)
            print(f"wrote {path}", file=notes)
    if out is not None:
        frame = compare_frame(results, vary)

        def fill(stage: Path) -> list[str]:   # the folder is replaced whole (sim.atomic_dir), as kvsim run's
            frame.to_csv(stage / "compare.csv", index=False)
            return ["compare.csv"] + ([] if args.no_plots else write_plots(results, stage))

        files = replace_dir(out, fill)
        print(f"wrote {len(files)} files to {out}/", file=notes)
    return 0
