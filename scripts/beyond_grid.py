"""How the GEMM correction prices token counts beyond the last one measured in training: held flat at its last
value, or carried on by the boosted trees (shape_correction.py, "Beyond the grid's last token count").

    PYTHONPATH=. python scripts/beyond_grid.py                                  # cut 2,048, both GPUs
    PYTHONPATH=. python scripts/beyond_grid.py --hardware a100-80gb --cut 4096 --max-tokens 32768

Per GPU, from the shipped Vidur tables' projection rows up to ``--max-tokens``: fitted on the token counts up
to ``--cut`` and scored (MAPE) on those above it, both for shapes measured below the cut (every model in
training) and for unseen ones (each model held out in turn, its shapes removed from training, as
``kvsim validate --loo``). With ``--cut 4096 --max-tokens 32768`` on A100 only Llama-3-8B has rows above
the cut. Takes 5-15 s per GPU.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

from sim.executors import opmodel, shape_correction
from sim.executors.calibrate import fit_gemm
from sim.executors.measurements import read_measurements
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams
from sim.executors.validation import hardware_of, shipped_vidur
from sim.specs import HardwareSpec


def errors_above(train: pd.DataFrame, test: pd.DataFrame, hw: HardwareSpec) -> dict[str, np.ndarray]:
    """Absolute relative errors on ``test`` of the model fitted on ``train``: {"flat": .., "trees": ..}."""
    roof = fit_gemm(train, hw, CostParams(num_sms=DEFAULT_NUM_SMS.get(hw.name, 108)))
    params = replace(roof, gemm_correction=opmodel.fit_correction(train, hw, roof))
    out = {}
    carried_to = shape_correction.EXTEND_TO
    for name, extend_to in (("flat", 1), ("trees", carried_to)):
        shape_correction.EXTEND_TO = extend_to   # 1: no token counts beyond the grid, so the curve stays flat
        shape_correction._EVALUATORS.clear()
        try:
            pred = opmodel.predict_gemm(test, hw, params)
        finally:
            shape_correction.EXTEND_TO = carried_to
            shape_correction._EVALUATORS.clear()
        out[name] = np.abs(pred / test.time_s.to_numpy() - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", nargs="+", default=["h100-80gb", "a100-80gb"])
    ap.add_argument("--cut", type=int, default=2048, help="fit on token counts up to this, score above it")
    ap.add_argument("--max-tokens", type=int, default=4096, help="rows beyond this are left out")
    args = ap.parse_args()
    for name in args.hardware:
        hw = hardware_of(name)
        df = read_measurements(shipped_vidur(name.split("-")[0]))
        df = df[df.num_tokens <= args.max_tokens]
        rows = opmodel.with_shapes(df)
        seen = errors_above(df[df.num_tokens <= args.cut], rows[rows.M > args.cut], hw)
        unseen: dict[str, list[np.ndarray]] = {"flat": [], "trees": []}
        for held in sorted(rows.model.unique()):
            train, test = opmodel.loo_split(df, held)
            if (test.M > args.cut).any():
                for key, e in errors_above(train[train.M <= args.cut], test[test.M > args.cut], hw).items():
                    unseen[key].append(e)
        n_unseen = sum(len(e) for e in unseen["flat"])
        print(f"{name}: fitted on token counts up to {args.cut}, scored above ({len(rows[rows.M > args.cut])} rows)")
        print(f"  shapes measured below the cut: flat {100 * seen['flat'].mean():.2f}%, "
              f"carried on by the trees {100 * seen['trees'].mean():.2f}%")
        print(f"  unseen models ({n_unseen} rows): flat {100 * np.concatenate(unseen['flat']).mean():.2f}%, "
              f"carried on by the trees {100 * np.concatenate(unseen['trees']).mean():.2f}%")


if __name__ == "__main__":
    main()
