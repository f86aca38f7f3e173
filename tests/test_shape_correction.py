"""The learned GEMM correction (shape_correction.py) by hand, its use through gemm_time, and its speed."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest

from sim.executors.cost_model import load_calibration
from sim.executors.roofline import CostParams, gemm_time, gemm_time_scalar
from sim.executors.shape_correction import factor, factor_scalar

# two training shapes, curves on token counts 1 and 101
CORR = {"grid_m": [1, 101], "shapes": [[1000, 1000], [4000, 1000]], "curves": [[0.0, 0.2], [0.1, 0.3]],
        "width_n": 1.0, "width_k": 1.0, "prior_weight": 0.0}


def test_kernel_weighted_mean_by_hand():
    # N = 2000 is ln 2 from both shapes: equal weights, the mean curve is [0.05, 0.25]; M = 51 is halfway
    assert factor_scalar(CORR, 51, 2000, 1000) == pytest.approx(math.exp(0.15))
    # a prior weight of 1 pulls toward 0: w = exp(-(ln 2)^2 / 2) each; at M = 51 the curves are 0.1 and 0.2,
    # so r = w (0.1 + 0.2) / (2 w + 1)
    w = math.exp(-math.log(2) ** 2 / 2)
    c = {**CORR, "prior_weight": 1.0}
    assert factor_scalar(c, 51, 2000, 1000) == pytest.approx(math.exp(w * 0.3 / (2 * w + 1)))
    # flat beyond the grid
    assert factor_scalar(CORR, 5000, 2000, 1000) == pytest.approx(math.exp(0.25))


def test_a_measured_shape_keeps_its_own_curve():
    assert factor_scalar(CORR, 101, 1000, 1000) == pytest.approx(math.exp(0.2))
    assert factor_scalar(CORR, 1, 4000, 1000) == pytest.approx(math.exp(0.1))


def test_local_points_interpolate_in_log_tokens():
    c = {**CORR, "local": {"1000,1000": [[10, 0.1], [1000, 0.3]]}}
    # no block of 64, 128 or 256 around M = 500 holds a point: all of them, and 500 is ln 50 / ln 100 of the
    # way from 10 to 1000 in ln M; the shape's own curve is flat at 0.2 beyond its grid
    assert factor_scalar(c, 500, 1000, 1000) == pytest.approx(math.exp(0.1 + 0.2 * math.log(50) / math.log(100) + 0.2))
    assert factor_scalar(c, 1, 1000, 1000) == pytest.approx(math.exp(0.0 + 0.1))   # flat below
    assert factor_scalar(c, 101, 2000, 1000) == pytest.approx(math.exp(0.25))      # other shapes unchanged
    assert factor_scalar({}, 7, 1, 1) == 1.0


def test_local_points_stay_within_their_token_block():
    c = {**CORR, "local": {"1000,1000": [[10, 0.1], [40, 0.2], [100, 0.4], [1000, 0.3]]}}

    def local(m: int) -> float:  # the local delta alone: minus the shape's own curve (0.2 (M - 1) / 100, flat)
        return math.log(factor_scalar(c, m, 1000, 1000)) - 0.2 * (min(m, 101) - 1) / 100
    # M = 20 shares the block 1..64 with 10 and 40: halfway between them in ln M
    assert local(20) == pytest.approx(0.15)
    # M = 120 shares 65..128 with 100 alone: flat at its delta, not pulled towards 1000
    assert local(120) == pytest.approx(0.4)
    # M = 200: nothing in 193..256 or 129..256; 1..256 holds 10, 40, 100: flat beyond 100
    assert local(200) == pytest.approx(0.4)
    # M = 600: no block holds a point (1000 is in 961..1024, 897..1024, 769..1024): all points, ln M
    assert local(600) == pytest.approx(0.4 - 0.1 * math.log(6) / math.log(10))


def test_vectorised_matches_scalar_and_gemm_time_multiplies():
    c = {**CORR, "local": {"1000,1000": [[10, 0.1], [1000, 0.3]]}}
    m = np.array([1, 7, 51, 100, 3000])
    n = np.array([1000, 2000, 4000, 1000, 3000])
    vec = factor(c, m, n, 1000)
    assert vec == pytest.approx([factor_scalar(c, int(a), int(b), 1000) for a, b in zip(m, n)])
    plain = CostParams(tiles=[[128, 128, 0.7]], num_sms=108)
    corr = replace(plain, gemm_correction=c)
    assert gemm_time(m, n, 1000, 312e12, 2e12, 2, corr) == pytest.approx(gemm_time(m, n, 1000, 312e12, 2e12, 2, plain) * vec)
    for a, b in zip(m, n):
        assert gemm_time_scalar(int(a), int(b), 1000, 312e12, 2e12, 2, corr) == pytest.approx(
            gemm_time_scalar(int(a), int(b), 1000, 312e12, 2e12, 2, plain) * factor_scalar(c, int(a), int(b), 1000))


def test_params_round_trip_keeps_the_correction():
    params, _ = load_calibration("h100-80gb")
    assert params.gemm_correction["shapes"]
    again = CostParams.from_dict(params.to_dict())
    assert again.gemm_correction == params.gemm_correction
    assert gemm_time_scalar(300, 12288, 4096, 989e12, 3.35e12, 2, again) == gemm_time_scalar(
        300, 12288, 4096, 989e12, 3.35e12, 2, params)


def test_pricing_a_gemm_stays_microseconds():
    """The cost model calls gemm_time_scalar once per distinct token count; goal: tens of us at most."""
    params, _ = load_calibration("h100-80gb")
    shapes = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32000, 4096), (5000, 3000)]
    for n, k in shapes:  # first call per shape builds its curve
        gemm_time_scalar(1, n, k, 989e12, 3.35e12, 2, params)
    calls = 0
    start = time.perf_counter()
    for m in range(1, 2001):
        for n, k in shapes:
            gemm_time_scalar(m, n, k, 989e12, 3.35e12, 2, params)
            calls += 1
    per_call = (time.perf_counter() - start) / calls
    assert per_call < 20e-6, f"{per_call * 1e6:.1f} us per call"


def test_evaluator_cache_is_bounded_and_rebuilds_what_it_dropped():
    from sim.executors import shape_correction as sc

    dicts = [{**CORR, "prior_weight": float(i)} for i in range(sc._MAX_EVALUATORS + 8)]
    for d in dicts:
        factor_scalar(d, 51, 2000, 1000)
    assert len(sc._EVALUATORS) <= sc._MAX_EVALUATORS
    # the first dict was dropped; evaluating it again rebuilds it (prior weight 0: the hand value above)
    assert factor_scalar(dicts[0], 51, 2000, 1000) == pytest.approx(math.exp(0.15))


# the same two curves labelled with the operators they were measured as, and an operator-aware kernel
OPS = {**CORR, "ops": ["a", "b"], "op_width_n": 1.0, "op_width_k": 1.0, "op_weight": 0.5, "op_prior_weight": 0.0}


def test_a_curve_of_another_operator_counts_op_weight():
    # N = 2000 is ln 2 from both shapes (equal kernel weights w); priced as "a", the curve of "b" counts 0.5 w:
    # at M = 51 the curves are 0.1 and 0.2, so r = (0.1 + 0.5 x 0.2) / 1.5
    assert factor_scalar(OPS, 51, 2000, 1000, "a") == pytest.approx(math.exp(0.2 / 1.5))
    assert factor_scalar(OPS, 51, 2000, 1000, "b") == pytest.approx(math.exp((0.5 * 0.1 + 0.2) / 1.5))
    # no operator, or one the correction never saw (an LM head): the operator-blind mean, as without "ops"
    for op in (None, "lm_head"):
        assert factor_scalar(OPS, 51, 2000, 1000, op) == pytest.approx(math.exp(0.15))


def test_a_measured_shape_keeps_its_own_curve_for_its_own_operator_only():
    assert factor_scalar(OPS, 101, 1000, 1000, "a") == pytest.approx(math.exp(0.2))
    # (1000, 1000) was measured as "a": priced as "b" it is a neighbour at distance 0 with weight 0.5, and
    # (4000, 1000), measured as "b", weighs exp(-(ln 4)^2 / 2); at M = 1 the curves are 0.0 and 0.1
    w = math.exp(-math.log(4) ** 2 / 2)
    assert factor_scalar(OPS, 1, 1000, 1000, "b") == pytest.approx(math.exp(w * 0.1 / (0.5 + w)))
    assert factor_scalar(OPS, 1, 1000, 1000) == pytest.approx(1.0)  # operator-blind: its own curve


def test_a_shape_measured_as_two_operators_keeps_both_curves():
    c = {**OPS, "ops": ["", "b"], "op_curves": {"a,1000,1000": [0.5, 0.5], "b,1000,1000": [-0.5, -0.5]}}
    assert factor_scalar(c, 51, 1000, 1000, "a") == pytest.approx(math.exp(0.5))
    assert factor_scalar(c, 51, 1000, 1000, "b") == pytest.approx(math.exp(-0.5))
    assert factor_scalar(c, 51, 1000, 1000) == pytest.approx(math.exp(0.1))  # the pooled curve


def test_local_points_of_one_operator_and_of_any():
    c = {**OPS, "local": {"a,1000,1000": [[1, 0.3]], "4000,1000": [[1, -0.3]]}}
    assert factor_scalar(c, 1, 1000, 1000, "a") == pytest.approx(math.exp(0.0 + 0.3))
    assert factor_scalar(c, 1, 1000, 1000) == pytest.approx(math.exp(0.0))        # not for other operators
    assert factor_scalar(c, 1, 4000, 1000, "b") == pytest.approx(math.exp(0.1 - 0.3))  # "N,K": any operator
    assert factor_scalar(c, 1, 4000, 1000) == pytest.approx(math.exp(0.1 - 0.3))


def test_vectorised_operators_match_scalar():
    c = {**OPS, "local": {"a,1000,1000": [[1, 0.3]]}}
    m = np.array([1, 51, 51, 51, 101, 1])
    n = np.array([1000, 2000, 2000, 2000, 3000, 1000])
    ops = np.array(["a", "a", "b", "lm_head", "b", "b"], dtype=object)
    vec = factor(c, m, n, 1000, ops)
    assert vec == pytest.approx([factor_scalar(c, int(a), int(b), 1000, o) for a, b, o in zip(m, n, ops)])
    assert factor(c, m, n, 1000) == pytest.approx([factor_scalar(c, int(a), int(b), 1000) for a, b in zip(m, n)])
    plain = CostParams(tiles=[[128, 128, 0.7]], num_sms=108)
    assert gemm_time(m, n, 1000, 312e12, 2e12, 2, replace(plain, gemm_correction=c), ops) == pytest.approx(
        gemm_time(m, n, 1000, 312e12, 2e12, 2, plain) * vec)
