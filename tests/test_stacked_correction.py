"""The stacked trees' training column: each training row's kernel mean as a model that was not measured gets
it, from the other models' curves without any of its own model's shapes (opmodel.out_of_fold_kernel_mean)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.executors.opmodel import (
    OP_PRIOR_WEIGHT,
    OP_WEIGHT,
    OP_WIDTH_N,
    PRIOR_WEIGHT,
    WIDTH_N,
    out_of_fold_kernel_mean,
)


def rows(model: str, op: str, n: int, k: int, r: tuple[float, float]) -> pd.DataFrame:
    return pd.DataFrame({"model": model, "operator": op, "N": n, "K": k, "M": [1, 101], "r": list(r)})


def test_out_of_fold_kernel_mean_by_hand():
    a = rows("a", "mlp_up_proj", 1000, 1000, (0.2, 0.4))
    b = rows("b", "mlp_up_proj", 2000, 1000, (-0.1, 0.1))
    c = rows("c", "mlp_down_proj", 1000, 1000, (0.6, 0.6))   # a's shape, timed as another operator
    got = out_of_fold_kernel_mean(pd.concat([a, b, c]))
    # a's rows: c shares its shape and leaves with it; b's curve, N twice as large, same operator:
    # weight exp(-(ln 2 / w_n)^2 / 2), pulled to 0 by the prior weight
    w = math.exp(-(math.log(2) / OP_WIDTH_N) ** 2 / 2)
    assert got[:2] == pytest.approx([w * -0.1 / (w + OP_PRIOR_WEIGHT), w * 0.1 / (w + OP_PRIOR_WEIGHT)])
    # b's rows: a's curve (same operator) and c's (another operator, weight OP_WEIGHT), both at N / 2
    wa, wc = w, w * OP_WEIGHT
    expect = [(wa * 0.2 + wc * 0.6) / (wa + wc + OP_PRIOR_WEIGHT), (wa * 0.4 + wc * 0.6) / (wa + wc + OP_PRIOR_WEIGHT)]
    assert got[2:4] == pytest.approx(expect)
    # c's rows: a shares its shape and leaves; what is left (b) measured no down projection, so c gets the
    # operator-blind kernel over b's curve
    wb = math.exp(-(math.log(2) / WIDTH_N) ** 2 / 2)
    assert got[4:] == pytest.approx([wb * -0.1 / (wb + PRIOR_WEIGHT), wb * 0.1 / (wb + PRIOR_WEIGHT)])


def test_one_model_has_no_out_of_fold_mean():
    assert out_of_fold_kernel_mean(rows("a", "mlp_up_proj", 1000, 1000, (0.2, 0.4))) is None
    assert np.all(out_of_fold_kernel_mean(pd.concat([rows("a", "mlp_up_proj", 1000, 1000, (0.2, 0.4)),
                                                     rows("b", "mlp_up_proj", 1000, 1000, (0.1, 0.1))])) == 0)
