"""A learned correction on top of the GEMM roofline: log(measured / roofline) as a function of (M, N, K).

The stored form (``CostParams.gemm_correction``, plain JSON) is

    {"grid_m": [M_1 < M_2 < ...],               token counts the curves are sampled at
     "shapes": [[N, K], ...],                   the (N, K) GEMM shapes measured in training
     "curves": [[r(M_1), r(M_2), ...], ...],    log(measured / roofline) of each shape on grid_m
     "width_n": w_n, "width_k": w_k,            kernel widths in ln N and ln K
     "prior_weight": w_0,                       pulls the correction to 0 far from every training shape
     "local": {"N,K": [[M, delta], ...]}}       a new model's own measured points (optional)

For a shape (N, K) the correction curve is a kernel-weighted mean of the training curves (Nadaraya-Watson):

    w_i  = exp(-((ln N - ln N_i) / w_n)^2 / 2 - ((ln K - ln K_i) / w_k)^2 / 2)
    r(M) = sum_i w_i r_i(M) / (sum_i w_i + w_0)          r_i linear in M between grid points, flat beyond

A shape measured in training (N = N_i and K = K_i) takes its own curve r_i instead: the correction
reproduces what was measured and generalises only to shapes it has not seen. Plus, when ``local`` holds the
exact shape, its deltas at M: interpolated linearly in ln M among the local points in the same block of 64
token counts as M (ceil(M / 64) equal), or else of 128, or else of 256 (the tile heights: a GEMM's time
steps where M crosses a tile boundary, so a point across one says little about M), or else among all of
them; flat beyond the points used. The GEMM time is ``roofline x exp(r(M))``.

Invariants: a shape's curve is computed once (numpy, about 50 us) and cached; afterwards one lookup costs
a bisection and a linear interpolation (about 1 us). An empty dict is no correction (factor 1).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from typing import Any

import numpy as np

# id(stored dict) -> (the dict, its evaluator), the most recently used last; holding the dict keeps its id
# unique while cached, and at most _MAX_EVALUATORS are kept (a sweep loads one calibration per run)
_EVALUATORS: OrderedDict[int, tuple[dict[str, Any], ShapeCorrection]] = OrderedDict()
_MAX_EVALUATORS = 32
# block sizes (token counts) the local points are grouped by, smallest first: the GEMM tile heights
LOCAL_BLOCKS = (64, 128, 256)


class ShapeCorrection:
    """Evaluates a stored correction (the module docstring's formulas), caching one curve per (N, K)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.grid = [float(m) for m in data.get("grid_m", [])]
        shapes = np.asarray(data.get("shapes", []), dtype=float).reshape(-1, 2)
        self.ln_n, self.ln_k = np.log(shapes[:, 0]), np.log(shapes[:, 1])
        self.curves = np.asarray(data.get("curves", []), dtype=float).reshape(len(shapes), len(self.grid))
        self.width_n = float(data.get("width_n", 0.2))
        self.width_k = float(data.get("width_k", 0.4))
        self.prior_weight = float(data.get("prior_weight", 0.3))
        self.exact = {(int(n), int(k)): i for i, (n, k) in enumerate(shapes.tolist())}
        self.local = {tuple(int(x) for x in key.split(",")): LocalPoints(pts)
                      for key, pts in data.get("local", {}).items()}
        self._cache: dict[tuple[int, int], list[float]] = {}

    def curve(self, n: int, k: int) -> list[float]:
        """r on ``grid`` for shape (n, k) (without the local points), cached."""
        key = (int(n), int(k))
        hit = self._cache.get(key)
        if hit is None:
            if key in self.exact:
                hit = self.curves[self.exact[key]].tolist()
            elif len(self.curves) and self.grid:
                d2 = ((math.log(n) - self.ln_n) / self.width_n) ** 2 + ((math.log(k) - self.ln_k) / self.width_k) ** 2
                w = np.exp(-d2 / 2)
                hit = (w @ self.curves / (w.sum() + self.prior_weight)).tolist()
            else:
                hit = [0.0] * len(self.grid)
            self._cache[key] = hit
        return hit

    def log_ratio(self, m: float, n: int, k: int) -> float:
        """r(M) for one GEMM: the shape's curve at m, plus the local points of (n, k) if any."""
        r = 0.0
        if self.grid:
            r = _lerp(self.grid, self.curve(n, k), float(m))
        pts = self.local.get((int(n), int(k)))
        if pts is not None:
            r += pts.delta(float(m))
        return r


class LocalPoints:
    """A new model's measured deltas of one shape, grouped by token-count block (the module docstring)."""

    def __init__(self, pts: list[list[float]]) -> None:
        pts = sorted((max(float(m), 1.0), float(d)) for m, d in pts)
        self.all = ([math.log(m) for m, _ in pts], [d for _, d in pts])
        self.blocks: list[dict[int, tuple[list[float], list[float]]]] = []
        for b in LOCAL_BLOCKS:
            groups: dict[int, tuple[list[float], list[float]]] = {}
            for m, d in pts:
                xs, ys = groups.setdefault(math.ceil(m / b), ([], []))
                xs.append(math.log(m))
                ys.append(d)
            self.blocks.append(groups)

    def delta(self, m: float) -> float:
        """The delta at token count ``m``: within the smallest block of ``m`` holding points, else all."""
        m = max(m, 1.0)
        for b, groups in zip(LOCAL_BLOCKS, self.blocks):
            hit = groups.get(math.ceil(m / b))
            if hit is not None:
                return _lerp(hit[0], hit[1], math.log(m))
        return _lerp(self.all[0], self.all[1], math.log(m)) if self.all[0] else 0.0


def _lerp(xs: list[float], ys: list[float], x: float) -> float:
    """Linear interpolation on ascending ``xs``, flat beyond both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x) - 1
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + f * (ys[i + 1] - ys[i])


def evaluator(data: dict[str, Any]) -> ShapeCorrection:
    """The cached evaluator of a stored correction dict (built on first use)."""
    hit = _EVALUATORS.get(id(data))
    if hit is None or hit[0] is not data:
        hit = _EVALUATORS[id(data)] = (data, ShapeCorrection(data))
        while len(_EVALUATORS) > _MAX_EVALUATORS:
            _EVALUATORS.popitem(last=False)
    else:
        _EVALUATORS.move_to_end(id(data))
    return hit[1]


def factor_scalar(data: dict[str, Any], m: float, n: int, k: int) -> float:
    """exp(r(M)) for one GEMM; 1 when ``data`` is empty."""
    return math.exp(evaluator(data).log_ratio(m, n, k)) if data else 1.0


def factor(data: dict[str, Any], m: Any, n: Any, k: Any) -> Any:
    """exp(r(M)) elementwise over broadcast arrays m, n, k (one curve per distinct (n, k))."""
    if not data:
        return 1.0
    ev = evaluator(data)
    m_b, n_b, k_b = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(n), np.asarray(k))
    out = np.zeros(m_b.shape)
    pairs = np.stack([n_b.ravel(), k_b.ravel()], 1).astype(np.int64)
    flat = out.reshape(-1)
    mf = m_b.ravel()
    uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for j, (n_j, k_j) in enumerate(uniq.tolist()):
        sel = inv == j
        r = np.interp(mf[sel], ev.grid, ev.curve(n_j, k_j)) if ev.grid else np.zeros(int(sel.sum()))
        pts = ev.local.get((n_j, k_j))
        if pts is not None:
            ms, back = np.unique(mf[sel], return_inverse=True)
            r = r + np.array([pts.delta(x) for x in ms.tolist()])[back.reshape(-1)]
        flat[sel] = r
    return np.exp(out) if out.ndim else float(np.exp(out))
