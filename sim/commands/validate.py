"""kvsim validate --calibration CALIB.json --measurements FILE... [--json] [--plot PATH]: the model's error.

kvsim validate --loo --hardware NAME [--measurements FILE...] [--points N] [--workers N] [--json]:
leave-one-model-out MAPE of the four projections (opmodel.py), per held-out model, for the plain roofline, the tile/wave
roofline, the learned correction, and the correction plus N of the held-out model's own token counts
per shape.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from sim.errors import KvsimError
from sim.executors.measurements import LINEAR_OPS, read_measurements
from sim.executors.opmodel import LooResult, loo
from sim.executors.validation import check_out_path, hardware_of, parity_plot, shipped_vidur, validate_files


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="MAPE of a calibrated cost model (and the plain roofline) on measurements")
    p.add_argument("--calibration", default=None, help="calibration JSON, or a shipped hardware name")
    p.add_argument("--measurements", nargs="+", default=None,
                   help="profile CSVs (kvsim profile) or Vidur per-operator / all-reduce CSVs")
    p.add_argument("--json", action="store_true", help="print JSON (overall_mape as a fraction)")
    p.add_argument("--plot", default=None, help="write a predicted-vs-measured parity plot here (PNG)")
    p.add_argument("--loo", action="store_true",
                   help="leave-one-model-out: fit on the other models minus the held-out model's GEMM shapes "
                        "(the cross-GPU trees: on the other shipped GPU's tables too, less the same)")
    p.add_argument("--hardware", default=None, help="with --loo: hardware preset (default tables: the shipped ones)")
    p.add_argument("--points", type=int, default=16, help="with --loo: own token counts per shape (default 16)")
    p.add_argument("--workers", type=int, default=1,
                   help="with --loo: fit the held-out models' folds in this many processes (default 1; same "
                        "results for any number)")
    p.set_defaults(func=main)


def loo_table(results: list[LooResult], points: int) -> str:
    """One line per held-out model, then all rows pooled."""
    head = (f"{'held-out model':<28}{'rows':>6}{'plain':>8}{'tile/wave':>11}{'+correction':>13}"
            f"{f'+{points} own pts':>14}")
    lines = [head]
    for r in results:
        lines.append(f"{r.model:<28}{r.rows:>6}{100 * r.plain:>7.2f}%{100 * r.roofline:>10.2f}%"
                     f"{100 * r.corrected:>12.2f}%{100 * r.few:>13.2f}%")
    total = pooled(results)
    lines.append("-" * len(head))
    lines.append(f"{'all held-out rows':<28}{total['rows']:>6}{100 * total['plain']:>7.2f}%"
                 f"{100 * total['roofline']:>10.2f}%{100 * total['corrected']:>12.2f}%{100 * total['few']:>13.2f}%")
    return "\n".join(lines)


def pooled(results: list[LooResult]) -> dict[str, float]:
    """MAPE over every held-out row (each model's MAPE weighted by its rows)."""
    rows = sum(r.rows for r in results)
    few_rows = sum(r.few_rows for r in results)
    out: dict[str, float] = {"rows": rows}
    for key in ("plain", "roofline", "corrected", "unstacked"):
        out[key] = sum(getattr(r, key) * r.rows for r in results) / rows
    out["few"] = sum(r.few * r.few_rows for r in results if r.few_rows) / few_rows if few_rows else float("nan")
    return out


def _loo(args: argparse.Namespace) -> int:
    if not args.hardware:
        raise KvsimError("--hardware", "required with --loo")
    hw = hardware_of(args.hardware)
    if args.points < 2:
        raise KvsimError("--points", f"must be at least 2, got {args.points}")
    if not 1 <= args.workers <= 256:
        raise KvsimError("--workers", f"must be between 1 and 256, got {args.workers}")
    paths = args.measurements or shipped_vidur(hw.name.split("-")[0])
    if not paths:
        raise KvsimError("--measurements", f"no shipped Vidur tables for {hw.name}; give some")
    df = read_measurements(paths)
    models = df[df.operator.isin(LINEAR_OPS)].model.nunique()
    if models < 2:
        raise KvsimError("--measurements", f"leave-one-model-out needs projection rows of at least two models, "
                                           f"found {models}")
    results = loo(df, hw, points=args.points, workers=args.workers)
    if args.json:
        print(json.dumps({"hardware": hw.name, "points": args.points, "models": [asdict(r) for r in results],
                          "all": pooled(results)}, indent=2))
    else:
        print(loo_table(results, args.points))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.loo:
        return _loo(args)
    if not args.calibration or not args.measurements:
        raise KvsimError("--calibration" if not args.calibration else "--measurements",
                         "required (or --loo --hardware NAME for leave-one-model-out scoring)")
    if args.plot:
        check_out_path(args.plot, "--plot")
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
