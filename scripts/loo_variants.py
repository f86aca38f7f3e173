"""Variants of the learned GEMM correction tried on the leave-one-model-out folds and not kept
(docs/per_operator_experiments.md), and one bound, scored as ``kvsim validate --loo`` scores the shipped blend.

    PYTHONPATH=. python scripts/loo_variants.py                        # both GPUs, every variant (about 10 min)
    PYTHONPATH=. python scripts/loo_variants.py --hardware h100-80gb --only shipped bagged

Per fold (one model held out, its GEMM shapes removed from training: ``opmodel.loo_split``) the blend is
``roofline x exp((1 - w) x kernel mean + w x learner)`` with w = ``opmodel.TREE_WEIGHT``; a variant changes
the learner, its features, targets or training rows (``cross_gpu``: the other GPU's tables too), or the
kernel mean's widths, and nothing else; a variant that predicts the whole log ratio (``stacked``: trees that
also read the kernel mean, out of fold for their training rows) is scored as it is. Printed: MAPE of the
held-out models' four projections per model and pooled over all held-out rows (the README's figure).
"shipped" is an even mean of the blend (its plain trees averaged over ``AVERAGED_SEEDS``), the stacked trees and
the cross-GPU trees, and reproduces ``kvsim validate --loo`` (but for A100's Llama-3-8B above 4,096 tokens:
beyond the grid's last token count the shipped curves go on from their last value as the plain trees
change, sampled 2^(1/32) apart in M, where this script evaluates every part at each row's own token count);
"stacked_blend" is the blend with one plain ensemble averaged with the stacked trees, as shipped from
2026-12-05 to 2026-12-07 ("all_averaged", the same as "shipped" with 1,000 trees at 0.05 per averaged
ensemble, was defined before then); "unstacked" is that blend alone, as shipped until 2026-12-05.
The "bound" line knows each held-out shape's measurements: it removes the shape's own median log error
from the shipped blend, the most any per-shape offset could give. Needs scikit-learn (the ``fit`` extra).
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor, RandomForestRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from sim.executors import calibrate, opmodel
from sim.executors.gemm_features import gemm_features
from sim.executors.measurements import read_measurements
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams
from sim.executors.tree_ensemble import AVERAGED_SEEDS, AVERAGED_SETTINGS, TREE_SETTINGS
from sim.executors.validation import hardware_of, shipped_vidur
from sim.specs import HardwareSpec

SHAPE = ["operator", "N", "K"]


@dataclass
class Fold:
    """One held-out model: training and test rows, their features, the roofline and the kernel-mean data."""

    held: str
    train: pd.DataFrame
    test: pd.DataFrame
    x_train: np.ndarray
    x_test: np.ndarray
    target: np.ndarray        # log(measured / roofline) of the training rows
    roofline_test: np.ndarray
    correction: dict          # opmodel.fit_correction's data (its trees are not used here)
    num_sms: int
    hardware: str
    roofline: CostParams      # the tile/wave roofline fitted on the training rows


def make_fold(df: pd.DataFrame, hw: HardwareSpec, held: str) -> Fold:
    train, test, fits = opmodel.loo_fold(df, hw, held)
    roof = fits["roofline"]   # the tile/wave roofline without a correction
    target = np.log(train.time_s.to_numpy() / opmodel.predict_gemm(train, hw, roof))
    feats = [gemm_features(d.M.to_numpy(), d.N.to_numpy(), d.K.to_numpy(), roof.num_sms, d.operator.to_numpy())
             for d in (train, test)]
    return Fold(held, train, test, *feats, target, opmodel.predict_gemm(test, hw, roof),
                fits["corrected"].gemm_correction, roof.num_sms, hw.name, roof)


def kernel_mean(fold: Fold, **widths: float) -> np.ndarray:
    """The kernel mean's log ratio at each test row (no trees), with ``widths`` overriding the stored ones."""
    return opmodel.kernel_mean_at({**fold.correction, **widths}, fold.test)


def stacked(f: Fold) -> np.ndarray:
    """Trees with one more feature, the kernel mean: out of fold for the training rows
    (``opmodel.out_of_fold_kernel_mean``), from the whole training set for the held-out rows. Their prediction
    is the whole log ratio (no blend)."""
    x = np.hstack([f.x_train, opmodel.out_of_fold_kernel_mean(f.train.assign(r=f.target))[:, None]])
    return boosted(x, f.target, np.hstack([f.x_test, kernel_mean(f)[:, None]]))


def as_learner(f: Fold, whole: np.ndarray) -> np.ndarray:
    """The learner's part that makes the blend ``(1 - w) x kernel mean + w x learner`` equal ``whole``."""
    w = opmodel.TREE_WEIGHT
    return (whole - (1 - w) * kernel_mean(f)) / w


