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
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError
from sim.executors.cost_model import DATA_DIR, CostModelExecutor
from sim.executors.engine_params import EngineParams
from sim.executors.roofline import CostParams
from sim.specs import HardwareSpec, ModelSpec

KERNEL_TABLE = DATA_DIR / "kernels" / "h100_fused_moe_mixtral_tp2.csv"
TABLE_MODEL, TABLE_HARDWARE, TABLE_TP = "mixtral-8x7b", "h100-80gb", 2   # what the shipped table measured
EFF_RANGE = (0.2, 1.5)   # the search interval (EngineParams' efficiencies are in (0, 1.5])
# a line of benchmark_moe.py's output: "Batch size: 16, Kernel time: 471.49 us" (a config may sit between)
_BENCH_LINE = re.compile(r"batch size:\s*(\d+)\b.*?kernel time:\s*([0-9.eE+-]+)\s*us", re.IGNORECASE)


def load_table(path: str | Path = KERNEL_TABLE) -> tuple[np.ndarray, np.ndarray]:
    """(token counts, seconds) of a kernel table: a CSV with columns ``tokens`` and ``time_us``, or the text
    vLLM's ``benchmarks/kernels/benchmark_moe.py`` prints (a "Batch size: B ... Kernel time: T us" per batch
    size, on one line or two). A file with neither is an error naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise KvsimError(str(path), f"cannot read: {e}") from None
    found = _BENCH_LINE.findall(" ".join(text.splitlines()).replace("Batch size", "\nBatch size"))
    if found:
        tokens, micros = zip(*((int(b), float(t)) for b, t in found))
    else:
        try:
            df = pd.read_csv(path)
            tokens, micros = df["tokens"].tolist(), df["time_us"].tolist()
        except (KeyError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
            raise KvsimError(str(path), "not a kernel table: expected columns tokens,time_us or "
                                        "benchmark_moe.py's 'Batch size: B, Kernel time: T us' lines") from None
    t, sec = np.asarray(tokens, dtype=np.int64), np.asarray(micros, dtype=float) * 1e-6
    if len(t) == 0 or (t < 1).any() or not (np.isfinite(sec) & (sec > 0)).all():
        raise KvsimError(str(path), "kernel table: token counts must be >= 1 and times positive")
    return t, sec


def table_executor(params: CostParams, engine: EngineParams, tile_eff: float, model: str | ModelSpec = TABLE_MODEL,
                   hardware: str = TABLE_HARDWARE, tensor_parallel: int = TABLE_TP) -> CostModelExecutor:
    """The executor of a table's setting (by default the shipped one's: Mixtral-8x7B, H100, TP 2) with
    ``moe_tile_eff = tile_eff``."""
    spec = model if isinstance(model, ModelSpec) else ModelSpec.from_name(model)
    hw = HardwareSpec.from_name(hardware).model_copy(update={"tensor_parallel": tensor_parallel})
    return CostModelExecutor(spec, hw, params, engine=replace(engine, moe_tile_eff=tile_eff))


def log_errors(params: CostParams, engine: EngineParams, tile_eff: float, tokens: np.ndarray,
               seconds: np.ndarray, **setting) -> np.ndarray:
    """log(model / measured) per row of the table (``setting``: ``table_executor``'s model, hardware and
    tensor_parallel)."""
    exe = table_executor(params, engine, tile_eff, **setting)
    return np.log([exe.moe_kernel_time(int(t)) for t in tokens]) - np.log(seconds)


def fit_tile_eff(params: CostParams, engine: EngineParams, tokens: np.ndarray, seconds: np.ndarray,
                 tol: float = 1e-4, **setting) -> float:
    """The ``moe_tile_eff`` in EFF_RANGE that minimises the sum of squared log errors (golden-section
    search: the error is unimodal in it, one roofline term growing as the efficiency falls)."""
    def loss(x: float) -> float:
        return float(np.sum(log_errors(params, engine, x, tokens, seconds, **setting) ** 2))

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
