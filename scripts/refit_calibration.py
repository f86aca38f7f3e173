"""Refit a shipped calibration on every shipped Vidur table of its GPU, keeping the file's other keys.

    PYTHONPATH=. python scripts/refit_calibration.py a100-80gb h100-80gb

Replaces only what the fit produces (params, baseline, fitted_on, rows, train_mape) in
sim/data/calibration/NAME.json; every other top-level key is kept as it is.
"""

from __future__ import annotations

import json
import sys

from sim.executors.cost_model import DATA_DIR
from sim.executors.validation import calibrate_files, shipped_vidur, write_calibration

FITTED_KEYS = ("format", "hardware", "params", "baseline", "fitted_on", "rows", "train_mape")


def refit(name: str) -> None:
    gpu = name.split("-")[0]
    paths = shipped_vidur(gpu, "mlp") + shipped_vidur(gpu, "all_reduce")
    fresh = calibrate_files(name, paths)
    path = DATA_DIR / "calibration" / f"{name}.json"
    doc = json.loads(path.read_text())
    doc.update({k: fresh[k] for k in FITTED_KEYS})
    write_calibration(doc, path)
    print(f"{path}: linear {100 * fresh['train_mape']['linear']:.2f}% training MAPE on {fresh['rows']} rows")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        refit(arg)
