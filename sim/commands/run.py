"""kvsim run SCENARIO.yaml [--out DIR] [--set key.path=value ...]: run one scenario, print its summary."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from sim.cluster.output import write_cluster_files
from sim.commands.summary_table import print_summary
from sim.output import prepare_out_dir, summary_json
from sim.runner import Result, run_scenario
from sim.scenario import load_scenario


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a scenario file and print its summary")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", help="folder for summary.json, requests.csv, steps.csv and plots")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    p.add_argument("--check", action="store_true", help="check every KV invariant after every step (slow)")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.set_defaults(func=main)


def write_results(result: Result, out: Path, plots: bool = True) -> list[Path]:
    """summary.json, requests.csv, steps.csv and the figures.

    Every file is made in a staging folder inside ``out`` first, then renamed into place (summary.json
    last), so an error or Ctrl-C while writing leaves the previous results as they were, never a mix of
    old and new files."""
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".kvsim-staging-", dir=out))
    written: list[Path] = []
    try:
        result.requests.to_csv(stage / "requests.csv", index=False)
        result.steps.to_csv(stage / "steps.csv", index=False)
        names = ["requests.csv", "steps.csv"]
        if plots:
            from sim import plots as figs

            names += [f.name for f in figs.write_run_plots(result.requests, result.steps, result.summary, stage,
                                                        timeline=result.timeline)]
        (stage / "summary.json").write_text(summary_json(result.summary))
        names.append("summary.json")
        for name in names:
            os.replace(stage / name, out / name)
            written.append(out / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not written and not any(out.iterdir()):
            out.rmdir()
    return written


def main(args: argparse.Namespace) -> int:
    scn = load_scenario(args.scenario, args.overrides)
    out = prepare_out_dir(args.out) if args.out else None
    result = run_scenario(scn, check_integrity=True if args.check else None, progress=args.progress)
    print_summary(result.summary, title=f"{scn.name}  ({args.scenario})")
    if out is not None:
        files = write_results(result, out, plots=scn.output.plots and not args.no_plots)
        files += write_cluster_files(result, out, plots=scn.output.plots and not args.no_plots)  # clusters
        print(f"wrote {len(files)} files to {out}/")
    return 0
