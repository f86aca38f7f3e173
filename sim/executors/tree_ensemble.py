"""Gradient-boosted regression trees, fitted with scikit-learn and evaluated with numpy alone.

The stored form (plain JSON, part of a calibration's ``gemm_correction["trees"]``) is

    {"base": b,                    the constant the trees add to
     "features": [name, ...],      the feature columns the trees index (gemm_features.FEATURE_NAMES)
     "feature": [[f, ...], ...],   per tree, per node in depth-first order: the feature index, -1 at a leaf
     "split": [[s, ...], ...],     per node: a split's threshold (go left when x[f] <= s), a leaf's value
                                   (shrinkage included)
     "right": [[r, ...], ...]}     per node: the index of a split's right child in its tree (0 at a leaf);
                                   its left child is the next node

    prediction(x) = b + sum over trees of value[leaf reached by x]

An average of ensembles (``fit_trees`` with several seeds: each fitted with its own draw of the features a
split may choose among) is stored as one: b the mean of their constants, every leaf value divided by their
number.

Invariants: the fitted models' mean prediction and ``TreeEnsemble.predict`` agree to the stored rounding
(5e-8 on the values per ensemble); fitting is deterministic for the same rows and seeds (no row subsampling,
no early stopping, one thread); numpy only at run time: scikit-learn is imported by ``fit_trees`` alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.native import native

# chosen once on the leave-one-model-out folds (docs/per_operator_experiments.md)
TREE_SETTINGS = {"max_iter": 300, "learning_rate": 0.05, "max_depth": 6, "min_samples_leaf": 20,
                 "l2_regularization": 1.0}
# the averaged ensembles of the correction's plain trees (opmodel.py): four, each split choosing among a random
# 30% of the features; 300 trees at three times the step, the shrinkage of the 1,000 at 0.05 first tried
AVERAGED_SETTINGS = {**TREE_SETTINGS, "learning_rate": 0.15, "max_features": 0.3}
AVERAGED_SEEDS = (0, 1, 2, 3)


def fit_trees(x: np.ndarray, y: np.ndarray, feature_names: list[str], settings: dict[str, Any] | None = None,
              seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """The stored form of the mean of least-squares boosted ensembles fitted to (x, y) with ``settings``
    (default ``TREE_SETTINGS``), one per random seed in ``seeds``."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    # one thread: as fast here as all of them, the same trees on any machine, and no OpenMP spinning against
    # other processes (parallel test workers, a sweep's runs)
    with threadpool_limits(limits=1):
        models = [HistGradientBoostingRegressor(random_state=seed, early_stopping=False,
                                                **(settings or TREE_SETTINGS)).fit(x, y) for seed in seeds]
    share = 1.0 / len(models)
    base = float(np.mean([np.ravel(m._baseline_prediction)[0] for m in models]))
    out: dict[str, Any] = {"base": round(base, 8), "features": list(feature_names), "feature": [], "split": [],
                           "right": []}
    for (tree,) in (p for m in models for p in m._predictors):
        nodes = tree.nodes
        leaf = nodes["is_leaf"].astype(bool)
        split = np.flatnonzero(~leaf)
        if not np.array_equal(nodes["left"][split], split + 1):
            raise RuntimeError("scikit-learn's tree nodes are no longer in depth-first order")
        out["feature"].append(np.where(leaf, -1, nodes["feature_idx"]).astype(int).tolist())
        out["split"].append([round(float(v) * share, 7) if is_leaf else float(t)
                             for v, t, is_leaf in zip(nodes["value"], nodes["num_threshold"], leaf)])
        out["right"].append(np.where(leaf, 0, nodes["right"]).astype(int).tolist())
    return out


class TreeEnsemble:
    """Evaluates a stored ensemble over rows of features, all trees at once (one pass per tree level)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.base = float(data["base"])
        self.n_features = len(data["features"])
        _check_trees(data, self.n_features)
        sizes = [len(f) for f in data["feature"]]
        self.offsets = np.cumsum([0, *sizes])[:-1].astype(np.int64)
        flat = {key: np.concatenate([np.asarray(v) for v in data[key]]) if sizes else np.zeros(0)
                for key in ("feature", "split", "right")}
        feature = flat["feature"].astype(np.int64)
        leaf = feature < 0
        split = flat["split"].astype(float)
        node = np.arange(len(feature), dtype=np.int64)
        first = np.repeat(self.offsets, sizes)  # each node's tree's first node
        # a leaf leads to itself both ways, so walking every row one level at a time settles at its leaf
        self.feature = np.where(leaf, 0, feature)
        self.threshold = np.where(leaf, 0.0, split)
        self.value = np.where(leaf, split, 0.0)
        self.left = np.where(leaf, node, node + 1)
        self.right = np.where(leaf, node, flat["right"].astype(np.int64) + first)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """base + the sum of every tree's leaf value, per row of ``x`` (rows x n_features); compiled where
        sim._native is built (the same values bit for bit, tests/test_tree_ensemble.py)."""
        x = np.asarray(x, dtype=float).reshape(-1, self.n_features)
        if not len(self.offsets):
            return np.full(len(x), self.base)
        if native is not None:
            out = np.empty(len(x))
            native.tree_predict(out, np.ascontiguousarray(x), len(x), self.n_features, self.offsets,
                                len(self.offsets), self.feature, self.threshold, self.value, self.left,
                                self.right, len(self.feature), self.base)
            return out
        return self.predict_numpy(x)

    def predict_numpy(self, x: np.ndarray) -> np.ndarray:
        """``predict`` with numpy alone (rows x n_features float64)."""
        flat_x = x.ravel()
        row_start = (np.arange(len(x)) * self.n_features)[None, :]
        node = np.repeat(self.offsets[:, None], len(x), axis=1)  # trees x rows, global node index
        while True:
            left = flat_x[row_start + self.feature[node]] <= self.threshold[node]
            nxt = np.where(left, self.left[node], self.right[node])
            if np.array_equal(nxt, node):
                return self.base + self.value[node].sum(axis=0)
            node = nxt


def _check_trees(data: dict[str, Any], n_features: int) -> None:
    """ValueError naming the first tree that is not a well-formed depth-first tree over ``n_features``."""
    trees = [data["feature"], data["split"], data["right"]]
    if len({len(t) for t in trees}) != 1:
        raise ValueError("trees: 'feature', 'split' and 'right' list different numbers of trees")
    for i, (feature, split, right) in enumerate(zip(*trees)):
        size = len(feature)
        if size == 0 or len(split) != size or len(right) != size:
            raise ValueError(f"trees: tree {i} has no nodes or lists of different lengths")
        for node, (f, r) in enumerate(zip(feature, right)):
            if f == -1:
                continue
            if not (isinstance(f, int) and 0 <= f < n_features and isinstance(r, int) and node + 1 < r < size):
                raise ValueError(f"trees: tree {i} node {node}: feature {f!r} (of {n_features}) or right child "
                                 f"{r!r} (of {size} nodes) out of range")
