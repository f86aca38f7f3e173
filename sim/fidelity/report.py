"""Tables and the parity figure of a fidelity evaluation."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sim.fidelity.evaluate import METRICS, StageResult

LABELS = {"ttft_mean": "TTFT mean", "ttft_p50": "TTFT p50", "ttft_p90": "TTFT p90", "ttft_p99": "TTFT p99",
          "e2e_mean": "E2E mean", "e2e_p50": "E2E p50", "e2e_p90": "E2E p90", "e2e_p99": "E2E p99",
          "decode_per_token": "decode/token", "req_per_s": "req/s"}


def results_frame(results: list[StageResult]) -> pd.DataFrame:
    """One row per (run, stage, metric): measured, predicted (seed mean), min, max, signed error."""
    rows = []
    for r in results:
        for m in METRICS:
            lo, hi = r.spread(m)
            rows.append({"run": r.stage.run, "stage": r.stage.stage, "rate_req_s": r.stage.rate_req_s,
                         "metric": m, "measured": r.stage.measured[m], "predicted": r.predicted(m),
                         "predicted_min": lo, "predicted_max": hi, "error": r.error(m),
                         "seeds": len(r.predictions)})
    return pd.DataFrame(rows)


def text_table(results: list[StageResult]) -> str:
    """A plain-text table: a block per stage, a line per metric."""
    lines = []
    for r in results:
        ranks = r.stage.data_parallel
        kv = "" if r.kv_blocks is None else \
            f", {r.kv_blocks:,} KV blocks{' (estimated)' if r.kv_blocks_estimated else ''}" \
            + (f" an engine x {ranks} data-parallel engines" if ranks > 1 else "")
        start = ""
        if r.windows and max(w[0] for w in r.windows) > 0:   # a later stage: from when its predecessor drained
            lo, hi = min(w[0] for w in r.windows), max(w[0] for w in r.windows)
            start = f", from t = {lo:.1f} s" if hi - lo < 0.05 else f", from t = {lo:.1f} .. {hi:.1f} s"
        load = f"{r.stage.num_requests:,} requests by {r.stage.concurrency} concurrent" \
            if r.stage.load == "concurrent" else f"{r.stage.rate_req_s:g} req/s {r.stage.load}"
        lines.append(f"{r.stage.run}  stage {r.stage.stage}  ({load}, {len(r.predictions)} seed(s){kv}{start})")
        lines.append(f"  {'metric':<14}{'measured':>12}{'predicted':>12}{'seed spread':>24}{'error':>9}")
        for m in METRICS:
            lo, hi = r.spread(m)
            scale, unit = (1.0, "") if m == "req_per_s" else (1e3, " ms")
            measured = r.stage.measured[m]
            shown, error = ((f"{'-':>9}{'':3}", f"{'-':>9}") if math.isnan(measured)
                            else (f"{measured * scale:>9.4g}{unit:3}", f"{r.error(m):>+9.1%}"))
            lines.append(f"  {LABELS[m]:<14}{shown}{r.predicted(m) * scale:>9.4g}"
                         f"{unit:3}{f'{lo * scale:.4g} .. {hi * scale:.4g}':>21}{unit:3}{error}")
        if r.engine:
            running = sum(e["running_mean"] for e in r.engine) / len(r.engine)
            waiting = sum(e["waiting_mean"] for e in r.engine) / len(r.engine)
            kv = max(e["kv_usage_peak"] for e in r.engine)
            lo, hi = min(e["preemptions"] for e in r.engine), max(e["preemptions"] for e in r.engine)
            lines.append(f"  replayed engine: {running:.1f} requests running, {waiting:.1f} waiting (time means), "
                         f"KV peak {kv:.1%}, {lo if lo == hi else f'{lo}..{hi}'} preemptions")
        if not r.stage.ignore_eos:
            lines.append("  ! ignore_eos false: replayed with exactly output_len tokens a request; the real outputs "
                         "may have ended earlier (EOS)")
        if r.falsely_saturated:
            lines.append("  ! falsely saturated: predicted mean TTFT above 3x measured + 50 ms")
        if not r.stage.has_measurements:
            lines.append("  (no measured figures: a prediction only)")
        if r.stage.prompts_from_client:
            lines.append(f"  prompts of {r.stage.prompt_quantiles['mean']:g} tokens each (no server-side lengths given: "
                         "the client's plus a BOS token)")
        if any(r.refused):
            lines.append(f"  refused by the API server (prompt + output_len > max_model_len {r.stage.max_model_len}): "
                         f"{min(r.refused)}..{max(r.refused)} of {r.stage.num_requests} requests (not in the figures)")
    return "\n".join(lines)


MARKERS = "osD^v<>ph*"
MAX_LEGEND_ENTRIES = 24     # more points than this: one legend entry per run
INSIDE_LEGEND_ENTRIES = 12  # more entries than this: the legend goes under the panels, in columns
LEGEND_COLUMNS = 4


def _run_style(i: int) -> tuple[str, str]:
    """The i-th run's marker and colour: distinct pairs for the first 90 runs (10 colours x 9 markers),
    then repeating; any number of runs can be drawn."""
    return MARKERS[(i + i // 10) % len(MARKERS)], f"C{i % 10}"


def parity_figure(results: list[StageResult], path: Path, title: str = "kvsim vs measured") -> None:
    """Predicted against measured (log-log), one panel per metric family, seed spread as error bars (stages
    and figures that were not measured are left out; a panel with none says so)."""
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone

    results = [r for r in results if r.stage.has_measurements]
    panels = [("TTFT (s)", ["ttft_mean", "ttft_p90"]), ("E2E (s)", ["e2e_mean", "e2e_p90"]),
              ("decode time per token (s)", ["decode_per_token"])]
    runs = sorted({r.stage.run for r in results})
    run_styles = {run: _run_style(i) for i, run in enumerate(runs)}
    per_point = len(results) * 2 <= MAX_LEGEND_ENTRIES   # else one legend entry per run
    entries = len(results) * 2 if per_point else len(runs)
    below = entries > INSIDE_LEGEND_ENTRIES                # a legend this long goes under the panels
    legend_rows = math.ceil(entries / LEGEND_COLUMNS) if below else 0
    fig = Figure(figsize=(5 * len(panels), 4.6 + 0.13 * legend_rows))
    axes = fig.subplots(1, len(panels))
    for ax, (label, metrics) in zip(axes, panels):
        values = []
        labelled: set[str] = set()
        for r in results:
            for m, fill in zip(metrics, ("full", "none")):
                meas, pred = r.stage.measured[m], r.predicted(m)
                if math.isnan(meas):   # (a prediction only: no point to place)
                    continue
                lo, hi = r.spread(m)
                values += [meas, pred, lo, hi]
                marker, color = run_styles[r.stage.run]
                if per_point:
                    legend = f"{r.stage.run} s{r.stage.stage} {LABELS[m]}"
                elif r.stage.run in labelled:
                    legend = None
                else:
                    legend = r.stage.run
                    labelled.add(r.stage.run)
                ax.errorbar([meas], [pred], yerr=[[pred - lo], [hi - pred]], fmt=marker, fillstyle=fill,
                            color=color, capsize=3, label=legend)
        if not any(v > 0 for v in values):
            ax.text(0.5, 0.5, f"no measured {label}", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        lo_v, hi_v = min(v for v in values if v > 0) * 0.7, max(values) * 1.4
        ax.plot([lo_v, hi_v], [lo_v, hi_v], "k-", lw=0.8)
        for f, style in ((1.1, "--"), (1 / 1.1, "--")):
            ax.plot([lo_v, hi_v], [lo_v * f, hi_v * f], "k", ls=style, lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo_v, hi_v)
        ax.set_ylim(lo_v, hi_v)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(label + " (dashed: +-10%)")
        ax.grid(True, which="both", alpha=0.3)
    title_note = None if per_point else "filled: mean, open: p90"
    fig.suptitle(title)
    first = next((ax for ax in axes if ax.get_legend_handles_labels()[0]), None)   # (the panel with the legend)
    if first is None:
        fig.tight_layout()
    elif below:
        handles, labels = first.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=LEGEND_COLUMNS, fontsize=6, title=title_note,
                   title_fontsize=6, frameon=False)
        fig.tight_layout(rect=(0, (0.13 * legend_rows + 0.25) / fig.get_figheight(), 1, 1))
    else:
        first.legend(fontsize=6, loc="upper left", title=title_note, title_fontsize=6)
        fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
