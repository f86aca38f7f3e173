"""A learned correction on top of the GEMM roofline: log(measured / roofline) as a function of (M, N, K)
and of the operator the GEMM computes.

The stored form (``CostParams.gemm_correction``, plain JSON) is

    {"grid_m": [M_1 < M_2 < ...],               token counts the curves are sampled at
     "shapes": [[N, K], ...],                   the (N, K) GEMM shapes measured in training
     "curves": [[r(M_1), r(M_2), ...], ...],    log(measured / roofline) of each shape on grid_m, pooled over
                                                every operator measured with that shape
     "width_n": w_n, "width_k": w_k,            kernel widths in ln N and ln K
     "prior_weight": w_0,                       pulls the correction to 0 far from every training shape
     "ops": ["mlp_up_proj", "", ...],           per shape, the operator it was measured as ("": several)
     "op_curves": {"OP,N,K": [r(M_1), ...]},    per operator, the curves of shapes measured as several
     "op_width_n": .., "op_width_k": ..,        the kernel for a GEMM of a known operator: widths,
     "op_weight": w_op, "op_prior_weight": ..,  weight of a curve measured as another operator, prior weight
     "trees": {...}, "tree_weight": w_t,        boosted trees over gemm_features (tree_ensemble.py) and
     "num_sms": S,                              their weight in a shape that was not measured; the SM count
     "stacked_trees": {...},                    boosted trees over gemm_features and the kernel mean
     "stacked_weight": w_s,                     (STACKED_FEATURE_NAMES), their weight for a projection
     "cross_trees": {...},                      boosted trees over gemm_features and the SM count, fitted on
     "cross_weight": w_c,                       other GPUs' rows too (CROSS_FEATURE_NAMES, cross_gpu.py)
     "local": {"N,K": [[M, delta], ...],        a new model's own measured points (optional): any operator,
               "OP,N,K": [[M, delta], ...]}}     or operator OP only (taking precedence)

Every key from "ops" on is optional. Two curve banks (curve_bank.py) generalise the curves to a shape that
was not measured, by a kernel-weighted mean in (ln N, ln K):

- a GEMM of an operator named in "ops" (the four projections): the per-operator curves ("ops" labels the
  pooled curves of single-operator shapes; "op_curves" holds the others), the "op_*" kernel, and curves
  measured as another operator weighted by w_op. The operator matters beyond the shape: in Vidur's tables
  the same (N, K) timed as a QKV projection and as an MLP up projection differs by 6-9% (Qwen-72B, H100);
- any other GEMM (the LM head, a router) or a correction without "ops": the pooled curves, operator-blind.

With "trees", a shape that was not measured takes (1 - w_t) x that mean + w_t x the trees' prediction on
the grid: the trees read the tile, wave and alignment features of (M, N, K) and the operator, which the
kernel mean, knowing only how far shapes are apart, cannot (together 5.46% -> 4.76% on A100 and 6.51% ->
5.44% on H100, leave one model out, README); for a GEMM of no projection, their mean over the four. With
"stacked_trees" and "cross_trees", a projection's unseen curve is (1 - w_s - w_c) x that blend + w_s x the
stacked trees + w_c x the cross-GPU trees (opmodel.py: an even third each). The stacked trees read the kernel
mean at each token count beside the features, and so learn where the neighbours' curves hold and where they
mislead (fitted on the training rows' out-of-fold kernel mean); the cross-GPU trees learned from the other
GPUs' tables too, against each GPU's own roofline, with the SM count as a column. A GEMM of no projection
keeps the blend. (The plain trees, "trees", may be several ensembles stored as their mean: tree_ensemble.py.)
A shape measured in training as the same operator takes its own curve instead: the correction reproduces
what was measured and generalises only to what it has not seen. Plus, when ``local`` holds the exact shape, its deltas at M: interpolated linearly in ln M among the local points in the same block of 64
token counts as M (ceil(M / 64) equal), or else of 128, or else of 256 (the tile heights: a GEMM's time
steps where M crosses a tile boundary, so a point across one says little about M), or else among all of
them; flat beyond the points used. The GEMM time is ``roofline x exp(r(M))``.

Beyond the grid's last token count M_g (4,096 on H100, 32,768 on A100), with trees, a curve goes on as
r(M) = r(M_g) + w_t x (T(M) - T(M_g)), T the trees' prediction (for a shape that was not measured this is
its blend with the kernel mean held flat), at token counts 2^(1/32) apart up to 2^20; without trees it stays
flat. Fitted on token counts up to 2,048 and scored above (scripts/beyond_grid.py): H100 6.27% flat, 4.93%
carried on, on shapes measured below the cut, 5.24% and 4.24% on held-out models; A100 4.38% / 3.99% and
4.54% / 4.34%; Llama-3-8B's rows above A100's other tables' 4,096 tokens, held out: 5.15% / 4.23%.

Invariants: a curve is computed once per (operator, N, K) (numpy, about 50 us for a measured shape; for an
unseen projection, through the plain, stacked and cross-GPU trees on a grid of 259-451 token counts, and for
a GEMM of no projection, through the plain trees once per operator, the README gives the times)
and cached, its part beyond the grid likewise when a GEMM first reaches it; afterwards one lookup costs a
bisection and a linear interpolation (about 1 us). An empty dict is no correction (factor
1). Without the "op_*" keys every GEMM is priced operator-blind, as before they existed.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from typing import Any

import numpy as np

from sim.executors.curve_bank import CurveBank
from sim.executors.gemm_features import CROSS_FEATURE_NAMES, FEATURE_NAMES, gemm_features, with_sms
from sim.executors.measurements import LINEAR_OPS
from sim.executors.tree_ensemble import TreeEnsemble

# id(stored dict) -> (the dict, its evaluator), the most recently used last; holding the dict keeps its id
# unique while cached, and at most _MAX_EVALUATORS are kept (a sweep loads one calibration per run)
_EVALUATORS: OrderedDict[int, tuple[dict[str, Any], ShapeCorrection]] = OrderedDict()
_MAX_EVALUATORS = 32
# the stacked trees' columns: the GEMM features, then the kernel mean's log ratio at the GEMM
STACKED_FEATURE_NAMES = [*FEATURE_NAMES, "kernel_mean"]
# block sizes (token counts) the local points are grouped by, smallest first: the GEMM tile heights
LOCAL_BLOCKS = (64, 128, 256)
# beyond the stored grid, the token counts the trees carry a curve on at: 32 a doubling, up to 2^20 tokens
EXTEND_RATIO = 2.0 ** (1 / 32)
EXTEND_TO = 1 << 20


class ShapeCorrection:
    """Evaluates a stored correction (the module docstring's formulas), caching one curve per (op, N, K)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.grid = [float(m) for m in data.get("grid_m", [])]
        shapes = [(int(n), int(k)) for n, k in data.get("shapes", [])]
        curves = data.get("curves", [])
        for name, c in [*(("curves", c) for c in curves), *data.get("op_curves", {}).items()]:
            if len(c) != len(self.grid):
                raise ValueError(f"{name}: a curve of {len(c)} points on a grid of {len(self.grid)} token counts")
        if len(curves) != len(shapes):
            raise ValueError(f"{len(curves)} curves for {len(shapes)} shapes")
        self.blind = CurveBank(len(self.grid), [("", n, k) for n, k in shapes], curves,
                               float(data.get("width_n", 0.2)), float(data.get("width_k", 0.4)),
                               float(data.get("prior_weight", 0.3)))
        self.by_op: CurveBank | None = None
        self.op_names: set[str] = set()
        ops = [str(o) for o in data.get("ops", [])]
        if ops and "op_width_n" in data:
            labels = [(o, n, k) for o, (n, k) in zip(ops, shapes) if o]
            op_curves = [c for o, c in zip(ops, curves) if o]
            for key, c in data.get("op_curves", {}).items():
                o, n, k = key.split(",")
                labels.append((o, int(n), int(k)))
                op_curves.append(c)
            self.op_names = {o for o, _, _ in labels}
            self.by_op = CurveBank(len(self.grid), labels, op_curves, float(data["op_width_n"]),
                                   float(data["op_width_k"]), float(data["op_prior_weight"]),
                                   float(data["op_weight"]))
        self.trees = TreeEnsemble(data["trees"]) if data.get("trees") else None
        if self.trees is not None and data["trees"]["features"] != FEATURE_NAMES[:self.trees.n_features]:
            raise ValueError("trees: their features are not gemm_features.FEATURE_NAMES (or its first ones): "
                             "refit the calibration")
        self.tree_weight = float(data.get("tree_weight", 0.0))
        if data.get("stacked_trees") and data["stacked_trees"]["features"] != STACKED_FEATURE_NAMES:
            raise ValueError("stacked_trees: their features are not gemm_features.FEATURE_NAMES and the kernel "
                             "mean: refit the calibration")
        self.stacked = TreeEnsemble(data["stacked_trees"]) if data.get("stacked_trees") else None
        self.stacked_weight = float(data.get("stacked_weight", 0.0)) if self.stacked is not None else 0.0
        if data.get("cross_trees") and data["cross_trees"]["features"] != CROSS_FEATURE_NAMES:
            raise ValueError("cross_trees: their features are not gemm_features.FEATURE_NAMES and the SM count: "
                             "refit the calibration")
        self.cross = TreeEnsemble(data["cross_trees"]) if data.get("cross_trees") else None
        self.cross_weight = float(data.get("cross_weight", 0.0)) if self.cross is not None else 0.0
        # beyond the grid's last token count, where the trees carry the curves on (empty without trees)
        self.beyond = ([self.grid[-1], *extension(self.grid[-1])]
                       if self.grid and self.trees is not None and self.tree_weight > 0.0 else [])
        self._beyond: dict[tuple[str, int, int], list[float]] = {}  # (op or "", n, k) -> curve on beyond
        self.num_sms = int(data.get("num_sms", 108))
        self._curves: dict[tuple[str, int, int], list[float]] = {}  # (op or "", n, k) -> curve on grid
        self.local: dict[tuple[str, int, int], LocalPoints] = {}
        for key, pts in data.get("local", {}).items():
            *op, n, k = key.split(",")
            self.local[(op[0] if op else "", int(n), int(k))] = LocalPoints(pts)

    def curve(self, n: int, k: int, op: str | None = None) -> list[float]:
        """r on ``grid`` for operator ``op`` (None: unknown) and shape (n, k), without the local points."""
        key = (op or "", int(n), int(k))
        hit = self._curves.get(key)
        if hit is None:
            hit = self._curves[key] = self._build_curve(*key) if self.grid else []
        return hit

    def curve_beyond(self, n: int, k: int, op: str | None = None) -> list[float]:
        """r on ``beyond`` for operator ``op`` and shape (n, k): the curve's last value plus the tree weight
        times the trees' change from the grid's last token count (built on first use, then cached)."""
        key = (op or "", int(n), int(k))
        hit = self._beyond.get(key)
        if hit is None:
            t = self._tree_curve(*key, self.beyond)
            hit = self._beyond[key] = (self.curve(n, k, op)[-1] + self.tree_weight * (t - t[0])).tolist()
        return hit

    def _build_curve(self, op: str, n: int, k: int) -> list[float]:
        if op and self.by_op is not None and op in self.op_names:
            bank, name = self.by_op, op
        else:
            bank, name = self.blind, ""
        if self.trees is None or self.tree_weight <= 0.0 or bank.owns(n, k, name):
            return bank.curve(n, k, name)
        w = self.tree_weight
        mean = np.asarray(bank.curve(n, k, name))
        blend = (1.0 - w) * mean + w * self._tree_curve(op, n, k, self.grid)
        s, c = self.stacked_weight, self.cross_weight
        if s + c <= 0.0 or op not in LINEAR_OPS:
            return blend.tolist()
        features = gemm_features(np.asarray(self.grid), n, k, self.num_sms, op)
        out = (1.0 - s - c) * blend
        if s > 0.0:
            out += s * self.stacked.predict(np.hstack([features, mean[:, None]]))
        if c > 0.0:
            out += c * self.cross.predict(with_sms(features, self.num_sms))
        return out.tolist()

    def _tree_curve(self, op: str, n: int, k: int, ms: list[float]) -> np.ndarray:
        """The trees at token counts ``ms`` for (op, n, k); for a GEMM of no projection (or one the trees have
        no column for), their mean over the four projections."""
        assert self.trees is not None
        used = self.trees.n_features
        m = np.asarray(ms, dtype=float)
        if op in LINEAR_OPS or used < len(FEATURE_NAMES):   # (an older ensemble reads no operator columns)
            return self.trees.predict(gemm_features(m, n, k, self.num_sms, op or None)[:, :used])
        x = gemm_features(m, n, k, self.num_sms, np.array(LINEAR_OPS, dtype=object)[:, None])
        return self.trees.predict(x).reshape(len(LINEAR_OPS), len(m)).mean(axis=0)

    def local_points(self, n: int, k: int, op: str | None = None) -> LocalPoints | None:
        """The local points of (op, n, k), else those of (n, k) for any operator, else None."""
        return self.local.get((op or "", int(n), int(k))) or self.local.get(("", int(n), int(k)))

    def log_ratio(self, m: float, n: int, k: int, op: str | None = None) -> float:
        """r(M) for one GEMM: the curve at m, plus the local points of (op, n, k) if any."""
        r = 0.0
        if self.beyond and m > self.beyond[0]:
            r = _lerp(self.beyond, self.curve_beyond(n, k, op), float(m))
        elif self.grid:
            r = _lerp(self.grid, self.curve(n, k, op), float(m))
        pts = self.local_points(n, k, op)
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


def extension(last: float) -> list[float]:
    """Token counts beyond a grid ending at ``last``: ``EXTEND_RATIO`` apart (rounded to whole tokens), up to
    ``EXTEND_TO``."""
    steps = math.floor(math.log(EXTEND_TO / last) / math.log(EXTEND_RATIO)) if last < EXTEND_TO else 0
    ms = {float(round(last * EXTEND_RATIO ** j)) for j in range(1, steps + 1)} | {float(EXTEND_TO)}
    return sorted(m for m in ms if m > last)


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


def check(data: dict[str, Any]) -> None:
    """Build the evaluator of a stored correction now, so that a malformed one fails where it is read
    (ValueError, KeyError, TypeError, IndexError or AttributeError) rather than at its first GEMM."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a mapping, got {type(data).__name__}")
    if data:
        evaluator(data)


def factor_scalar(data: dict[str, Any], m: float, n: int, k: int, op: str | None = None) -> float:
    """exp(r(M)) for one GEMM of operator ``op`` (None: unknown); 1 when ``data`` is empty."""
    return math.exp(evaluator(data).log_ratio(m, n, k, op)) if data else 1.0


def factor(data: dict[str, Any], m: Any, n: Any, k: Any, op: Any = None) -> Any:
    """exp(r(M)) elementwise over broadcast arrays m, n, k and operator names ``op`` (None: unknown; a name
    or an array of names), one curve per distinct (op, n, k)."""
    if not data:
        return 1.0
    ev = evaluator(data)
    ops = np.asarray("" if op is None else op, dtype=object)
    m_b, n_b, k_b, o_b = np.broadcast_arrays(np.asarray(m, dtype=float), np.asarray(n), np.asarray(k), ops)
    out = np.zeros(m_b.shape)
    names, codes = np.unique(o_b.ravel().astype(str), return_inverse=True)
    keys = np.stack([codes.reshape(-1), n_b.ravel(), k_b.ravel()], 1).astype(np.int64)
    flat = out.reshape(-1)
    mf = m_b.ravel()
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for j, (c_j, n_j, k_j) in enumerate(uniq.tolist()):
        sel = inv == j
        o_j = str(names[c_j]) or None
        m_j = mf[sel]
        r = np.interp(m_j, ev.grid, ev.curve(n_j, k_j, o_j)) if ev.grid else np.zeros(len(m_j))
        if ev.beyond and m_j.max() > ev.beyond[0]:
            hi = m_j > ev.beyond[0]
            r[hi] = np.interp(m_j[hi], ev.beyond, ev.curve_beyond(n_j, k_j, o_j))
        pts = ev.local_points(n_j, k_j, o_j)
        if pts is not None:
            ms, back = np.unique(mf[sel], return_inverse=True)
            r = r + np.array([pts.delta(x) for x in ms.tolist()])[back.reshape(-1)]
        flat[sel] = r
    return np.exp(out) if out.ndim else float(np.exp(out))
