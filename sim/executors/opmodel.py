"""Fit the learned GEMM correction (shape_correction.py), score it leave-one-model-out, and adapt it to a
new model from a few of its own measured points.

- ``fit_correction``: per training shape (N, K), and per operator for a shape measured as several, the
  median of log(measured / roofline) at each token count M, sampled on the union of the measured token
  counts (linear in M between them); and boosted trees fitted to every row's log(measured / roofline) over
  the GEMM's features and operator (gemm_features.py), for shapes that were not measured. With rows of two
  models or more, a second ensemble (the stacked trees) reads one more column, the kernel mean at the row
  as a model that was not measured gets it: for a training row, the kernel mean of the curves of the other
  models with none of its model's shapes (``out_of_fold_kernel_mean``).
- The cross-GPU trees (cross_gpu.py): fitted on these rows and another GPU's, each against its own GPU's
  tile/wave roofline, with the SM count as a column; an unseen projection's curve is an even mean of the
  blend, the stacked trees and these.
- ``loo_split``: train on every other model with the held-out model's (N, K) shapes removed (two models
  with the same hidden size share their attention shapes: those leave training too), test on the
  held-out model. Nothing is judged on a shape it has seen.
- ``fit_local``: a new model's measured points, as deltas over the generalised model per operator and
  exact shape;
  interpolated in ln M among those in M's block of 64, else 128, else 256 token counts, else all
  (shape_correction.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from sim.executors.calibrate import fit_baseline, fit_gemm, gemm_shapes, mape
from sim.executors.cross_gpu import GpuRows, is_gpu, shipped_rows, training_rows, without
from sim.executors.gemm_features import CROSS_FEATURE_NAMES, FEATURE_NAMES, gemm_features, with_sms
from sim.executors.measurements import LINEAR_OPS
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams, gemm_time
from sim.executors.shape_correction import STACKED_FEATURE_NAMES, ShapeCorrection
from sim.executors.tree_ensemble import AVERAGED_SEEDS, AVERAGED_SETTINGS, TREE_SETTINGS, fit_trees
from sim.specs import HardwareSpec

# the correction's kernels (ln units) and prior weights, chosen once for both GPUs on the leave-one-model-out
# folds (README): operator-blind (a GEMM of no known projection, e.g. the LM head), and for a projection,
# with the weight of a curve measured as another operator
WIDTH_N, WIDTH_K, PRIOR_WEIGHT = 0.2, 0.4, 0.3
OP_WIDTH_N, OP_WIDTH_K, OP_WEIGHT, OP_PRIOR_WEIGHT = 0.3, 0.4, 0.2, 0.35
# the boosted trees' share of an unseen shape's curve (shape_correction.py), chosen once for both GPUs on the
# leave-one-model-out folds: 0.5 gives 5.34% / 5.57% (A100 on its three earlier tables / H100), 0.7 5.29% /
# 5.44%, 0.9 5.34% / 5.46%; with the four A100 tables 4.94%, 4.90% and 4.97% on A100 (then with the
# correction flat beyond the grid; 4.76% at 0.7 since the trees carry it on there, shape_correction.py)
TREE_WEIGHT = 0.7
# an unseen projection's curve is an even mean, not tuned, of the blend above, the stacked trees (where there are
# two training models or more) and the cross-GPU trees (where other GPUs' rows are given): kvsim validate --loo,
# blend and stacked trees, H100 5.44% -> 5.24%, A100 4.76% -> 4.66% on four tables each; all three, with the
# plain trees averaged over AVERAGED_SEEDS, 5.07% -> 4.96% and 4.47% -> 4.35% on six and seven (README)
# the cross-GPU trees: as the plain ones, over twice the rows and with twice the trees
CROSS_SETTINGS = {**TREE_SETTINGS, "max_iter": 600}


def with_shapes(df: pd.DataFrame) -> pd.DataFrame:
    """The projection rows of ``df`` with integer columns N and K (per TP shard) and M (tokens)."""
    rows = df[df.operator.isin(LINEAR_OPS)]
    k, n = gemm_shapes(rows)
    return rows.assign(N=n.astype(np.int64), K=k.astype(np.int64), M=rows.num_tokens.astype(np.int64))


def predict_gemm(rows: pd.DataFrame, hardware: HardwareSpec, params: CostParams) -> np.ndarray:
    """Seconds for rows carrying N, K, M and operator (see ``with_shapes``)."""
    return gemm_time(rows.M.to_numpy(), rows.N.to_numpy(), rows.K.to_numpy(), hardware.peak_flops,
                     hardware.hbm_bandwidth, rows.dtype_bytes.to_numpy(), params, rows.operator.to_numpy())


def _curves(r: pd.DataFrame, keys: list[str], grid: np.ndarray | None = None
            ) -> tuple[np.ndarray, pd.Index, list[list[float]]]:
    """(grid, index, curves): per ``keys``, the median of column r at each M, on ``grid`` (default: the union of
    the token counts of ``r``; linear in M between a shape's own, flat beyond), rounded to 4 decimals."""
    table = r.groupby([*keys, "M"]).r.median().unstack("M")
    if grid is not None:
        table = table.reindex(columns=grid)
    grid = table.columns.to_numpy()
    curves = []
    for _, row in table.iterrows():
        ok = row.notna().to_numpy()
        curves.append([round(float(x), 4) for x in np.interp(grid, grid[ok], row.to_numpy()[ok])])
    return grid, table.index, curves


def fit_correction(df: pd.DataFrame, hardware: HardwareSpec, params: CostParams,
                   others: Sequence[GpuRows] = ()) -> dict[str, Any]:
    """The stored correction over ``params`` (its own correction ignored) from the projection rows of ``df``:
    per (N, K) the curve pooled over operators, and per operator those of shapes measured as several; the
    plain trees (``AVERAGED_SEEDS`` ensembles averaged), the stacked trees with rows of two models or more,
    and with ``others`` (other GPUs' rows, cross_gpu.py) the cross-GPU trees."""
    rows = with_shapes(df)
    if rows.empty:
        return {}
    plain = replace(params, gemm_correction={})
    r = rows.assign(r=np.log(rows.time_s.to_numpy() / predict_gemm(rows, hardware, plain)))
    features = gemm_features(rows.M.to_numpy(), rows.N.to_numpy(), rows.K.to_numpy(), params.num_sms,
                             rows.operator.to_numpy())
    out = {**curve_data(r), "num_sms": int(params.num_sms), "tree_weight": TREE_WEIGHT,
           "trees": fit_trees(features, r.r.to_numpy(), FEATURE_NAMES, AVERAGED_SETTINGS, AVERAGED_SEEDS)}
    mean = out_of_fold_kernel_mean(r)
    if mean is not None:
        out["stacked_trees"] = fit_trees(np.hstack([features, mean[:, None]]), r.r.to_numpy(),
                                         STACKED_FEATURE_NAMES)
    if others:
        x, y = training_rows(list(others))
        out["cross_trees"] = fit_trees(np.vstack([with_sms(features, params.num_sms), x]),
                                       np.concatenate([r.r.to_numpy(), y]), CROSS_FEATURE_NAMES, CROSS_SETTINGS)
    share = 1.0 / (1 + ("stacked_trees" in out) + ("cross_trees" in out))   # an even mean of the parts
    for part in ("stacked", "cross"):
        if f"{part}_trees" in out:
            out[f"{part}_weight"] = share
    return out


def kernel_mean_at(correction: dict[str, Any], rows: pd.DataFrame) -> np.ndarray:
    """The kernel mean of a stored correction (its trees ignored) at each of ``rows`` (operator, N, K, M):
    a measured shape's own curve, else the mean of the others' (curve_bank.py), interpolated in M."""
    bank = ShapeCorrection({**correction, "trees": None, "stacked_trees": None, "tree_weight": 0.0})
    out = np.empty(len(rows))
    m = rows.M.to_numpy().astype(float)
    for (op, n, k), idx in rows.reset_index(drop=True).groupby(["operator", "N", "K"]).indices.items():
        out[idx] = np.interp(m[idx], bank.grid, bank.curve(int(n), int(k), op))
    return out


def out_of_fold_kernel_mean(r: pd.DataFrame) -> np.ndarray | None:
    """Per projection row of ``r`` (with_shapes rows, log ratio in column r), the kernel mean of the rows of
    the other models without any of its model's (N, K) shapes: what a model that was not measured gets from
    the rest. None when ``r`` holds fewer than two models."""
    rows = r.reset_index(drop=True)
    if rows.model.nunique() < 2:
        return None
    out = np.zeros(len(rows))
    shape = pd.MultiIndex.from_frame(rows[["N", "K"]])
    for model in rows.model.unique():
        own = (rows.model == model).to_numpy()
        rest = rows[~own & ~shape.isin(shape[own].unique())]
        if not rest.empty:
            out[own] = kernel_mean_at(curve_data(rest), rows[own])
    return out


def curve_data(r: pd.DataFrame) -> dict[str, Any]:
    """The kernel mean's part of a stored correction (no trees) from projection rows (``with_shapes``) with
    their log(measured / roofline) in column r."""
    grid, shapes, curves = _curves(r, ["N", "K"])
    ops = r.groupby(["N", "K"]).operator.unique()
    single = [str(ops[s][0]) if len(ops[s]) == 1 else "" for s in shapes]
    several = r[r.set_index(["N", "K"]).index.isin([s for s, o in zip(shapes, single) if not o])]
    op_curves = {}
    if not several.empty:
        _, index, per_op = _curves(several, ["operator", "N", "K"], grid)  # on every shape's grid
        op_curves = {f"{o},{n},{k}": c for (o, n, k), c in zip(index, per_op)}
    return {"grid_m": [int(m) for m in grid], "shapes": [[int(n), int(k)] for n, k in shapes], "curves": curves,
            "width_n": WIDTH_N, "width_k": WIDTH_K, "prior_weight": PRIOR_WEIGHT, "ops": single,
            "op_curves": op_curves, "op_width_n": OP_WIDTH_N, "op_width_k": OP_WIDTH_K, "op_weight": OP_WEIGHT,
            "op_prior_weight": OP_PRIOR_WEIGHT}


def fit_local(df: pd.DataFrame, hardware: HardwareSpec, params: CostParams) -> dict[str, list[list[float]]]:
    """Per operator and exact (N, K) of ``df``, keyed "op,N,K": [[M, median log(measured / params'
    prediction)], ...] ascending in M."""
    rows = with_shapes(df)
    if rows.empty:
        return {}
    base = replace(params, gemm_correction={**params.gemm_correction, "local": {}})
    d = np.log(rows.time_s.to_numpy() / predict_gemm(rows, hardware, base))
    out: dict[str, list[list[float]]] = {}
    for (op, n, k), g in rows.assign(d=d).groupby(["operator", "N", "K"]):
        med = g.groupby("M").d.median()
        out[f"{op},{n},{k}"] = [[int(m), round(float(x), 4)] for m, x in med.items()]
    return out


def loo_split(df: pd.DataFrame, held: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training projection rows, held-out projection rows): training excludes the model ``held`` and
    every row whose (N, K) is one of its shapes."""
    rows = with_shapes(df)
    test = rows[rows.model == held]
    shapes = pd.MultiIndex.from_frame(test[["N", "K"]].drop_duplicates())
    seen = pd.MultiIndex.from_frame(rows[["N", "K"]]).isin(shapes)
    return rows[(rows.model != held) & ~seen], test


def few_points(test: pd.DataFrame, points: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(measured sample, rest): per (N, K), about ``points`` token counts, half log-spaced and half evenly
    spaced over the shape's range; the rest are the other rows."""
    picked = []
    for _, g in test.groupby(["N", "K"]):
        ms = np.sort(g.M.unique())
        targets = np.concatenate([np.geomspace(ms[0], ms[-1], points - points // 2),
                                  np.linspace(ms[0], ms[-1], points // 2 + 2)[1:-1]])
        chosen = np.unique(ms[np.abs(ms[None, :] - targets[:, None]).argmin(1)])
        picked.append(g[g.M.isin(chosen)])
    sample = pd.concat(picked) if picked else test.iloc[:0]
    return sample, test.drop(sample.index)


@dataclass
class LooResult:
    """Held-out four-projection MAPE (fractions) of one model."""

    model: str
    rows: int
    train_rows: int
    plain: float      # plain roofline (one efficiency each, no tiles), fitted on the training rows
    roofline: float   # tile/wave roofline fitted on the training rows
    corrected: float  # the same plus the learned correction
    unstacked: float  # the learned correction without its stacked and cross-GPU trees (the blend alone)
    few: float        # plus a local correction from ``points`` token counts per shape (scored on the rest)
    few_rows: int     # rows ``few`` is scored on (the held-out rows minus the measured sample)


def loo_fold(df: pd.DataFrame, hardware: HardwareSpec, held: str, train_models: Sequence[str] | None = None,
             cross_gpu: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, CostParams]]:
    """One fold: (training rows, held-out rows, {"plain", "roofline", "corrected"} parameters fitted on the
    training rows); ``train_models``: train on these models only (default: every other one); ``cross_gpu``:
    cross-GPU trees over the other shipped GPUs' tables too, less the held-out model and its shapes (and
    only of ``train_models`` where given)."""
    train, test = loo_split(df, held)
    if train_models is not None:
        train = train[train.model.isin(train_models)]
    base = CostParams(num_sms=DEFAULT_NUM_SMS.get(hardware.name, 108))
    roof = fit_gemm(train, hardware, base)
    others = []
    if cross_gpu and is_gpu(hardware):
        shapes = pd.MultiIndex.from_frame(test[["N", "K"]].drop_duplicates())
        others = without(shipped_rows(hardware.name), held, shapes, train_models)
    corr = replace(roof, gemm_correction=fit_correction(train, hardware, roof, others))
    return train, test, {"plain": fit_baseline(train, hardware), "roofline": roof, "corrected": corr}


def unstacked(params: CostParams) -> CostParams:
    """``params`` with its correction's stacked and cross-GPU trees weighted 0: the blend alone."""
    return replace(params, gemm_correction={**params.gemm_correction, "stacked_weight": 0.0, "cross_weight": 0.0})


def loo_rows(df: pd.DataFrame, hardware: HardwareSpec, cross_gpu: bool = True, workers: int = 1
             ) -> pd.DataFrame:
    """Every held-out projection row with its predictions (columns pred_plain, pred_roofline, pred_corrected,
    and pred_unstacked: the correction without its stacked and cross-GPU trees), in model order; ``workers``
    as in ``loo``."""
    return pd.concat(per_held_out_model(partial(held_out_rows, df, hardware, cross_gpu=cross_gpu), df, workers))


def held_out_rows(df: pd.DataFrame, hardware: HardwareSpec, held: str, cross_gpu: bool = True) -> pd.DataFrame:
    """One fold of ``loo_rows``: the rows of model ``held`` with the predictions of fits on the others."""
    _, test, fits = loo_fold(df, hardware, held, cross_gpu=cross_gpu)
    fits["unstacked"] = unstacked(fits["corrected"])
    return test.assign(**{f"pred_{k}": predict_gemm(test, hardware, p) for k, p in fits.items()})


def loo(df: pd.DataFrame, hardware: HardwareSpec, points: int = 16, workers: int = 1, cross_gpu: bool = True
        ) -> list[LooResult]:
    """Leave-one-model-out over every model with projection rows in ``df``, in model order; ``workers`` > 1
    fits the folds in that many processes (each fold is fitted alone: the same results for any number);
    ``cross_gpu`` as in ``loo_fold``."""
    return per_held_out_model(partial(loo_result, df, hardware, points=points, cross_gpu=cross_gpu), df, workers)


def per_held_out_model(fold: Callable[[str], Any], df: pd.DataFrame, workers: int) -> list[Any]:
    """``fold(model)`` for every model with projection rows in ``df``, in model order; with ``workers`` > 1 in
    that many processes (each fold is fitted alone: the same results for any number)."""
    models = sorted(with_shapes(df).model.unique())
    if workers <= 1 or len(models) < 2:
        return [fold(held) for held in models]
    from sim.worker_pool import worker_pool  # (its pools only where asked for)

    with worker_pool(min(workers, len(models))) as pool:   # (stopped at once on Ctrl-C or an error)
        return list(pool.map(fold, models))


def loo_result(df: pd.DataFrame, hardware: HardwareSpec, held: str, points: int = 16, cross_gpu: bool = True
               ) -> LooResult:
    """One fold of ``loo``: the model ``held`` scored by fits on the others."""
    train, test, fits = loo_fold(df, hardware, held, cross_gpu=cross_gpu)
    t = test.time_s.to_numpy()
    corr = fits["corrected"]
    sample, rest = few_points(test, points)
    few = replace(corr, gemm_correction={**corr.gemm_correction, "local": fit_local(sample, hardware, corr)})
    return LooResult(held, len(test), len(train), *(mape(predict_gemm(test, hardware, p), t) for p in (
        fits["plain"], fits["roofline"], corr, unstacked(corr))),
                     mape(predict_gemm(rest, hardware, few), rest.time_s.to_numpy()), len(rest))
