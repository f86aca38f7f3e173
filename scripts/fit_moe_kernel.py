"""Fit the fused mixture-of-experts kernel's tile efficiency (``engine.moe_tile_eff``) to its measured timings.

    python scripts/fit_moe_kernel.py [--table sim/data/kernels/h100_fused_moe_mixtral_tp2.csv] [--write]

Prices every row of the table (vLLM's fused MoE kernel on H100, Mixtral-8x7B at TP 2, 1 to 1,536 tokens)
with the shipped h100-80gb calibration, before and after the fit, and prints the errors. ``--write`` stores
the fitted value in sim/data/calibration/h100-80gb.json (its ``engine`` section); then
``python scripts/carry_engine_terms.py a100-80gb`` carries it with the other engine terms.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sim.executors.cost_model import engine_params_of, load_calibration, shipped_calibration
from sim.executors.moe_kernel import KERNEL_TABLE, TABLE_HARDWARE, fit_tile_eff, load_table, log_errors
from sim.executors.validation import write_calibration


def report(label: str, errors: np.ndarray, tokens: np.ndarray) -> None:
    ratio = np.exp(errors) - 1
    print(f"{label}: MAPE {100 * np.mean(np.abs(ratio)):.2f}%  ("
          + " ".join(f"{t}:{100 * r:+.0f}%" for t, r in zip(tokens, ratio)) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(KERNEL_TABLE))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    params, doc = load_calibration(TABLE_HARDWARE)
    engine = engine_params_of(doc)
    tokens, seconds = load_table(args.table)
    report(f"shipped (moe_tile_eff {engine.moe_tile_eff:.3f})",
           log_errors(params, engine, engine.moe_tile_eff, tokens, seconds), tokens)
    report("as dense GEMM tiles (1.000)", log_errors(params, engine, 1.0, tokens, seconds), tokens)
    eff = fit_tile_eff(params, engine, tokens, seconds)
    report(f"fitted (moe_tile_eff {eff:.3f})", log_errors(params, engine, eff, tokens, seconds), tokens)
    if args.write:
        path = shipped_calibration(TABLE_HARDWARE)
        out = json.loads(path.read_text())
        out["engine"]["moe_tile_eff"] = round(eff, 4)
        out["moe_tile_eff_source"] = (f"fitted by scripts/fit_moe_kernel.py to {Path(args.table).name} "
                                      "(vLLM's fused MoE kernel benchmark on H100, vLLM PR 24700)")
        write_calibration(out, path)
        print(f"wrote {path} (engine.moe_tile_eff)")


if __name__ == "__main__":
    main()
