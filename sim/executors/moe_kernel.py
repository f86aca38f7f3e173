"""The fused mixture-of-experts kernel against its measured timings: the fit of ``moe_tile_eff``.

vLLM runs a mixture-of-experts MLP as one Triton kernel per projection over every active expert's rows.
Its tiles reach less of the GPU than the library GEMMs the per-operator model is fitted on (it gathers
its rows by expert), and that is one number, ``EngineParams.moe_tile_eff``: the share of the tiles'
fitted compute efficiency the grouped kernel keeps. Fitted by least squares on log(model / measured)
over a table of the kernel's own timings (``sim/data/kernels/``, as vLLM's ``benchmark_moe.py`` measures
them; ``CostModelExecutor.moe_kernel_time`` prices the same thing). Decode-sized batches are bound by
reading the experts' weights and hardly move with it; prefill-sized ones are where it matters.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.executors.cost_model import DATA_DIR, CostModelExecutor
from sim.executors.engine_params import EngineParams
from sim.executors.roofline import CostParams
from sim.specs import HardwareSpec, ModelSpec

KERNEL_TABLE = DATA_DIR / "kernels" / "h100_fused_moe_mixtral_tp2.csv"
TABLE_MODEL, TABLE_HARDWARE, TABLE_TP = "mixtral-8x7b", "h100-80gb", 2   # what the shipped table measured
EFF_RANGE = (0.2, 1.5)   # the search interval (EngineParams' efficiencies are in (0, 1.5])


def load_table(path: str | Path = KERNEL_TABLE) -> tuple[np.ndarray, np.ndarray]:
    """(token counts, seconds) of a kernel table: columns ``tokens`` and ``time_us``."""
    df = pd.read_csv(path)
    return df["tokens"].to_numpy(dtype=np.int64), df["time_us"].to_numpy(dtype=float) * 1e-6


def table_executor(params: CostParams, engine: EngineParams, tile_eff: float) -> CostModelExecutor:
    """The executor of the shipped table's setting (Mixtral-8x7B, H100, TP 2) with ``moe_tile_eff = tile_eff``."""
    hw = HardwareSpec.from_name(TABLE_HARDWARE).model_copy(update={"tensor_parallel": TABLE_TP})
    return CostModelExecutor(ModelSpec.from_name(TABLE_MODEL), hw, params,
                             engine=replace(engine, moe_tile_eff=tile_eff))


def log_errors(params: CostParams, engine: EngineParams, tile_eff: float, tokens: np.ndarray,
               seconds: np.ndarray) -> np.ndarray:
    """log(model / measured) per row of the table."""
    exe = table_executor(params, engine, tile_eff)
    return np.log([exe.moe_kernel_time(int(t)) for t in tokens]) - np.log(seconds)


def fit_tile_eff(params: CostParams, engine: EngineParams, tokens: np.ndarray, seconds: np.ndarray,
                 tol: float = 1e-4) -> float:
    """The ``moe_tile_eff`` in EFF_RANGE that minimises the sum of squared log errors (golden-section
    search: the error is unimodal in it, one roofline term growing as the efficiency falls)."""
    def loss(x: float) -> float:
        return float(np.sum(log_errors(params, engine, x, tokens, seconds) ** 2))

    lo, hi = EFF_RANGE
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tol:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2