def shipped_blend(f: Fold) -> np.ndarray:
    """The blend's whole log ratio at the held-out rows with one ensemble of plain trees (shipped until
    2026-12-07; without the stacked trees)."""
    w = opmodel.TREE_WEIGHT
    return (1 - w) * kernel_mean(f) + w * boosted(f.x_train, f.target, f.x_test)


def averaged_blend(f: Fold) -> np.ndarray:
    """The blend with the plain trees as shipped since 2026-12-07: AVERAGED_SEEDS ensembles averaged."""
    w = opmodel.TREE_WEIGHT
    trees = np.mean([boosted(f.x_train, f.target, f.x_test, **AVERAGED_SETTINGS, random_state=s)
                     for s in AVERAGED_SEEDS], axis=0)
    return (1 - w) * kernel_mean(f) + w * trees


def extra_features(d: pd.DataFrame, kind: str, num_sms: int) -> np.ndarray:
    """Columns appended to gemm_features for the feature variants."""
    m, n, k = (d[c].to_numpy().astype(float) for c in "MNK")
    if kind == "split_k":   # per tile: the K split that fills the SMs (at most one per 512 of K), ln K per split
        cols = []
        for tm, tn in ((64, 128), (128, 128), (128, 256)):
            tiles = np.ceil(m / tm) * np.ceil(n / tn)
            split = np.clip(np.floor(num_sms / tiles), 1, np.maximum(1, k // 512))
            cols += [split, np.log(k / split)]
        return np.stack(cols, axis=1)
    if kind == "operand_sizes":
        size = m * k + k * n + m * n
        return np.stack([np.log(size), np.log(k * n / size)], axis=1)
    return np.stack([np.log(m / n), np.log(m / k), np.log(n / k)], axis=1)   # "ratios"


def boosted(x: np.ndarray, y: np.ndarray, xt: np.ndarray, **settings) -> np.ndarray:
    params = {"random_state": 0, **TREE_SETTINGS, **settings}
    return HistGradientBoostingRegressor(early_stopping=False, **params).fit(x, y).predict(xt)


def subsampled(f: Fold) -> np.ndarray:
    """Four boosted ensembles of 1,000 trees, each split choosing among a random 30% of the features."""
    return np.mean([boosted(f.x_train, f.target, f.x_test, max_iter=1000, max_features=0.3, random_state=s)
                    for s in range(4)], axis=0)


def forest(f: Fold) -> np.ndarray:
    return RandomForestRegressor(300, min_samples_leaf=5, max_features=0.3, n_jobs=2, random_state=0).fit(
        f.x_train, f.target).predict(f.x_test)


def network(f: Fold) -> np.ndarray:
    """A small neural network (two hidden layers) on the standardised features."""
    net = MLPRegressor(hidden_layer_sizes=(128, 64), alpha=1e-2, max_iter=300, random_state=0)
    with warnings.catch_warnings():   # 300 passes, converged or not (scikit-learn warns when not)
        warnings.simplefilter("ignore", ConvergenceWarning)
        return make_pipeline(StandardScaler(), net).fit(f.x_train, f.target).predict(f.x_test)


def rolling_median(f: Fold, window: int) -> np.ndarray:
    """The training targets as a centred rolling median over ``window`` token counts, per model and shape."""
    d = f.train.assign(r=f.target).reset_index(drop=True).sort_values(["model", *SHAPE, "M"])
    smooth = d.groupby(["model", *SHAPE]).r.transform(lambda s: s.rolling(window, center=True, min_periods=1)
                                                      .median())
    return smooth.sort_index().to_numpy()


@functools.cache
def projection_rows(hardware: str) -> pd.DataFrame:
    """Every shipped projection row of one GPU (opmodel.with_shapes)."""
    return opmodel.with_shapes(read_measurements(shipped_vidur(hardware.split("-")[0])))


def cross_gpu(f: Fold) -> np.ndarray:
    """Trees (600) fitted on the fold's rows and the other GPU's, each against its own GPU's tile/wave roofline,
    with the SM count as one more feature. The other GPU's rows lose the held-out model and its shapes too."""
    other = hardware_of(next(g for g in ("h100-80gb", "a100-80gb") if g != f.hardware))
    rows = projection_rows(other.name)
    shapes = pd.MultiIndex.from_frame(f.test[["N", "K"]].drop_duplicates())
    rows = rows[(rows.model != f.held) & ~pd.MultiIndex.from_frame(rows[["N", "K"]]).isin(shapes)]
    roof = calibrate.fit_gemm(rows, other, CostParams(num_sms=DEFAULT_NUM_SMS[other.name]))
    target = np.log(rows.time_s.to_numpy() / opmodel.predict_gemm(rows, other, roof))
    feats = gemm_features(rows.M.to_numpy(), rows.N.to_numpy(), rows.K.to_numpy(), roof.num_sms,
                          rows.operator.to_numpy())

    def with_sms(x: np.ndarray, sms: int) -> np.ndarray:
        return np.hstack([x, np.full((len(x), 1), float(sms))])

    x = np.vstack([with_sms(f.x_train, f.num_sms), with_sms(feats, roof.num_sms)])
    return boosted(x, np.concatenate([f.target, target]), with_sms(f.x_test, f.num_sms), max_iter=600)


# name -> (learner's log ratio at the test rows, kernel-mean widths)
Learner = Callable[[Fold], np.ndarray]
VARIANTS: dict[str, tuple[Learner, dict[str, float]]] = {
    "shipped": (lambda f: as_learner(f, (averaged_blend(f) + stacked(f) + cross_gpu(f)) / 3), {}),
    "stacked_blend": (lambda f: as_learner(f, (shipped_blend(f) + stacked(f)) / 2), {}),
    "unstacked": (lambda f: boosted(f.x_train, f.target, f.x_test), {}),
    "bagged": (lambda f: (boosted(f.x_train, f.target, f.x_test) + forest(f)) / 2, {}),
    "extra_trees": (lambda f: (boosted(f.x_train, f.target, f.x_test) + ExtraTreesRegressor(
        300, min_samples_leaf=10, max_features=0.5, n_jobs=2, random_state=0).fit(f.x_train, f.target)
        .predict(f.x_test)) / 2, {}),
    "network": (network, {}),
    "network_averaged": (lambda f: (boosted(f.x_train, f.target, f.x_test) + network(f)) / 2, {}),
    "subsampled": (subsampled, {}),
    "cross_gpu": (cross_gpu, {}),
    "cross_gpu_averaged": (lambda f: (boosted(f.x_train, f.target, f.x_test) + cross_gpu(f)) / 2, {}),
    "subsampled_bagged": (lambda f: (subsampled(f) + forest(f)) / 2, {}),
    "stacked": (lambda f: as_learner(f, stacked(f)), {}),
    "stacked_cross_gpu_averaged": (lambda f: as_learner(f, (shipped_blend(f) + stacked(f) + cross_gpu(f)) / 3), {}),
    "all_averaged": (lambda f: as_learner(f, (shipped_blend(f) + stacked(f) + cross_gpu(f)) / 3
                                          + 0.7 * (subsampled(f) - boosted(f.x_train, f.target, f.x_test)) / 3), {}),
    **{f"features_{kind}": ((lambda f, kind=kind: boosted(
        np.hstack([f.x_train, extra_features(f.train, kind, f.num_sms)]), f.target,
        np.hstack([f.x_test, extra_features(f.test, kind, f.num_sms)]))), {})
       for kind in ("split_k", "operand_sizes", "ratios")},
    **{f"clipped_{c}": ((lambda f, c=c: boosted(f.x_train, np.clip(f.target, -c, c), f.x_test)), {})
       for c in (0.2, 0.3)},
    **{f"rolling_median_{w}": ((lambda f, w=w: boosted(f.x_train, rolling_median(f, w), f.x_test)), {})
       for w in (3, 5, 9)},
    **{f"kernel_n_{wn}": ((lambda f: boosted(f.x_train, f.target, f.x_test)),
                          {"width_n": wn, "op_width_n": wn}) for wn in (1.0, 3.0)},
}


def score(folds: list[Fold], learner: Learner, widths: dict[str, float], bound: bool = False) -> dict[str, float]:
    """MAPE (%) per held-out model and pooled ("all")."""
    w = opmodel.TREE_WEIGHT
    errs = {}
    for f in folds:
        log_err = (np.log(f.roofline_test) + (1 - w) * kernel_mean(f, **widths) + w * learner(f)
                   - np.log(f.test.time_s.to_numpy()))
        if bound:
            log_err = log_err - pd.Series(log_err).groupby(pd.MultiIndex.from_frame(f.test[SHAPE])
                                                          ).transform("median").to_numpy()
        errs[f.held] = np.abs(np.expm1(log_err))
    out = {held: 100 * e.mean() for held, e in errs.items()}
    out["all"] = 100 * np.concatenate(list(errs.values())).mean()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", nargs="+", default=["h100-80gb", "a100-80gb"])
    ap.add_argument("--only", nargs="+", choices=[*VARIANTS, "bound"], help="these variants (default: all)")
    args = ap.parse_args()
    names = args.only or [*VARIANTS, "bound"]
    for name in args.hardware:
        hw = hardware_of(name)
        df = read_measurements(shipped_vidur(name.split("-")[0]))
        folds = [make_fold(df, hw, held) for held in sorted(opmodel.with_shapes(df).model.unique())]
        for variant in names:
            learner, widths = VARIANTS["shipped" if variant == "bound" else variant]
            res = score(folds, learner, widths, bound=variant == "bound")
            per_model = ", ".join(f"{m} {v:.2f}" for m, v in res.items() if m != "all")
            print(f"{name} {variant:26s} all held-out rows {res['all']:.2f}%  ({per_model})", flush=True)


if __name__ == "__main__":
    main()
