"""Predict measured operator times, fit the cost parameters of one piece of hardware, and score them.

Prediction uses the same formulas as the executor (roofline.py, cost_model.py). Fitting minimises the
mean absolute percentage error (MAPE) over the given rows with Nelder-Mead in log space:

1. GEMMs (the four projections): memory efficiency, kernel latency, the smooth-max exponent, the cost
   of a partial last wave (``wave_quant``) and one compute efficiency per candidate tile shape (tile and
   wave quantization, roofline.py); then the learned per-shape correction over it (opmodel.py).
2. Elementwise operators (norms, rope, activation, add): one memory efficiency each.
   All-reduce rows (Vidur's *_all_reduce.csv): kept as a measured table per TP degree.
3. Profile rows from ``kvsim profile``: attention efficiencies (compute, new-token traffic, cached-KV
   reads) and per-sequence latencies (decode, prefill) on ``attention`` rows, then on ``step`` rows the per-step overhead
   (and the elementwise efficiency, when no elementwise rows were given).

The baseline (``fit_baseline``) is the plain roofline of the brief: one compute efficiency, one memory
efficiency and one fixed latency, fitted the same way, with no tiles and a hard max.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from sim.executors.cost_model import CostModelExecutor
from sim.executors.fit import nelder_mead
from sim.executors.measurements import ELEMENTWISE_OPS, LINEAR_OPS
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams, allreduce_time, gemm_time
from sim.sched.plan import ScheduledRequest, StepPlan
from sim.specs import HardwareSpec, ModelSpec

# candidate GEMM tiles (rows x columns of the output), as CUTLASS/cuBLAS kernels use on A100 and H100
TILES = [(64, 64), (128, 128), (128, 256), (256, 128)]


def gemm_shapes(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) per row for the projection operators (per TP shard); NaN elsewhere."""
    tp = df.tp.to_numpy()
    hd = df.head_dim.to_numpy()
    q = np.ceil(df.heads.to_numpy() / tp) * hd
    kv = np.ceil(df.kv_heads.to_numpy() / tp) * hd
    inter = (df.inter.to_numpy() // tp).astype(float)
    h = df.hidden.to_numpy().astype(float)
    up = inter * np.where(df.gated.to_numpy(), 2, 1)
    op = df.operator.to_numpy()
    k = np.select([op == "attn_pre_proj", op == "attn_post_proj", op == "mlp_up_proj", op == "mlp_down_proj"],
                  [h, q, h, inter], np.nan)
    n = np.select([op == "attn_pre_proj", op == "attn_post_proj", op == "mlp_up_proj", op == "mlp_down_proj"],
                  [q + 2 * kv, h, up, h], np.nan)
    return k, n


def elementwise_bytes(df: pd.DataFrame) -> np.ndarray:
    """Bytes each elementwise operator reads and writes (NaN for other operators)."""
    tp = df.tp.to_numpy()
    t = df.num_tokens.to_numpy().astype(float)
    b = df.dtype_bytes.to_numpy()
    h = df.hidden.to_numpy().astype(float)
    hd = df.head_dim.to_numpy()
    q = np.ceil(df.heads.to_numpy() / tp) * hd
    kv = np.ceil(df.kv_heads.to_numpy() / tp) * hd
    inter = (df.inter.to_numpy() // tp).astype(float)
    op = df.operator.to_numpy()
    per_token = np.select(
        [np.isin(op, ["input_layernorm", "post_attention_layernorm"]), op == "attn_rope", op == "mlp_act",
         op == "add"],
        [2 * h, 2 * (q + kv), np.where(df.gated.to_numpy(), 3, 2) * inter, 3 * h], np.nan)
    return b * t * per_token


def _model_of(row: pd.Series) -> ModelSpec:
    return ModelSpec(name=str(row.model), num_layers=1, hidden_size=int(row.hidden), num_heads=int(row.heads),
                     num_kv_heads=int(row.kv_heads), head_dim=int(row.head_dim), intermediate_size=int(row.inter),
                     vocab_size=int(row.vocab), max_model_len=1 << 20, gated_mlp=bool(row.gated))


def _plan_of(row: pd.Series) -> StepPlan:
    seqs = max(int(row.batch_size), 1)
    new = max(int(row.num_tokens) // seqs, 1)
    return StepPlan(scheduled=[ScheduledRequest(i, new, int(row.context_len), []) for i in range(seqs)])


def predict(df: pd.DataFrame, hardware: HardwareSpec, params: CostParams, layers: dict[str, int] | None = None
            ) -> np.ndarray:
    """Predicted seconds for every row of a measurement table (see measurements.py).

    ``attention`` rows are one layer's attention; ``step`` rows are a whole step of the model's preset
    (``layers`` overrides its layer count, for profiles that ran fewer layers).
    """
    out = np.full(len(df), np.nan)
    op = df.operator.to_numpy()
    lin = np.isin(op, LINEAR_OPS)
    if lin.any():
        k, n = gemm_shapes(df[lin])
        out[lin] = gemm_time(df.num_tokens.to_numpy()[lin], n, k, hardware.peak_flops, hardware.hbm_bandwidth,
                             df.dtype_bytes.to_numpy()[lin], params, op[lin])
    elem = np.isin(op, ELEMENTWISE_OPS)
    if elem.any():
        eff = np.array([params.elementwise_effs.get(o, params.elementwise_eff) for o in op[elem]])
        out[elem] = elementwise_bytes(df[elem]) / (hardware.hbm_bandwidth * eff) + params.elementwise_latency_s
    ar = op == "all_reduce"
    for tp in np.unique(df.tp.to_numpy()[ar]):
        sel = ar & (df.tp.to_numpy() == tp)
        out[sel] = allreduce_time(df.num_tokens.to_numpy()[sel], int(tp), hardware.interconnect_bandwidth,
                                  hardware.interconnect_latency_s, params)
    rest = np.flatnonzero(~lin & ~elem & ~ar)
    for i in rest:
        row = df.iloc[i]
        if row.operator == "attention":
            exe = CostModelExecutor(_model_of(row), hardware.model_copy(update={"tensor_parallel": 1}), params)
            out[i] = exe.execute(_plan_of(row)).breakdown["attention"]
        elif row.operator == "step":
            spec = ModelSpec.from_name(str(row.model))
            if layers and row.model in layers:
                spec = spec.model_copy(update={"num_layers": layers[row.model]})
            exe = CostModelExecutor(spec, hardware.model_copy(update={"tensor_parallel": 1}), params)
            out[i] = exe.execute(_plan_of(row)).duration_s
    return out


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    """Mean of |predicted - measured| / measured (a fraction)."""
    return float(np.mean(np.abs(pred - meas) / meas)) if len(meas) else float("nan")


def _gemm_objective(df: pd.DataFrame, hardware: HardwareSpec) -> Callable[[CostParams], float]:
    k, n = gemm_shapes(df)
    m, b, t, op = df.num_tokens.to_numpy(), df.dtype_bytes.to_numpy(), df.time_s.to_numpy(), df.operator.to_numpy()

    def obj(p: CostParams) -> float:
        return mape(gemm_time(m, n, k, hardware.peak_flops, hardware.hbm_bandwidth, b, p, op), t)
    return obj


def _minimise(obj: Callable[[CostParams], float], to_params: Callable[[np.ndarray], CostParams | None],
              x0: list[float], rounds: int = 2, iters: int = 1500) -> CostParams:
    """Nelder-Mead over a log-parameter vector; ``to_params`` returns None for an infeasible point."""
    def f(v: np.ndarray) -> float:
        p = to_params(v)
        return 1e9 if p is None else obj(p)

    x = np.log(x0)
    for r in range(rounds):
        x, _ = nelder_mead(f, x, step=0.3 / (r + 1), iters=iters)
    out = to_params(x)
    assert out is not None
    return out


def fit_baseline(df: pd.DataFrame, hardware: HardwareSpec) -> CostParams:
    """The plain roofline: compute_eff, memory_eff and one latency, fitted on the projection rows.

    Elementwise operators get the same memory efficiency and latency (one roofline for everything)."""
    rows = df[df.operator.isin(LINEAR_OPS)]
    base = CostParams(num_sms=DEFAULT_NUM_SMS.get(hardware.name, 108))
    if rows.empty:
        return base

    def to_params(v: np.ndarray) -> CostParams | None:
        ce, me, lat = np.exp(v)
        if ce > 1.5 or me > 1.5:
            return None
        return replace(base, compute_eff=ce, memory_eff=me, kernel_latency_s=lat, elementwise_eff=me,
                       elementwise_latency_s=lat)
    return _minimise(_gemm_objective(rows, hardware), to_params, [0.7, 0.8, 5e-6])


def fit_gemm(df: pd.DataFrame, hardware: HardwareSpec, base: CostParams) -> CostParams:
    """The shape-aware GEMM model: memory efficiency, latency, smooth-max exponent, partial-wave cost and
    one efficiency per tile."""
    rows = df[df.operator.isin(LINEAR_OPS)]
    if rows.empty:
        return base
    tiles = TILES if base.num_sms > 1 else []

    def to_params(v: np.ndarray) -> CostParams | None:
        e = np.exp(v)
        if e[0] > 1.5 or e[2] < 1 or e[3] > 1 or (e[4:] > 1.5).any():
            return None
        return replace(base, memory_eff=e[0], kernel_latency_s=e[1], smooth_p=e[2],
                       wave_quant=float(e[3]) if tiles else 1.0,
                       compute_eff=float(e[4:].max()) if tiles else e[4],
                       tiles=[[tm, tn, float(x)] for (tm, tn), x in zip(tiles, e[4:])])
    return _minimise(_gemm_objective(rows, hardware), to_params,
                     [0.85, 5e-6, 3.0, 0.5] + [0.7] * max(len(tiles), 1))


def allreduce_table(df: pd.DataFrame, points: int = 48) -> dict[str, list[list[float]]]:
    """Measured all-reduce times per worker count, thinned to about ``points`` sizes (log-spaced)."""
    out = {}
    for tp, g in df[df.operator == "all_reduce"].groupby("tp"):
        g = g.sort_values("num_tokens")
        idx = np.unique(np.round(np.geomspace(1, len(g), points)).astype(int) - 1)
        out[str(int(tp))] = [[float(s), float(t)] for s, t in zip(g.num_tokens.to_numpy()[idx],
                                                                   g.time_s.to_numpy()[idx])]
    return out


def fit_params(df: pd.DataFrame, hardware: HardwareSpec, cross_gpu: bool = True) -> CostParams:
    """Fit every parameter the given rows inform; the others keep their defaults. ``cross_gpu``: on a GPU, the
    GEMM correction's cross-GPU trees learn from the other shipped GPUs' tables too (cross_gpu.py)."""
    from sim.executors.cross_gpu import is_gpu, shipped_rows  # both build on this module's fitters
    from sim.executors.opmodel import fit_correction

    params = fit_gemm(df, hardware, CostParams(num_sms=DEFAULT_NUM_SMS.get(hardware.name, 108)))
    others = shipped_rows(hardware.name) if cross_gpu and is_gpu(hardware) else []
    params.gemm_correction = fit_correction(df, hardware, params, others)
    elem = df[df.operator.isin(ELEMENTWISE_OPS)]
    if not elem.empty:
        grid = np.linspace(0.05, 1.2, 116)
        best: tuple[float, float, dict[str, float]] = (np.inf, 0.0, {})
        for lat in np.linspace(0.0, 2e-5, 81):  # 0.25 us steps
            total, effs = 0.0, {}
            for op, rows in elem.groupby("operator"):
                nbytes, t = elementwise_bytes(rows), rows.time_s.to_numpy()
                errs = [mape(nbytes / (hardware.hbm_bandwidth * e) + lat, t) for e in grid]
                effs[str(op)] = float(grid[int(np.argmin(errs))])
                total += min(errs) * len(rows)
            if total < best[0]:
                best = (total, float(lat), effs)
        params.elementwise_latency_s, params.elementwise_effs = best[1], best[2]
        params.elementwise_eff = float(np.median(list(best[2].values())))
    if (df.operator == "all_reduce").any():
        params.allreduce_table = allreduce_table(df)
    attn = df[df.operator == "attention"]
    if not attn.empty:
        t = attn.time_s.to_numpy()

        def attn_params(v: np.ndarray) -> CostParams | None:
            ce, me, kv, seq, pre = np.exp(v)
            if ce > 1.5 or me > 1.5 or kv > 1.5:
                return None
            return replace(params, attn_compute_eff=ce, attn_memory_eff=me, attn_kv_read_eff=kv,
                           attn_seq_latency_s=seq, attn_prefill_seq_latency_s=pre)

        def attn_obj(p: CostParams) -> float:
            return mape(predict(attn, hardware, p), t)
        starts = [[ce, me, kv, seq, seq] for ce in (0.5, 0.02) for me in (0.7, 0.05) for kv in (0.7, 0.01)
                  for seq in (1e-6, 1e-4)]
        best = min(starts, key=lambda x: attn_obj(attn_params(np.log(x))))
        params = _minimise(attn_obj, attn_params, best, rounds=3, iters=300)
    step = df[df.operator == "step"]
    if not step.empty:
        t = step.time_s.to_numpy()
        names = ["step_overhead_s"] if not elem.empty else ["step_overhead_s", "elementwise_eff"]

        def step_params(v: np.ndarray) -> CostParams | None:
            vals = dict(zip(names, np.exp(v).tolist()))
            return None if vals.get("elementwise_eff", 1.0) > 1.5 else replace(params, **vals)
        x0 = [max(float(np.median(t - predict(step, hardware, replace(params, step_overhead_s=0.0)))), 1e-5)]
        params = _minimise(lambda p: mape(predict(step, hardware, p), t), step_params,
                           x0 + [params.elementwise_eff] * (len(names) - 1), rounds=2, iters=200)
    return params


def score(df: pd.DataFrame, hardware: HardwareSpec, params: CostParams) -> dict[str, float]:
    """MAPE per operator, over the projections ("linear"), per layer ("layer"), and over all rows."""
    pred = predict(df, hardware, params)
    t = df.time_s.to_numpy()
    out = {op: mape(pred[(df.operator == op).to_numpy()], t[(df.operator == op).to_numpy()])
           for op in df.operator.unique()}
    lin = df.operator.isin(LINEAR_OPS).to_numpy()
    if lin.any():
        out["linear"] = mape(pred[lin], t[lin])
    layer_ops = df.operator.isin(LINEAR_OPS + ELEMENTWISE_OPS).to_numpy()
    if layer_ops.any():
        keys = ["source", "model", "tp", "kind", "batch_size", "num_tokens", "context_len"]
        g = df[layer_ops].assign(pred=pred[layer_ops]).groupby(keys)[["time_s", "pred"]].sum()
        out["layer"] = mape(g.pred.to_numpy(), g.time_s.to_numpy())
    out["overall"] = mape(pred, t)
    return out
