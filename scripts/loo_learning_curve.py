"""How the learned GEMM correction's error on an unseen model falls as training holds more models.

    PYTHONPATH=. python scripts/loo_learning_curve.py                  # both GPUs (about 5 min each)
    PYTHONPATH=. python scripts/loo_learning_curve.py --hardware h100-80gb

For each held-out model (its GEMM shapes removed from training, as ``kvsim validate --loo`` does), the
correction is fitted on every subset of 1, 2, ... of the other models and scored on the held-out model's
four projections (MAPE). Printed: every fit, then per number of training models the mean over held-out
models and subsets, and a power law a x n^-b through the last two means carried one model further (the
shipped calibrations train on every table: one more model than a leave-one-model-out fold). A fold of
one training model has no stacked trees (they need the others' curves to learn from); the cross-GPU trees
read the other GPU's tables of the same subset of models. The figures in the README were measured before
the cross-GPU trees and the averaged plain trees joined (2026-12-07); each fit now takes about four times
as long.
"""

from __future__ import annotations

import argparse
import itertools
import math

import pandas as pd

from sim.executors import opmodel
from sim.executors.calibrate import mape
from sim.executors.measurements import read_measurements
from sim.executors.validation import hardware_of, shipped_vidur


def curve(hardware: str) -> pd.DataFrame:
    """One row per (held-out model, training subset): its size n and the held-out MAPE (fraction)."""
    hw = hardware_of(hardware)
    df = read_measurements(shipped_vidur(hardware.split("-")[0]))
    models = sorted(opmodel.with_shapes(df).model.unique())
    out = []
    for held in models:
        others = [m for m in models if m != held]
        for n in range(1, len(others) + 1):
            for subset in itertools.combinations(others, n):
                _, test, fits = opmodel.loo_fold(df, hw, held, subset)
                err = mape(opmodel.predict_gemm(test, hw, fits["corrected"]), test.time_s.to_numpy())
                out.append({"held": held, "n": n, "training": ", ".join(subset), "mape": err})
                print(f"{hardware} held out {held}, trained on {', '.join(subset)}: {100 * err:.2f}%", flush=True)
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", nargs="+", default=["h100-80gb", "a100-80gb"])
    for hardware in ap.parse_args().hardware:
        means = curve(hardware).groupby("n").mape.mean()
        line = ", ".join(f"{n} models {100 * v:.2f}%" for n, v in means.items())
        (n1, e1), (n2, e2) = list(means.items())[-2:]
        b = math.log(e1 / e2) / math.log(n2 / n1)
        print(f"{hardware}: mean over held-out models and subsets: {line}; a x n^-{b:.2f} through the last "
              f"two gives {100 * e2 * (n2 / (n2 + 1)) ** b:.2f}% at {n2 + 1}", flush=True)


if __name__ == "__main__":
    main()
