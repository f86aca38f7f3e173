"""Calibration files and validation reports: fit -> JSON, JSON + measurements -> errors and a parity plot.

A calibration file is JSON: ``{"format": "kvsim-calibration/1", "hardware": NAME, "params": {...},
"baseline": {...}, "fitted_on": [...], "train_mape": {...}}``. ``params`` are CostParams (roofline.py);
``baseline`` is the plain roofline fitted on the same rows, kept so validation can show both errors.
``params.gemm_correction`` is the learned per-shape GEMM correction (shape_correction.py); a calibration
adapted to a new model (``calibrate_from_base``) also records ``"base"``, the calibration it started from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import KvsimError
from sim.executors.calibrate import fit_baseline, fit_params, predict, score
from sim.executors.cost_model import DATA_DIR, load_calibration
from sim.executors.measurements import ELEMENTWISE_OPS, LINEAR_OPS, check_device, read_measurements
from sim.executors.opmodel import fit_local
from sim.executors.roofline import CostParams
from sim.output import writable_folder, write_text
from sim.specs import HardwareSpec

FORMAT = "kvsim-calibration/1"


def shipped_vidur(gpu: str, kind: str = "mlp") -> list[Path]:
    """Shipped Vidur tables for ``gpu`` ("a100" or "h100"): ``kind`` "mlp" or "all_reduce"."""
    return sorted((DATA_DIR / "vidur").glob(f"{gpu}_*_{kind}.csv"))


def hardware_of(name: str) -> HardwareSpec:
    try:
        return HardwareSpec.from_name(name)
    except KeyError as exc:
        raise KvsimError("--hardware", exc.args[0]) from None


def calibrate(hardware: HardwareSpec, df: pd.DataFrame, sources: list[str]) -> dict[str, Any]:
    """Fit the model and the baseline on ``df``; return the calibration document."""
    if df.empty:
        raise KvsimError("--measurements", "no rows left to fit")
    params = fit_params(df, hardware)
    baseline = fit_baseline(df, hardware)
    train = score(df, hardware, params)
    return {"format": FORMAT, "hardware": hardware.name, "params": params.to_dict(),
            "baseline": baseline.to_dict(), "fitted_on": sources, "rows": int(len(df)),
            "train_mape": {k: round(v, 5) for k, v in train.items()}}


def calibrate_files(hardware_name: str, paths: list[str | Path], tp: int | None = None) -> dict[str, Any]:
    """Read measurement files (optionally keeping only operator rows at TP ``tp``) and calibrate."""
    df = read_measurements(paths)
    if tp is not None:
        df = df[(df.tp == tp) | (df.operator == "all_reduce")]
    hw = hardware_of(hardware_name)
    check_device(df, hw.name)
    return calibrate(hw, df, [Path(p).name for p in paths])


def calibrate_from_base(base_ref: str, paths: list[str | Path]) -> dict[str, Any]:
    """A new model's calibration: the base calibration plus local points for every projection shape the
    measurements hold (interpolated in ln M within M's token block per shape, shape_correction.py); nothing else is refitted."""
    params, base = load_calibration(base_ref, key="--base")
    df = read_measurements(paths)
    hw = hardware_of(base.get("hardware", ""))
    check_device(df, hw.name)
    local = fit_local(df, hw, params)
    if not local:
        raise KvsimError("--measurements", "no projection rows (attn_pre_proj, attn_post_proj, mlp_up_proj, "
                                           "mlp_down_proj) to adapt the base calibration to")
    gc = params.gemm_correction
    params.gemm_correction = {**gc, "local": {**gc.get("local", {}), **local}}
    rows = df[df.operator.isin(LINEAR_OPS)]
    train = score(rows, hw, params)
    # (a derived base is read as its source: the new file holds params of its own, so it is derived no more)
    drop = ("params", "train_mape", "rows", "fitted_on", "base", "derived_from", "derivation")
    doc = {k: v for k, v in base.items() if k not in drop}
    return {**doc, "params": params.to_dict(), "base": base_ref,
            "fitted_on": list(base.get("fitted_on", [])) + [Path(p).name for p in paths], "rows": int(len(rows)),
            "train_mape": {k: round(v, 5) for k, v in train.items()}}


def check_out_path(out: str | Path, flag: str = "--out") -> Path:
    """``out`` as a Path, or a KvsimError when it names a directory (checked before any work is done)."""
    path = Path(out)
    if path.is_dir():
        raise KvsimError(str(path), f"{flag} is a directory; give a file path")
    writable_folder(path, flag)
    return path


def calibration_json(doc: dict[str, Any]) -> str:
    """JSON text with one key a line and every list of plain numbers, or of plain identifiers (operator
    names), on one line (compact curves)."""
    text = json.dumps(doc, indent=1)
    text = re.sub(r"\[\s*(-?[0-9][-+0-9.eE]*(?:,\s*-?[0-9][-+0-9.eE]*)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    return re.sub(r'\[\s*("[A-Za-z0-9_]*"(?:,\s*"[A-Za-z0-9_]*")*)\s*\]',
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def write_calibration(doc: dict[str, Any], out: str | Path) -> None:
    """Write ``doc`` atomically (a temporary file renamed into place: nothing half-written), mode 0644."""
    write_text(check_out_path(out), calibration_json(doc)).chmod(0o644)


@dataclass
class Validation:
    """Predictions beside measurements, and the errors of the model and of the baseline."""

    rows: pd.DataFrame            # the measurement rows plus columns pred_s, baseline_s
    model: dict[str, float]       # MAPE per operator, "linear", "layer", "overall" (fractions)
    baseline: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"overall_mape": self.model["overall"], "linear_mape": self.model.get("linear"),
                "layer_mape": self.model.get("layer"), "per_operator": self.model,
                "baseline": {"overall_mape": self.baseline["overall"], "linear_mape": self.baseline.get("linear"),
                             "layer_mape": self.baseline.get("layer"), "per_operator": self.baseline},
                "rows": int(len(self.rows))}

    def table(self) -> str:
        """Per-operator MAPE, then the projections together, one layer, and all rows."""
        counts = self.rows.operator.value_counts()
        lines = [f"{'operator':<26}{'rows':>7}{'model MAPE':>12}{'baseline':>11}"]
        summary = ("linear", "layer", "overall")
        for key in [k for k in self.model if k not in summary] + ["-"] + [k for k in summary if k in self.model]:
            if key == "-":
                lines.append("-" * 56)
                continue
            n = counts.get(key, "")
            base = self.baseline.get(key, float("nan"))
            lines.append(f"{key:<26}{n!s:>7}{100 * self.model[key]:>11.2f}%{100 * base:>10.2f}%")
        return "\n".join(lines)


def validate(doc: dict[str, Any], df: pd.DataFrame, hardware: HardwareSpec | None = None) -> Validation:
    """Score the calibration ``doc`` (and its baseline) on measurement rows ``df``."""
    hw = hardware or hardware_of(doc.get("hardware", ""))
    params = CostParams.from_dict(doc["params"])
    base = CostParams.from_dict(doc["baseline"]) if "baseline" in doc else CostParams()
    rows = df.assign(pred_s=predict(df, hw, params), baseline_s=predict(df, hw, base))
    return Validation(rows, score(df, hw, params), score(df, hw, base))


def validate_files(calibration: str | Path, paths: list[str | Path]) -> Validation:
    _, doc = load_calibration(str(calibration), key="--calibration")
    return validate(doc, read_measurements(paths))


def parity_plot(v: Validation, path: str | Path, title: str = "") -> None:
    """Predicted vs measured (log-log, every operator), then one residual panel per operator against the
    token count (bytes for all_reduce), model and baseline side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = v.rows
    ops = [o for o in (*LINEAR_OPS, *ELEMENTWISE_OPS, "attention", "step", "all_reduce") if (rows.operator == o).any()]
    ncols = 3
    nrows = 1 + -(-len(ops) // ncols)
    fig = plt.figure(figsize=(4.2 * ncols, 3.4 * nrows))
    ax0 = fig.add_subplot(nrows, 1, 1)
    tab = plt.get_cmap("tab10")
    colors = [tab(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # no grey: grey is the baseline's

    def cmap(i: int) -> Any:
        return colors[i % len(colors)]
    for i, op in enumerate(ops):
        r = rows[rows.operator == op]
        ax0.scatter(r.time_s * 1e3, r.pred_s * 1e3, s=4, alpha=0.5, color=cmap(i), label=op)
    lo = float(min(rows.time_s.min(), rows.pred_s.min()) * 1e3)
    hi = float(max(rows.time_s.max(), rows.pred_s.max()) * 1e3)
    ax0.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax0.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
            title=f"parity: MAPE {100 * v.model['overall']:.1f}% overall "
                  f"(plain roofline {100 * v.baseline['overall']:.1f}%)")
    ax0.legend(markerscale=3, fontsize=7, ncol=2)
    for i, op in enumerate(ops):
        ax = fig.add_subplot(nrows, ncols, ncols + i + 1)
        r = rows[rows.operator == op]
        ax.scatter(r.num_tokens, 100 * (r.baseline_s - r.time_s) / r.time_s, s=3, alpha=0.3, color="0.6",
                   label=f"roofline {100 * v.baseline.get(op, float('nan')):.1f}%")
        ax.scatter(r.num_tokens, 100 * (r.pred_s - r.time_s) / r.time_s, s=3, alpha=0.5, color=cmap(i),
                   label=f"model {100 * v.model[op]:.1f}%")
        ax.axhline(0, color="k", lw=1)
        ax.set(xscale="log", ylim=(-60, 60), title=op, xlabel="bytes" if op == "all_reduce" else "tokens",
               ylabel="error (%)")
        ax.legend(fontsize=7, markerscale=3, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)

