"""The boosted trees of the GEMM correction: numpy evaluation by hand and against scikit-learn, the GEMM
features by hand, and the blend into the correction of an unseen shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.executors.gemm_features import FEATURE_NAMES, gemm_features
from sim.executors.shape_correction import extension, factor, factor_scalar
from sim.executors.tree_ensemble import TreeEnsemble, fit_trees

# two trees over two features, written by hand (nodes in depth-first order, a split's left child next):
# tree 0: x0 <= 1.5 ? 0.1 : (x1 <= 0 ? -0.2 : 0.3); tree 1: a single leaf 0.05
HAND = {"base": 1.0, "features": ["a", "b"],
        "feature": [[0, -1, 1, -1, -1], [-1]], "split": [[1.5, 0.1, 0.0, -0.2, 0.3], [0.05]],
        "right": [[2, 0, 4, 0, 0], [0]]}


def test_hand_built_trees():
    x = np.array([[1.0, 5.0], [1.5, -1.0], [2.0, -1.0], [2.0, 0.0], [2.0, 0.5]])
    # row by row: leaf 0.1, 0.1 (1.5 <= 1.5 goes left), -0.2, -0.2 (0 <= 0), 0.3; plus base 1 and 0.05
    expected = [1.15, 1.15, 0.85, 0.85, 1.35]
    assert TreeEnsemble(HAND).predict(x) == pytest.approx(expected)


def test_numpy_evaluation_matches_scikit_learn():
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    from sim.executors.tree_ensemble import TREE_SETTINGS

    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, size=(3000, 4))
    y = np.sin(2 * x[:, 0]) + 0.5 * (x[:, 1] > 0.3) * x[:, 2] + 0.05 * rng.normal(size=len(x))
    stored = fit_trees(x, y, ["a", "b", "c", "d"])
    with threadpool_limits(limits=1):
        reference = HistGradientBoostingRegressor(random_state=0, early_stopping=False, **TREE_SETTINGS).fit(x, y)
    probe = rng.uniform(-3, 3, size=(500, 4))
    got = TreeEnsemble(stored).predict(probe)
    assert np.abs(got - reference.predict(probe)).max() < 300 * 5e-8 + 1e-9  # leaf values stored to 7 decimals
    assert len(stored["feature"]) == TREE_SETTINGS["max_iter"]
    # deterministic: the same rows give the same stored trees
    assert fit_trees(x, y, ["a", "b", "c", "d"]) == stored


def test_ensembles_of_several_seeds_are_stored_as_their_mean():
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    from sim.executors.tree_ensemble import AVERAGED_SETTINGS

    rng = np.random.default_rng(11)
    x = rng.uniform(-2, 2, size=(2000, 4))
    y = np.cos(x[:, 0] * x[:, 1]) + 0.3 * x[:, 3] + 0.05 * rng.normal(size=len(x))
    settings = {**AVERAGED_SETTINGS, "max_iter": 40}
    stored = fit_trees(x, y, ["a", "b", "c", "d"], settings, seeds=(0, 1, 2))
    with threadpool_limits(limits=1):
        refs = [HistGradientBoostingRegressor(random_state=s, early_stopping=False, **settings).fit(x, y)
                for s in (0, 1, 2)]
    probe = rng.uniform(-3, 3, size=(400, 4))
    reference = np.mean([r.predict(probe) for r in refs], axis=0)
    assert len(stored["feature"]) == 3 * 40
    # each leaf value is a third of the fitted one, stored to 7 decimals; the base to 8
    assert np.abs(TreeEnsemble(stored).predict(probe) - reference).max() < 120 * 5e-8 + 5e-9
    # the seeds draw different features for their splits: the three ensembles differ
    assert np.ptp([r.predict(probe) for r in refs], axis=0).max() > 1e-3


def test_the_compiled_evaluation_equals_numpy_bit_for_bit():
    from sim.executors.cost_model import load_calibration
    from sim.native import native

    if native is None:
        pytest.skip("sim._native is not built")
    params, _ = load_calibration("h100-80gb")
    rng = np.random.default_rng(3)
    m, n, k = rng.integers(1, 8192, 600), rng.integers(64, 30000, 600), rng.integers(64, 30000, 600)
    x = gemm_features(m, n, k, 132, rng.choice(["mlp_up_proj", "attn_post_proj", ""], 600))
    for part in ("trees", "stacked_trees", "cross_trees"):
        trees = TreeEnsemble(params.gemm_correction[part])
        cols = {"trees": x, "stacked_trees": np.hstack([x, rng.normal(0, 0.1, (600, 1))]),
                "cross_trees": np.hstack([x, np.full((600, 1), 132.0)])}[part]
        assert np.array_equal(trees.predict(cols), trees.predict_numpy(cols)), part
    assert TreeEnsemble(HAND).predict(np.array([[2.0, 0.5], [1.0, 5.0]])) == pytest.approx([1.35, 1.15])


def test_gemm_features_by_hand():
    # M = 100, N = 300, K = 64 on 108 SMs
    f = dict(zip(FEATURE_NAMES, gemm_features(np.array([100]), 300, 64, 108)[0]))
    assert f["ln_m"] == pytest.approx(math.log(100))
    assert f["ln_mnk"] == pytest.approx(math.log(100 * 300 * 64))
    assert f["ln_intensity"] == pytest.approx(math.log(100 * 300 * 64 / (100 * 64 + 300 * 64 + 100 * 300)))
    # 64x64 tiles: 2 x 5 = 10 tiles, one wave, 10 / 108 full, padded work 1 x 64 x 64
    assert f["waves_64x64"] == 1 and f["fill_64x64"] == pytest.approx(10 / 108)
    # 256x128: 1 x 3 tiles, one wave of 256 x 128 = 8 x the 64x64 work (the least of every tile)
    assert f["fill_256x128"] == pytest.approx(3 / 108) and f["rel_work_256x128"] == pytest.approx(8.0)
    assert f["rel_work_64x64"] == pytest.approx(1.0)
    assert f["m_fill_64"] == pytest.approx(100 / 128) and f["m_fill_256"] == pytest.approx(100 / 256)
    assert (f["m_mod_16"], f["m_mod_32"], f["m_mod_64"]) == (4, 4, 36)
    assert (f["n_mod_128"], f["k_mod_128"]) == (44, 64)
    # 2,000 tiles of 64x64 over 108 SMs: 19 waves, the last one partly full
    g = dict(zip(FEATURE_NAMES, gemm_features(np.array([6400]), 1280, 64, 108)[0]))
    assert g["waves_64x64"] == 19 and g["fill_64x64"] == pytest.approx(2000 / (19 * 108))


# a correction with one measured shape (1000, 1000) and the hand-built trees over the GEMM features: the
# first split reads ln M (feature 0) at ln 50, the second ln N (feature 1) at ln 2000
TREES = {"base": 0.0, "features": list(FEATURE_NAMES),
         "feature": [[0, -1, 1, -1, -1]], "split": [[math.log(50), 0.1, math.log(2000), -0.2, 0.3]],
         "right": [[2, 0, 4, 0, 0]]}
CORR = {"grid_m": [1, 101], "shapes": [[1000, 1000]], "curves": [[0.0, 0.2]], "width_n": 1.0, "width_k": 1.0,
        "prior_weight": 0.0, "trees": TREES, "tree_weight": 0.25, "num_sms": 108}


def test_an_unseen_shape_blends_the_kernel_mean_and_the_trees():
    # N = 3000: the kernel mean is the one curve [0, 0.2]; the trees give 0.1 at M = 1 and 0.3 at M = 101
    # (ln 101 > ln 50, N = 3000 > 2000), so the blended curve is 0.75 x [0, 0.2] + 0.25 x [0.1, 0.3]
    blended = [0.25 * 0.1, 0.75 * 0.2 + 0.25 * 0.3]
    assert factor_scalar(CORR, 1, 3000, 1000) == pytest.approx(math.exp(blended[0]))
    assert factor_scalar(CORR, 51, 3000, 1000) == pytest.approx(math.exp(sum(blended) / 2))
    # N = 1500 < 2000: the trees' right branch gives -0.2 at M = 101
    assert factor_scalar(CORR, 101, 1500, 1000) == pytest.approx(math.exp(0.75 * 0.2 - 0.25 * 0.2))
    assert factor(CORR, np.array([1, 51]), 3000, 1000) == pytest.approx(np.exp([blended[0], sum(blended) / 2]))


def test_a_measured_shape_ignores_the_trees():
    assert factor_scalar(CORR, 101, 1000, 1000) == pytest.approx(math.exp(0.2))
    assert factor_scalar({**CORR, "tree_weight": 0.0}, 101, 3000, 1000) == pytest.approx(math.exp(0.2))


def test_no_trees_is_the_base():
    empty = {"base": 0.25, "features": ["a"], "feature": [], "split": [], "right": []}
    assert TreeEnsemble(empty).predict(np.zeros((3, 1))).tolist() == [0.25, 0.25, 0.25]


def test_operator_columns():
    names = ["op_attn_pre_proj", "op_attn_post_proj", "op_mlp_up_proj", "op_mlp_down_proj"]
    assert FEATURE_NAMES[-4:] == names
    up = dict(zip(FEATURE_NAMES, gemm_features(np.array([8]), 4096, 4096, 132, "mlp_up_proj")[0]))
    assert [up[n] for n in names] == [0, 0, 1, 0]
    blind = gemm_features(np.array([8, 16]), 4096, 4096, 132)
    assert (blind[:, -4:] == 0).all()
    # one name per row
    rows = gemm_features(np.array([8, 8]), 4096, 4096, 132, np.array(["attn_post_proj", "mlp_down_proj"], dtype=object))
    assert rows[:, -4:].tolist() == [[0, 1, 0, 0], [0, 0, 0, 1]]
    # the shape columns do not depend on the operator
    assert (rows[:, :-4] == blind[:1, :-4]).all()


# one tree over the operator column op_mlp_up_proj: 0.4 for an MLP up projection, else 0
UP = FEATURE_NAMES.index("op_mlp_up_proj")
OP_TREES = {"base": 0.0, "features": list(FEATURE_NAMES), "feature": [[UP, -1, -1]], "split": [[0.5, 0.0, 0.4]],
            "right": [[2, 0, 0]]}
OP_CORR = {**CORR, "trees": OP_TREES, "tree_weight": 0.5, "prior_weight": 1e-9}


def test_the_trees_read_the_operator_and_average_over_the_four_without_one():
    # N = 3000 is unseen: the kernel mean is the one curve [0, 0.2] (prior weight ~0); at M = 1 it is 0
    assert factor_scalar(OP_CORR, 1, 3000, 1000, "mlp_up_proj") == pytest.approx(math.exp(0.5 * 0.4))
    assert factor_scalar(OP_CORR, 1, 3000, 1000, "attn_pre_proj") == pytest.approx(1.0)
    # the LM head (no projection): the mean of 0.4, 0, 0, 0
    assert factor_scalar(OP_CORR, 1, 3000, 1000) == pytest.approx(math.exp(0.5 * 0.1))
    assert factor_scalar(OP_CORR, 1, 3000, 1000, "lm_head") == pytest.approx(math.exp(0.5 * 0.1))


def test_an_ensemble_fitted_before_the_operator_columns_reads_the_first_ones():
    old = {**TREES, "features": list(FEATURE_NAMES[:-4])}
    assert factor_scalar({**CORR, "trees": old}, 1, 3000, 1000) == pytest.approx(math.exp(0.25 * 0.1))


# one tree over ln M alone: 0 up to 400 tokens, 0.4 above; the correction's grid ends at 101 tokens
STEP_TREES = {"base": 0.0, "features": list(FEATURE_NAMES), "feature": [[0, -1, -1]],
              "split": [[math.log(400), 0.0, 0.4]], "right": [[2, 0, 0]]}
STEP_CORR = {**CORR, "trees": STEP_TREES}


def test_beyond_the_grid_the_trees_carry_a_curve_on():
    # the measured shape: its own 0.2 at 101 tokens, plus 0.25 x the trees' change from 101 (0) to M
    assert factor_scalar(STEP_CORR, 101, 1000, 1000) == pytest.approx(math.exp(0.2))
    assert factor_scalar(STEP_CORR, 300, 1000, 1000) == pytest.approx(math.exp(0.2))
    assert factor_scalar(STEP_CORR, 1000, 1000, 1000) == pytest.approx(math.exp(0.2 + 0.25 * 0.4))
    assert factor_scalar(STEP_CORR, 1 << 22, 1000, 1000) == pytest.approx(math.exp(0.3))  # flat past 2^20
    # an unseen shape: 0.75 x the kernel mean held at its last value 0.2, plus 0.25 x the trees at M
    assert factor_scalar(STEP_CORR, 101, 3000, 1000) == pytest.approx(math.exp(0.75 * 0.2))
    assert factor_scalar(STEP_CORR, 5000, 3000, 1000) == pytest.approx(math.exp(0.75 * 0.2 + 0.25 * 0.4))
    # without trees (or with weight 0) every curve stays flat beyond its grid
    assert factor_scalar({**STEP_CORR, "tree_weight": 0.0}, 5000, 1000, 1000) == pytest.approx(math.exp(0.2))
    ms = np.array([50, 101, 300, 1000, 5000, 1 << 22])
    for n in (1000, 3000):
        assert factor(STEP_CORR, ms, n, 1000) == pytest.approx([factor_scalar(STEP_CORR, m, n, 1000) for m in ms])


def test_the_token_counts_beyond_a_grid():
    # 32 a doubling from 4,096 to 2^20: 8 doublings, 256 points, the first round(4096 x 1.021897) = 4186
    ms = extension(4096)
    assert len(ms) == 256 and ms[0] == 4186 and ms[-1] == 1 << 20
    assert all(a < b for a, b in zip(ms, ms[1:]))
    assert extension(1 << 20) == []


# stacked trees: one tree over the kernel mean's column (the last one): 0.5 where the mean is at most 0.1,
# else -0.5
KM = len(FEATURE_NAMES)
STACKED = {"base": 0.0, "features": [*FEATURE_NAMES, "kernel_mean"], "feature": [[KM, -1, -1]],
           "split": [[0.1, 0.5, -0.5]], "right": [[2, 0, 0]]}
STACKED_CORR = {**CORR, "stacked_trees": STACKED, "stacked_weight": 0.5}


def test_an_unseen_projection_averages_the_blend_with_the_stacked_trees():
    # N = 3000 is unseen: the blend is [0.025, 0.225] on the grid (above); the kernel mean [0, 0.2] sends
    # M = 1 to 0.5 and M = 101 to -0.5 in the stacked tree; half of each
    curve = [0.5 * 0.025 + 0.5 * 0.5, 0.5 * 0.225 - 0.5 * 0.5]
    assert factor_scalar(STACKED_CORR, 1, 3000, 1000, "mlp_up_proj") == pytest.approx(math.exp(curve[0]))
    assert factor_scalar(STACKED_CORR, 101, 3000, 1000, "attn_post_proj") == pytest.approx(math.exp(curve[1]))
    assert factor(STACKED_CORR, np.array([1, 101]), 3000, 1000, "mlp_down_proj") == pytest.approx(np.exp(curve))
    # a GEMM of no projection (the LM head) keeps the blend; a measured shape its own curve
    assert factor_scalar(STACKED_CORR, 101, 3000, 1000) == pytest.approx(math.exp(0.225))
    assert factor_scalar(STACKED_CORR, 101, 1000, 1000, "mlp_up_proj") == pytest.approx(math.exp(0.2))
    # weight 0 is the blend alone
    assert factor_scalar({**STACKED_CORR, "stacked_weight": 0.0}, 1, 3000, 1000, "mlp_up_proj") == pytest.approx(
        math.exp(0.025))


# cross-GPU trees: one tree over the SM count's column (the last one): 0.4 on a GPU of at most 120 SMs, else -0.1
SMS = len(FEATURE_NAMES)
CROSS = {"base": 0.0, "features": [*FEATURE_NAMES, "num_sms"], "feature": [[SMS, -1, -1]],
         "split": [[120.0, 0.4, -0.1]], "right": [[2, 0, 0]]}
THIRD = 1 / 3
THREE_PARTS = {**CORR, "stacked_trees": STACKED, "stacked_weight": THIRD, "cross_trees": CROSS,
               "cross_weight": THIRD}


def test_an_unseen_projection_is_the_even_mean_of_the_blend_and_both_stacked_and_cross_gpu_trees():
    # as above, the blend is [0.025, 0.225] and the stacked tree [0.5, -0.5] at M = 1 and 101; the cross tree
    # reads the correction's SM count: 0.4 at 108 SMs, -0.1 at 132; a third of each
    for sms, cross in ((108, 0.4), (132, -0.1)):
        corr = {**THREE_PARTS, "num_sms": sms}
        curve = [(0.025 + 0.5 + cross) / 3, (0.225 - 0.5 + cross) / 3]
        assert factor_scalar(corr, 1, 3000, 1000, "mlp_up_proj") == pytest.approx(math.exp(curve[0]))
        assert factor(corr, np.array([1, 101]), 3000, 1000, "attn_pre_proj") == pytest.approx(np.exp(curve))
    # no projection: the blend alone; a measured shape: its own curve; both weights 0: the blend
    assert factor_scalar(THREE_PARTS, 101, 3000, 1000) == pytest.approx(math.exp(0.225))
    assert factor_scalar(THREE_PARTS, 101, 1000, 1000, "mlp_down_proj") == pytest.approx(math.exp(0.2))
    off = {**THREE_PARTS, "stacked_weight": 0.0, "cross_weight": 0.0}
    assert factor_scalar(off, 1, 3000, 1000, "mlp_up_proj") == pytest.approx(math.exp(0.025))


def test_cross_gpu_trees_over_other_columns_are_refused():
    from sim.executors.shape_correction import check

    with pytest.raises(ValueError, match="cross_trees"):
        check({**THREE_PARTS, "cross_trees": {**CROSS, "features": list(FEATURE_NAMES)}})


def test_stacked_trees_over_other_columns_are_refused():
    from sim.executors.shape_correction import check

    with pytest.raises(ValueError, match="stacked_trees"):
        check({**STACKED_CORR, "stacked_trees": {**STACKED, "features": list(FEATURE_NAMES)}})
