"""kvsim run SCENARIO.yaml [--out DIR] [--set key.path=value ...] [--slo METRIC_STAT=S ...] [--json]: run one
scenario, print its summary (a table, or with --json the text of summary.json on stdout and every other line on
stderr); with --slo the summary gains ``slo`` (sim/goodput.py)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from sim.atomic_dir import commit_stage, new_stage, replace_dir
from sim.cluster.capacity import parse_slo
from sim.cluster.output import write_cluster_files
from sim.commands.progress import add_progress_args, progress_mode
from sim.commands.rejections import rejection_note
from sim.commands.summary_table import print_summary
from sim.commands.trace_args import add_trace_args, check_trace_args
from sim.output import prepare_results_dir, summary_json, write_table, write_tables
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario
from sim.step_stream import StepTableStream


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a scenario file and print its summary")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="folder for summary.json, requests.csv, steps.csv, steps.parquet, the figures "
                   "and report.html (default: the scenario's output.dir, relative to the scenario file)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--check", action="store_true", help="check every KV invariant after every step (slow)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                   help="a service-level objective, e.g. ttft_p90=2 (repeatable, as kvsim capacity takes it): "
                        "summary.json gains slo (whether the run meets them all, each one's attainment, the "
                        "goodput)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON (summary.json's text) instead of the table; other lines go to stderr")
    add_progress_args(p)
    add_trace_args(p)
    p.set_defaults(func=main)


def write_results(result: Result, out: Path, plots: bool = True, stage: Path | None = None,
                  stream: StepTableStream | None = None) -> list[Path]:
    """summary.json, requests.csv, steps.csv and steps.parquet (the same table; pyarrow writes both), the
    figures and report.html, as a new folder that replaces ``out`` whole (sim.atomic_dir): an error,
    Ctrl-C, SIGTERM or a kill at any moment leaves the previous results or the new ones, never a mix,
    and no staging debris after the next run. ``stage`` and ``stream``: the staging folder made before the
    run and the stream that wrote the per-step table into it while the run went (``results_stage``); its
    files are kept where they hold the finished table, else written again."""

    def fill(stage: Path) -> list[str]:
        write_table(result.requests, stage / "requests.csv")
        # (close keeps the stream's files only where they hold this table, else removes them)
        if stream is None or not stream.close(list(result.steps.columns), len(result.steps)):
            write_tables(result.steps, [stage / "steps.csv", stage / "steps.parquet"])
        names = ["requests.csv", "steps.csv", "steps.parquet"]
        names += [f.name for f in write_cluster_files(result, stage, plots)]   # clusters: replicas.csv, figures
        if plots:
            from sim import plots as figs

            names += [f.name for f in figs.write_run_plots(result.requests, result.steps, result.summary, stage,
                                                        timeline=result.timeline)]
        from sim.report import write_report

        names.append(write_report(result, stage, [stage / n for n in names if n.endswith(".png")]).name)
        (stage / "summary.json").write_text(summary_json(result.summary))
        return names + ["summary.json"]

    if stage is None:
        return replace_dir(out, fill)
    names = fill(stage)
    commit_stage(stage, out)
    return [out / n for n in names]


@contextlib.contextmanager
def results_stage(out: Path | None) -> Iterator[tuple[Path | None, StepTableStream | None]]:
    """(the staging folder of a new ``out``, a stream that writes the per-step table into it while the run
    goes); (None, None) without ``out``. On an error both go: nothing is left half-written."""
    if out is None:
        yield None, None
        return
    stage = new_stage(out)
    stream = StepTableStream(stage / "steps.csv", stage / "steps.parquet")
    try:
        yield stage, stream
    except BaseException:
        stream.discard()
        shutil.rmtree(stage, ignore_errors=True)
        raise


def main(args: argparse.Namespace) -> int:
    slos = [parse_slo(t) for t in args.slo]
    scn = load_scenario(args.scenario, args.overrides)
    out_arg = args.out or (str(scn.resolve_path(scn.output.dir)) if scn.output.dir else None)  # output.dir: default
    out = prepare_results_dir(out_arg) if out_arg else None
    trace = check_trace_args(args)
    show, after_s = progress_mode(args)
    with results_stage(out) as (stage, stream):
        result = run_scenario(scn, check_integrity=True if args.check else None, progress=show,
                              progress_after_s=after_s, step_stream=stream)
        if slos:
            from sim.goodput import slo_report

            result.summary["slo"] = slo_report(result.requests, result.summary, slos)
        notes = sys.stderr if args.json else sys.stdout   # with --json, stdout holds the JSON alone
        if args.json:
            sys.stdout.write(summary_json(result.summary))
        else:
            print_summary(result.summary, title=f"{scn.name}  ({args.scenario})")
        note = rejection_note(result.requests)
        if note:
            print(note, file=notes)
        if out is not None:
            files = write_results(result, out, plots=scn.output.plots and not args.no_plots, stage=stage,
                                  stream=stream)
            print(f"wrote {len(files)} files to {out}/", file=notes)
    if trace is not None:
        from sim.timeline import intervals_from_requests
        from sim.trace_events import write_trace_events

        intervals = result.timeline if result.timeline is not None else intervals_from_requests(result.requests)
        write_trace_events(trace, result.steps, intervals, request_limit=args.trace_events_limit, name=scn.name)
        print(f"wrote {trace} (open it in https://ui.perfetto.dev or chrome://tracing)", file=notes)
    return 0
