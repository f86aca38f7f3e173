"""Scale-free features of a GEMM ``[M, K] x [K, N]`` for the learned correction's trees (tree_ensemble.py).

Every feature is a function of (M, N, K) and the GPU's SM count only, so a shape's correction curve can be
computed when a scenario loads, without the roofline's fitted parameters:

- ln M, ln N, ln K, ln(M N K) and the arithmetic intensity ln(M N K / (M K + N K + M N));
- per candidate output tile (tm x tn), the waves ceil(tiles / SMs), how full they are (tiles / (waves x
  SMs)) and the tile's padded work relative to the best tile's (cuBLAS picks among such tiles; where they
  tie or one wave spills, the measured time jumps);
- M's filling of a 64-, 128- and 256-row tile, M modulo 16, 32 and 64 (alignment of the token count), and
  N and K modulo 128;
- which of the four projections the GEMM computes (one column each, 1 for its operator): in Vidur's tables
  one (N, K) timed as a QKV projection and as an MLP up projection differs by 6-9%, and the trees learn
  that offset across models (leave one model out: A100 5.57% -> 5.29% on its three earlier tables, H100
  5.78% -> 5.44%, README). A GEMM of no projection (the LM head) has zeros there; shape_correction.py
  averages the trees over the four operators for it instead.

Invariant: the columns are in ``FEATURE_NAMES`` order; a stored tree ensemble indexes them by position, so
the order and formulas may only change together with a refit of the shipped calibrations. Columns are only
ever appended: an ensemble over the first ``n`` of them (a calibration fitted before the operator columns)
is evaluated on those ``n``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.executors.measurements import LINEAR_OPS

# candidate output tiles (rows x columns): the tile/wave roofline's four (calibrate.TILES) and three narrower ones
TILES = ((64, 64), (128, 64), (64, 128), (128, 128), (128, 256), (256, 128), (64, 256))
ROW_BLOCKS = (64, 128, 256)
M_MODULI = (16, 32, 64)

FEATURE_NAMES = (["ln_m", "ln_n", "ln_k", "ln_mnk", "ln_intensity"]
                 + [f"{kind}_{tm}x{tn}" for tm, tn in TILES for kind in ("waves", "fill", "rel_work")]
                 + [f"m_fill_{b}" for b in ROW_BLOCKS] + [f"m_mod_{d}" for d in M_MODULI]
                 + ["n_mod_128", "k_mod_128"]
                 + [f"op_{o}" for o in LINEAR_OPS])


def gemm_features(m: np.ndarray, n: np.ndarray, k: np.ndarray, num_sms: int, op: Any = None) -> np.ndarray:
    """Rows x ``len(FEATURE_NAMES)`` float64 features of the broadcast arrays m, n, k (positive) and operator
    names ``op`` (a name, an array of them, or None: no projection)."""
    ops = np.asarray("" if op is None else op, dtype=object)
    m, n, k, ops = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(n, dtype=float),
                                       np.asarray(k, dtype=float), ops)
    cols = [np.log(m), np.log(n), np.log(k), np.log(m * n * k), np.log(m * n * k / (m * k + n * k + m * n))]
    tiles = [np.ceil(m / tm) * np.ceil(n / tn) for tm, tn in TILES]
    waves = [np.ceil(t / num_sms) for t in tiles]
    work = [w * tm * tn for w, (tm, tn) in zip(waves, TILES)]
    best = np.min(work, axis=0)
    for t, w, wk in zip(tiles, waves, work):
        cols += [w, t / (w * num_sms), wk / best]
    cols += [m / (np.ceil(m / b) * b) for b in ROW_BLOCKS]
    cols += [m % d for d in M_MODULI]
    cols += [n % 128, k % 128]
    cols += [(ops == o).astype(float) for o in LINEAR_OPS]
    return np.stack([np.ravel(c) for c in cols], axis=1)


# the cross-GPU trees' columns (cross_gpu.py): the features above, then the GPU's SM count
CROSS_FEATURE_NAMES = [*FEATURE_NAMES, "num_sms"]


def with_sms(features: np.ndarray, num_sms: int) -> np.ndarray:
    """``features`` (rows x FEATURE_NAMES) with the SM count appended as a last column (CROSS_FEATURE_NAMES)."""
    return np.hstack([features, np.full((len(features), 1), float(num_sms))])
