"""Measured correction curves and their kernel-weighted mean for a shape that was not measured.

A bank holds curves r_i on one token grid, each labelled with a GEMM shape (N_i, K_i) and the operator o_i
it was measured as ("" when unknown or pooled over several). For operator o and shape (N, K):

    own  = the curves with N_i = N, K_i = K and (o_i = o, or o or o_i unknown)
    r    = the mean of ``own`` when there is one, else the Nadaraya-Watson mean
    w_i  = exp(-((ln N - ln N_i) / w_n)^2 / 2 - ((ln K - ln K_i) / w_k)^2 / 2) x (w_op if o, o_i known and o != o_i)
    r    = sum_i w_i r_i / (sum_i w_i + w_0)            (w_0, the prior weight, pulls r to 0 far from every curve)

Invariants: one (operator, N, K) is computed once (numpy, about 50 us) and cached; an empty bank gives 0.
"""

from __future__ import annotations

import math

import numpy as np


class CurveBank:
    """Labelled curves on a common grid and the kernel that generalises them (the module docstring)."""

    def __init__(self, grid_len: int, labels: list[tuple[str, int, int]], curves: list[list[float]],
                 width_n: float, width_k: float, prior_weight: float, op_weight: float = 1.0) -> None:
        self.grid_len = grid_len
        self.ops = [op for op, _, _ in labels]
        shapes = np.asarray([[n, k] for _, n, k in labels], dtype=float).reshape(-1, 2)
        self.ln_n, self.ln_k = np.log(shapes[:, 0]), np.log(shapes[:, 1])
        self.curves = np.asarray(curves, dtype=float).reshape(len(labels), grid_len)
        self.width_n, self.width_k = width_n, width_k
        self.prior_weight, self.op_weight = prior_weight, op_weight
        self.exact: dict[tuple[int, int], list[int]] = {}
        for i, (_, n, k) in enumerate(labels):
            self.exact.setdefault((int(n), int(k)), []).append(i)
        self._cache: dict[tuple[str, int, int], list[float]] = {}

    def _own(self, n: int, k: int, op: str) -> list[int]:
        return [i for i in self.exact.get((int(n), int(k)), []) if not op or not self.ops[i] or self.ops[i] == op]

    def owns(self, n: int, k: int, op: str = "") -> bool:
        """Whether (op, n, k) was measured: its curve is its own, not a mean of other shapes'."""
        return bool(self._own(n, k, op))

    def curve(self, n: int, k: int, op: str = "") -> list[float]:
        """r on the grid for operator ``op`` ("" unknown) and shape (n, k); cached."""
        key = (op, int(n), int(k))
        hit = self._cache.get(key)
        if hit is None:
            own = self._own(n, k, op)
            if own:
                hit = self.curves[own].mean(axis=0).tolist()
            elif len(self.curves):
                d2 = ((math.log(n) - self.ln_n) / self.width_n) ** 2 + ((math.log(k) - self.ln_k) / self.width_k) ** 2
                w = np.exp(-d2 / 2)
                if op and self.op_weight != 1.0:
                    w = w * np.array([self.op_weight if o and o != op else 1.0 for o in self.ops])
                hit = (w @ self.curves / (w.sum() + self.prior_weight)).tolist()
            else:
                hit = [0.0] * self.grid_len
            self._cache[key] = hit
        return hit
