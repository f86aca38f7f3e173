"""Fit the fused mixture-of-experts kernel's tile efficiency (``engine.moe_tile_eff``) to its measured timings.

    python scripts/fit_moe_kernel.py [--write]                     # the shipped table: Mixtral-8x7B, H100, TP 2
    python scripts/fit_moe_kernel.py --table moe.txt --model qwen3-30b-a3b --hardware h100-80gb --tp 1 \\
        --calibration my-h100.json --write                         # your own kernel timings, your calibration

A table is a CSV with columns ``tokens,time_us``, or what vLLM's ``benchmarks/kernels/benchmark_moe.py``
prints on a GPU ("Batch size: B, Kernel time: T us"; run it with the model, ``--tp-size`` and dtype of the
scenario). Prices every row with the calibration (by default the hardware's shipped one), before and after
the fit, and prints the errors. ``--write`` stores the fitted value in the calibration's ``engine`` section
(for the shipped H100 one, ``python scripts/carry_engine_terms.py a100-80gb`` then carries it on).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sim.errors import KvsimError
from sim.executors.cost_model import engine_params_of, load_calibration, shipped_calibration
from sim.executors.moe_kernel import (
    KERNEL_TABLE,
    TABLE_HARDWARE,
    TABLE_MODEL,
    TABLE_TP,
    fit_tile_eff,
    load_table,
    log_errors,
)
from sim.executors.validation import write_calibration


def report(label: str, errors: np.ndarray, tokens: np.ndarray) -> None:
    ratio = np.exp(errors) - 1
    print(f"{label}: MAPE {100 * np.mean(np.abs(ratio)):.2f}%  ("
          + " ".join(f"{t}:{100 * r:+.0f}%" for t, r in zip(tokens, ratio)) + ")")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(KERNEL_TABLE))
    ap.add_argument("--model", default=TABLE_MODEL, help="a mixture-of-experts preset (default mixtral-8x7b)")
    ap.add_argument("--hardware", default=TABLE_HARDWARE)
    ap.add_argument("--tp", type=int, default=TABLE_TP, help="tensor-parallel degree the table was measured at")
    ap.add_argument("--calibration", help="a calibration JSON or shipped name (default: the hardware's shipped one)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    try:
        ref = args.calibration or args.hardware
        params, doc = load_calibration(ref)
        engine = engine_params_of(doc, ref)
        if engine is None:
            raise KvsimError(ref, "no engine section: moe_tile_eff is an engine term")
        setting = {"model": args.model, "hardware": args.hardware, "tensor_parallel": args.tp}
        tokens, seconds = load_table(args.table)
        report(f"calibration (moe_tile_eff {engine.moe_tile_eff:.3f})",
               log_errors(params, engine, engine.moe_tile_eff, tokens, seconds, **setting), tokens)
        eff = fit_tile_eff(params, engine, tokens, seconds, **setting)
        report(f"fitted (moe_tile_eff {eff:.3f})", log_errors(params, engine, eff, tokens, seconds, **setting), tokens)
        if args.write:
            path = Path(args.calibration) if args.calibration and Path(args.calibration).is_file() \
                else shipped_calibration(ref)
            out = json.loads(path.read_text())
            out.setdefault("engine", {})["moe_tile_eff"] = round(eff, 4)
            out["moe_tile_eff_source"] = (f"fitted by scripts/fit_moe_kernel.py to {Path(args.table).name} "
                                          f"({args.model} at TP {args.tp} on {args.hardware})")
            write_calibration(out, path)
            print(f"wrote {path} (engine.moe_tile_eff)")
    except (KvsimError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
