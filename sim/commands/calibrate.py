"""kvsim calibrate --hardware NAME --measurements FILE... --out CALIB.json [--tp N]: fit the cost model.

kvsim calibrate --base CALIB --measurements NEW.csv --out NEW.json: adapt a calibration to a new model
from its own measured projection shapes (``kvsim profile`` on a GPU, or a Vidur table).
"""

from __future__ import annotations

import argparse

from sim.errors import KvsimError
from sim.executors.validation import calibrate_files, calibrate_from_base, check_out_path, write_calibration


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the cost model's efficiencies for one piece of hardware")
    p.add_argument("--hardware", default=None, help="hardware preset the measurements ran on (not with --base)")
    p.add_argument("--measurements", nargs="+", required=True,
                   help="profile CSVs (kvsim profile) or Vidur per-operator / all-reduce CSVs")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--tp", type=int, default=None, help="fit only rows at this tensor-parallel degree")
    p.add_argument("--base", default=None,
                   help="calibration (JSON or shipped name) to adapt: keep it and add a per-shape correction "
                        "interpolated from the measured projection points")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    check_out_path(args.out)
    if args.base:
        if args.hardware or args.tp is not None:
            raise KvsimError("--base", "takes the hardware from the base calibration; drop --hardware and --tp")
        doc = calibrate_from_base(args.base, args.measurements)
    else:
        if not args.hardware:
            raise KvsimError("--hardware", "required (or --base CALIB to adapt an existing calibration)")
        doc = calibrate_files(args.hardware, args.measurements, tp=args.tp)
    write_calibration(doc, args.out)
    train = doc["train_mape"]
    parts = ", ".join(f"{k} {100 * train[k]:.1f}%" for k in ("linear", "layer", "overall") if k in train)
    print(f"calibrated {doc['hardware']} on {doc['rows']} rows ({parts} training MAPE) -> {args.out}")
    return 0
