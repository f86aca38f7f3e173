"""Fewer points, the same picture: curves of a whole run thinned to what a figure can show.

An hour of steps is ~450,000 points; a figure is ~900 pixels wide. Drawing every point costs seconds
and shows nothing more than drawing, per sliver of the x axis, the values a pixel column can show:

    step_envelope:  for each of ``bins`` equal slices of x (a slice narrower than a pixel), the first,
                    lowest, highest and last value, in that order: every vertical extent of the step
                    curve is kept, and every point moves by less than a slice
    cdf_points:     an empirical CDF (sorted values, rank / n) sampled at ``max_points`` ranks,
                    first and last kept: the curve moves by less than 1 / max_points in y

Both return their input unchanged when it is already small.
"""

from __future__ import annotations

import numpy as np


def step_envelope(x: np.ndarray, y: np.ndarray, bins: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Points of the step curve (``x`` ascending) that draw it the same at ``bins`` slices of width."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = len(x)
    if n <= 4 * bins or not x[-1] > x[0]:
        return x, y
    slot = np.minimum(((x - x[0]) / (x[-1] - x[0]) * bins).astype(np.int64), bins - 1)
    starts = np.flatnonzero(np.diff(slot, prepend=-1))   # first point of each occupied slice
    ends = np.append(starts[1:], n) - 1                   # its last point
    lo = np.minimum.reduceat(y, starts)
    hi = np.maximum.reduceat(y, starts)
    xs = np.column_stack((x[starts], x[starts], x[starts], x[ends])).ravel()
    ys = np.column_stack((y[starts], lo, hi, y[ends])).ravel()
    return xs, ys


def cdf_points(values: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(sorted values, cumulative fraction) of ``values`` without NaNs, at most ``max_points`` of them."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[~np.isnan(x)]
    n = x.size
    frac = np.arange(1, n + 1) / n if n else np.zeros(0)
    if n <= max_points:
        return x, frac
    idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return x[idx], frac[idx]
