"""kvsim validate --calibration CALIB.json --measurements FILE... [--json] [--plot PATH]: the model's error."""

from __future__ import annotations

import argparse
import json

from sim.executors.validation import parity_plot, validate_files


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="MAPE of a calibrated cost model (and the plain roofline) on measurements")
    p.add_argument("--calibration", required=True, help="calibration JSON, or a shipped hardware name")
    p.add_argument("--measurements", nargs="+", required=True,
                   help="profile CSVs (kvsim profile) or Vidur per-operator / all-reduce CSVs")
    p.add_argument("--json", action="store_true", help="print JSON (overall_mape as a fraction)")
    p.add_argument("--plot", default=None, help="write a predicted-vs-measured parity plot here (PNG)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    v = validate_files(args.calibration, args.measurements)
    if args.plot:
        parity_plot(v, args.plot, title=str(args.calibration))
    if args.json:
        print(json.dumps(v.to_json(), indent=2))
    else:
        print(v.table())
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
