"""kvsim calibrate --hardware NAME --measurements FILE... --out CALIB.json [--tp N]: fit the cost model."""

from __future__ import annotations

import argparse

from sim.executors.validation import calibrate_files, write_calibration


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the cost model's efficiencies for one piece of hardware")
    p.add_argument("--hardware", required=True, help="hardware preset the measurements ran on")
    p.add_argument("--measurements", nargs="+", required=True,
                   help="profile CSVs (kvsim profile) or Vidur per-operator / all-reduce CSVs")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--tp", type=int, default=None, help="fit only rows at this tensor-parallel degree")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    doc = calibrate_files(args.hardware, args.measurements, tp=args.tp)
    write_calibration(doc, args.out)
    train = doc["train_mape"]
    parts = ", ".join(f"{k} {100 * train[k]:.1f}%" for k in ("linear", "layer", "overall") if k in train)
    print(f"calibrated {doc['hardware']} on {doc['rows']} rows ({parts} training MAPE) -> {args.out}")
    return 0
