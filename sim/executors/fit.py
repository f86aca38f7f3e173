"""A small derivative-free minimiser (Nelder-Mead), so calibration needs nothing beyond numpy.

Invariant: ``nelder_mead`` only ever returns a point it evaluated, and its value is the lowest seen.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.3, iters: int = 400,
                tol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (standard reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    pts = [np.asarray(x0, dtype=float)]
    for i in range(n):
        p = pts[0].copy()
        p[i] += step
        pts.append(p)
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * max(abs(vals[0]), 1e-12):
            break
        centroid = np.mean(pts[:-1], axis=0)
        refl = centroid + (centroid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centroid + 2.0 * (centroid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
                    vals[i] = f(pts[i])
    best = int(np.argmin(vals))
    return pts[best], float(vals[best])
