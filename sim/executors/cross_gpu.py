"""Other GPUs' measured projections as training rows for the GEMM correction's cross-GPU trees (opmodel.py).

A GPU's tables teach the trees how cuBLAS's staircase moves with a shape; another GPU's tables of other
models add shapes this GPU was never measured at. Each GPU's rows are priced against its own tile/wave
roofline, fitted on those rows (``calibrate.fit_gemm``), so the target, log(measured / roofline), is the
same kind of quantity on both, and the trees read one more column than ``gemm_features``, the GPU's SM count
(``CROSS_FEATURE_NAMES``: 108 on A100, 132 on H100), to tell the GPUs apart where they differ.

Invariants: a held-out model leaves every GPU's rows, with every row of its (N, K) shapes (``without``), so
a leave-one-model-out fold judges nothing on a shape the cross-GPU trees have seen on any GPU; the shipped
tables are the Vidur tables in sim/data/vidur, one set per GPU (``SHIPPED_GPUS``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.executors.calibrate import fit_gemm
from sim.executors.cost_model import DATA_DIR
from sim.executors.gemm_features import CROSS_FEATURE_NAMES, gemm_features, with_sms
from sim.executors.measurements import LINEAR_OPS, read_measurements
from sim.executors.roofline import DEFAULT_NUM_SMS, CostParams, gemm_time
from sim.specs import HardwareSpec

# the prefix of a shipped Vidur table's file name -> the hardware its rows were measured on
SHIPPED_GPUS = {"a100": "a100-80gb", "h100": "h100-80gb"}


@dataclass(frozen=True)
class GpuRows:
    """One GPU's projection rows (opmodel.with_shapes: columns N, K, M, operator, model, time_s, dtype_bytes)."""

    hardware: HardwareSpec
    rows: pd.DataFrame


@functools.cache
def shipped_rows(exclude: str) -> list[GpuRows]:
    """The projection rows of every shipped GPU's tables but those of hardware ``exclude`` (a name); read once
    per process (callers do not change them)."""
    from sim.executors.opmodel import with_shapes  # (opmodel builds on this module)

    out = []
    for prefix, name in SHIPPED_GPUS.items():
        paths = sorted((DATA_DIR / "vidur").glob(f"{prefix}_*_mlp.csv"))
        if name != exclude and paths:
            out.append(GpuRows(HardwareSpec.from_name(name), with_shapes(read_measurements(paths))))
    return out


def is_gpu(hardware: HardwareSpec) -> bool:
    """Whether the cross-GPU trees apply: a GPU, whose GEMMs run as tiles over SMs (not the CPU)."""
    return DEFAULT_NUM_SMS.get(hardware.name, 108) > 1


def without(tables: list[GpuRows], model: str, shapes: pd.MultiIndex, only: Sequence[str] | None = None
            ) -> list[GpuRows]:
    """``tables`` less the rows of ``model`` and every row of an (N, K) in ``shapes``; with ``only``, of those
    models alone."""
    out = []
    for t in tables:
        keep = (t.rows.model != model) & ~pd.MultiIndex.from_frame(t.rows[["N", "K"]]).isin(shapes)
        if only is not None:
            keep &= t.rows.model.isin(only)
        out.append(GpuRows(t.hardware, t.rows[keep.to_numpy()]))
    return out


def training_rows(tables: list[GpuRows]) -> tuple[np.ndarray, np.ndarray]:
    """(features with the SM count column, log(measured / the GPU's own tile/wave roofline)) of every row."""
    xs, ys = [np.zeros((0, len(CROSS_FEATURE_NAMES)))], [np.zeros(0)]
    for t in tables:
        rows = t.rows[t.rows.operator.isin(LINEAR_OPS)]
        if rows.empty:
            continue
        sms = DEFAULT_NUM_SMS.get(t.hardware.name, 108)
        roof = fit_gemm(rows, t.hardware, CostParams(num_sms=sms))
        m, n, k = (rows[c].to_numpy() for c in "MNK")
        predicted = gemm_time(m, n, k, t.hardware.peak_flops, t.hardware.hbm_bandwidth,
                              rows.dtype_bytes.to_numpy(), roof, rows.operator.to_numpy())
        xs.append(with_sms(gemm_features(m, n, k, sms, rows.operator.to_numpy()), sms))
        ys.append(np.log(rows.time_s.to_numpy() / predicted))
    return np.vstack(xs), np.concatenate(ys)
