"""Thinned curves (sim/plot_points.py) keep what a figure shows: per slice of x the first, lowest,
highest and last value of a step curve; a CDF's points lie on the full CDF, first and last kept."""

from __future__ import annotations

import numpy as np

from sim.plot_points import cdf_points, step_envelope


def test_step_envelope_keeps_each_slices_extremes_and_ends():
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.exponential(1.0, 50_000))
    y = rng.integers(0, 300, x.size).astype(float)
    bins = 500
    xs, ys = step_envelope(x, y, bins)
    assert len(xs) == 4 * bins   # every slice holds points here
    assert (xs[0], ys[0], xs[-1], ys[-1]) == (x[0], y[0], x[-1], y[-1])
    assert (np.diff(xs) >= 0).all()
    width = (x[-1] - x[0]) / bins
    for k in (0, 1, 137, bins - 1):   # brute force, slice by slice
        inside = (x >= x[0] + k * width) & ((x < x[0] + (k + 1) * width) | (k == bins - 1))
        got = ys[4 * k: 4 * k + 4]
        assert got[1] == y[inside].min() and got[2] == y[inside].max()
        assert got[0] == y[inside][0] and got[3] == y[inside][-1]
        assert xs[4 * k] == x[inside][0] and xs[4 * k + 3] == x[inside][-1]


def test_small_curves_are_left_alone():
    x, y = np.arange(10.0), np.arange(10.0) ** 2
    xs, ys = step_envelope(x, y, 2000)
    assert xs.tolist() == x.tolist() and ys.tolist() == y.tolist()


def test_cdf_points_lie_on_the_full_cdf():
    rng = np.random.default_rng(4)
    v = rng.lognormal(0, 1, 30_000)
    v[::97] = np.nan
    xs, fs = cdf_points(v, 1000)
    full = np.sort(v[~np.isnan(v)])
    assert len(xs) <= 1000 and xs[0] == full[0] and xs[-1] == full[-1] and fs[-1] == 1.0
    ranks = np.searchsorted(full, xs, side="right")   # values are distinct: rank = position + 1
    assert np.array_equal(fs, ranks / full.size)
    small_x, small_f = cdf_points(np.array([3.0, 1.0, np.nan, 2.0]))
    assert small_x.tolist() == [1.0, 2.0, 3.0] and small_f.tolist() == [1 / 3, 2 / 3, 1.0]
